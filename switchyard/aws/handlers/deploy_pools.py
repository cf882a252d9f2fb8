"""Declares every configured pool (`switchyard pool init`, with its policies) on each deploy.

A CloudFormation custom resource (CDK Provider framework); idempotent; Delete keeps the data and
stops the pools' worker tasks (so the cluster can be deleted).
The logic is ``switchyard.aws.deploy.declare_pools``.
"""

from typing import Any

from switchyard.aws import deploy
from switchyard.core.observability import logger


@logger.inject_lambda_context
def on_event(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    return deploy.declare_pools(event)
