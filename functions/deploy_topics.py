"""Creates the delay scheduler's input and output topics on MSK on each deploy.

A CloudFormation custom resource (CDK Provider framework); idempotent; Delete keeps the data.
The logic is ``switchyard.deploy.create_topics``.
"""

from typing import Any

from switchyard import deploy
from switchyard.observability import logger


@logger.inject_lambda_context
def on_event(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    return deploy.create_topics(event)
