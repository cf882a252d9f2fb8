"""The ``localstack`` target deployed once per session on the LocalStack that ``./dev services`` runs.

Nothing is started here: without LocalStack on 127.0.0.1:4566 the tests fail and say how to start
it. A deployment whose template equals the synthesized one is reused (``stacks.localstack_deploy``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from stacks.localstack_deploy import DEFAULT_ENDPOINT, Deployment, client, deploy

ENDPOINT = os.environ.get("SWITCHYARD_LOCALSTACK_URL", DEFAULT_ENDPOINT)


@pytest.fixture(scope="session")
def localstack_deployment() -> Iterator[Deployment]:
    """``Deployment``: ``stack_name``, ``outputs`` (ConfigPath, BrokerSecretArn, AlarmTopicArn, ...)."""
    try:
        requests.get(f"{ENDPOINT}/_localstack/health", timeout=3).raise_for_status()
    except requests.RequestException as exc:
        pytest.fail(f"LocalStack does not answer at {ENDPOINT} ({exc}); start it: ./dev services "
                    "(or scripts/localstack.sh start)")
    yield deploy(ENDPOINT)


@pytest.fixture(scope="session")
def aws(localstack_deployment: Deployment) -> Any:
    """``aws("ssm")``: a boto3 client for the LocalStack the stack is deployed on."""
    return lambda service: client(service, localstack_deployment.endpoint)
