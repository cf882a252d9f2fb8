"""Lambda entry point of ``switchyard.aws.handlers.delay_sweep`` (the code lives in the package)."""

from switchyard.aws.handlers.delay_sweep import lambda_handler

__all__ = ["lambda_handler"]
