"""Lambda entry point of ``switchyard.aws.handlers.deploy_topics`` (the code lives in the package)."""

from switchyard.aws.handlers.deploy_topics import on_event

__all__ = ["on_event"]
