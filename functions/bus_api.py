"""Lambda entry point of ``switchyard.aws.handlers.bus_api`` (the code lives in the package)."""

from switchyard.aws.handlers.bus_api import lambda_handler

__all__ = ["lambda_handler"]
