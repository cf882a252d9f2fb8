"""Lambda entry point of ``switchyard.aws.handlers.delay_enqueue`` (the code lives in the package)."""

from switchyard.aws.handlers.delay_enqueue import lambda_handler

__all__ = ["lambda_handler"]
