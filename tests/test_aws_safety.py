"""The suite's guard against real AWS (tests/conftest.py) and the deploy tool's endpoint check."""

from __future__ import annotations

import pytest

from scripts.localstack_deploy import LocalStackDeployError, check_local_endpoint, deploy_env
from tests.conftest import aws_safety_problems

SAFE = {"AWS_ENDPOINT_URL": "http://127.0.0.1:5000", "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing"}


def test_local_endpoints_and_test_credentials_pass() -> None:
    assert aws_safety_problems(SAFE) == []
    assert aws_safety_problems({**SAFE, "AWS_ENDPOINT_URL_ECS": "http://localhost:5000"}) == []


@pytest.mark.parametrize("change", [
    {"AWS_ENDPOINT_URL": ""},
    {"AWS_ENDPOINT_URL": "https://sts.amazonaws.com"},
    {"AWS_ENDPOINT_URL": "http://127.0.0.1.nip.io:4566"},
    {"AWS_ENDPOINT_URL_S3": "https://s3.amazonaws.com"},
    {"AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE"},
    {"AWS_PROFILE": "prod"},
])
def test_anything_that_could_reach_aws_is_named(change: dict[str, str]) -> None:
    problems = aws_safety_problems({**SAFE, **change})
    assert len(problems) == 1 and next(iter(change)) in problems[0]


def test_missing_endpoint_is_a_problem() -> None:
    assert aws_safety_problems({"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"})


@pytest.mark.parametrize("url", ["https://cloudformation.us-east-1.amazonaws.com", "http://10.0.0.5:4566",
                                 "127.0.0.1:4566", "http://localhost.example.com:4566"])
def test_the_deploy_tool_refuses_anything_but_loopback(url: str) -> None:
    with pytest.raises(LocalStackDeployError, match="refusing"):
        check_local_endpoint(url)
    with pytest.raises(LocalStackDeployError):
        deploy_env(url)


def test_the_deploy_environment_pins_endpoint_credentials_and_cdk_home() -> None:
    env = deploy_env("http://localhost:4566", {"AWS_PROFILE": "prod", "AWS_ENDPOINT_URL_ECS": "https://x",
                                                "PATH": "/bin"})
    assert "AWS_PROFILE" not in env and "AWS_ENDPOINT_URL_ECS" not in env and env["PATH"] == "/bin"
    assert env["AWS_ENDPOINT_URL"] == env["AWS_ENDPOINT_URL_S3"] == "http://localhost:4566"
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_S3_FORCE_PATH_STYLE"]) == ("test", "1")
    assert env["CDK_HOME"].endswith(".local/cdk-home")
