"""``./dev deploy``, the one command from a checkout to a deployed stack: its plan (``--dry-run``) and
its checks, which need neither AWS credentials nor Docker. The deploy itself is not run here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from stacks import constants
from stacks.base_image import local_tag
from tests.conftest import ROOT


def dev_deploy(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / "dev"), "deploy", *args], cwd=ROOT, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)


def test_the_dry_run_prints_the_five_steps_in_order_and_runs_nothing() -> None:
    done = dev_deploy("--dry-run", "SwitchyardStaging", "--require-approval", "never")
    assert done.returncode == 0, done.stderr
    steps = re.findall(r"^  (\d)\. (.+?): ", done.stdout, re.M)
    assert steps == [("1", ".venv"), ("2", "CDK CLI"), ("3", "Lambda layer"),
                     ("4", f"base image {local_tag()}"), ("5", "deploy")], done.stdout
    deploy = ("node_modules/.bin/cdk deploy SwitchyardStaging --require-approval never "
              "-c switchyard:accountConcurrency=<that limit>")
    assert done.stdout.rstrip().endswith(deploy), done.stdout
    assert "reads the account's Lambda concurrency limit" in done.stdout


def test_the_default_stack_comes_first_when_only_options_are_given() -> None:
    done = dev_deploy("--dry-run", "-c", "switchyard:alarmEmail=ops@example.com")
    assert done.returncode == 0, done.stderr
    assert "cdk deploy SwitchyardStack -c switchyard:alarmEmail=ops@example.com -c" in done.stdout


def test_without_docker_the_deploy_stops_first_with_one_line() -> None:
    docker_host = "unix:///nonexistent/docker.sock"
    done = dev_deploy(DOCKER_HOST=docker_host)
    assert done.returncode == 1
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("dev: error: "), line
    assert "Docker" in line or "docker" in line, line
    dry = dev_deploy("--dry-run", DOCKER_HOST=docker_host)
    assert dry.returncode == 0 and "would stop before step 1" in dry.stdout, dry.stdout


@pytest.mark.slow
def test_cdk_without_the_layer_says_so_in_one_line(tmp_path) -> None:
    """What `npx cdk deploy` shows when the layer was never built: app.py's one line, not a traceback."""
    done = subprocess.run([sys.executable, "app.py"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CDK_OUTDIR": str(tmp_path),
                               "CDK_CONTEXT_JSON": json.dumps(
                                   {constants.CTX_LAYER_DIR: str(tmp_path / "no-layer")})})
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1:] == [done.stderr.strip()], done.stderr
    assert done.stderr.startswith("switchyard: error: the Lambda layer is not built at"), done.stderr
    assert "./dev deploy" in done.stderr


LOCALSTACK = "http://127.0.0.1:4566"  # moto has no GetAccountSettings; LocalStack answers as Lambda does


def test_the_account_limit_is_read_from_lambda_and_printed_as_the_context_value() -> None:
    import boto3

    from stacks.account_limits import account_concurrency

    client = boto3.client("lambda", endpoint_url=LOCALSTACK)
    limit = client.get_account_settings()["AccountLimit"]["ConcurrentExecutions"]
    assert account_concurrency(client) == limit
    done = subprocess.run([sys.executable, "-m", "stacks.account_limits"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "AWS_ENDPOINT_URL": LOCALSTACK})
    assert done.returncode == 0 and done.stdout == f"{constants.CTX_ACCOUNT_CONCURRENCY}={limit}\n", done


def test_an_unreadable_limit_stops_the_deploy_with_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "stacks.account_limits"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("switchyard: error: could not read the account's Lambda and API Gateway"), line


def test_an_account_without_api_gateways_logging_role_is_refused_with_the_fix() -> None:
    """moto's account has no CloudWatch Logs role for API Gateway (LocalStack's has one, above)."""
    done = subprocess.run([sys.executable, "-m", "stacks.account_limits"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:5000"})
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert "API Gateway has no CloudWatch Logs role" in line and "API Gateway's account setting" in line, line


def test_a_stack_without_an_api_needs_no_api_gateway_logging_role() -> None:
    """An RPC-only or delay-only stack has no API Gateway stage: API Gateway in moto's account (no
    role) refuses the whole stack, not that one; Lambda's limit comes from LocalStack."""
    from stacks.account_limits import chosen_parts

    env = {**os.environ, "AWS_ENDPOINT_URL": LOCALSTACK, "AWS_ENDPOINT_URL_API_GATEWAY": "http://127.0.0.1:5000"}

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "stacks.account_limits", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=60, env=env)

    whole = check("SwitchyardStack")
    without_api = check("SwitchyardStack", "-c", f"{constants.CTX_PARTS}=rpc,delay")
    assert whole.returncode == 1 and "API Gateway has no CloudWatch Logs role" in whole.stderr, whole
    assert without_api.returncode == 0, without_api
    assert without_api.stdout.startswith(f"{constants.CTX_ACCOUNT_CONCURRENCY}="), without_api
    assert chosen_parts([]) == frozenset(constants.PARTS)
    assert chosen_parts(["--context", f'{constants.CTX_PARTS}=["bus"]']) == {"bus"}
    assert chosen_parts([f"--context={constants.CTX_PARTS}=pending"]) == {"pending"}
