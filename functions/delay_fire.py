"""Lambda entry point of ``switchyard.aws.handlers.delay_fire`` (the code lives in the package)."""

from switchyard.aws.handlers.delay_fire import lambda_handler

__all__ = ["lambda_handler"]
