"""Lambda entry point of ``switchyard.aws.handlers.rpc_scheduled`` (the code lives in the package)."""

from switchyard.aws.handlers.rpc_scheduled import lambda_handler

__all__ = ["lambda_handler"]
