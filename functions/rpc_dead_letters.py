"""Lambda entry point of ``switchyard.aws.handlers.rpc_dead_letters`` (the code lives in the package)."""

from switchyard.aws.handlers.rpc_dead_letters import lambda_handler

__all__ = ["lambda_handler"]
