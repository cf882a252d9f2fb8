"""Migrates the delay store's schema (`switchyard delay migrate`) on each deploy.

A CloudFormation custom resource (CDK Provider framework); idempotent; Delete keeps the data.
The logic is ``switchyard.aws.deploy.migrate_delay_schema``.
"""

from typing import Any

from switchyard.aws import deploy
from switchyard.core.observability import logger


@logger.inject_lambda_context
def on_event(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    return deploy.migrate_delay_schema(event)
