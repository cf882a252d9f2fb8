"""Lambda entry point of ``switchyard.aws.handlers.deploy_pools`` (the code lives in the package)."""

from switchyard.aws.handlers.deploy_pools import on_event

__all__ = ["on_event"]
