"""Lambda entry point of ``switchyard.aws.handlers.rpc_reconcile`` (the code lives in the package)."""

from switchyard.aws.handlers.rpc_reconcile import lambda_handler

__all__ = ["lambda_handler"]
