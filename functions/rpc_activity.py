"""Lambda entry point of ``switchyard.aws.handlers.rpc_activity`` (the code lives in the package)."""

from switchyard.aws.handlers.rpc_activity import lambda_handler

__all__ = ["lambda_handler"]
