"""Creates the delay scheduler's input and output topics on MSK on each deploy.

A CloudFormation custom resource (CDK Provider framework); idempotent; Delete keeps the data.
The logic is ``switchyard.aws.deploy.create_topics``.
"""

from typing import Any

from switchyard.aws import deploy
from switchyard.core.observability import logger


@logger.inject_lambda_context
def on_event(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    return deploy.create_topics(event)
