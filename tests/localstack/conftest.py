"""The ``localstack`` target deployed once per session on the LocalStack that ``./dev services`` runs.

Nothing is started here: without LocalStack on 127.0.0.1:4566 the tests fail and say how to start
it. A deployment whose template equals the synthesized one is reused (``scripts.localstack_deploy``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from scripts.localstack_deploy import Deployment, client, deploy
from tests.conftest import LOCALSTACK_URL, require_localstack

ENDPOINT = LOCALSTACK_URL


@pytest.fixture(scope="session")
def localstack_deployment() -> Iterator[Deployment]:
    """``Deployment``: ``stack_name``, ``outputs`` (ConfigPath, BrokerSecretArn, AlarmTopicArn, ...)."""
    yield deploy(require_localstack(ENDPOINT))


@pytest.fixture(scope="session")
def aws(localstack_deployment: Deployment) -> Any:
    """``aws("ssm")``: a boto3 client for the LocalStack the stack is deployed on."""
    return lambda service: client(service, localstack_deployment.endpoint)
