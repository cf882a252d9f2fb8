"""Lambda entry point of ``switchyard.aws.handlers.bus_housekeeping`` (the code lives in the package)."""

from switchyard.aws.handlers.bus_housekeeping import lambda_handler

__all__ = ["lambda_handler"]
