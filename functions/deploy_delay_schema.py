"""Lambda entry point of ``switchyard.aws.handlers.deploy_delay_schema`` (the code lives in the package)."""

from switchyard.aws.handlers.deploy_delay_schema import on_event

__all__ = ["on_event"]
