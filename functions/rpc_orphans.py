"""Lambda entry point of ``switchyard.aws.handlers.rpc_orphans`` (the code lives in the package)."""

from switchyard.aws.handlers.rpc_orphans import lambda_handler

__all__ = ["lambda_handler"]
