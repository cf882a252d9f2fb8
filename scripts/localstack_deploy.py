"""Deploy the ``localstack`` target to LocalStack with the project's CDK CLI, and read its outputs.

``python -m scripts.localstack_deploy`` (or ``deploy()``): synthesizes the ``localstack`` target in
this process, bootstraps the LocalStack account once (the CDKToolkit stack), runs
``node_modules/.bin/cdk deploy`` on the synthesized assembly, and returns the stack's outputs. A
deployment whose template equals the one synthesized is reused as it is (``force`` deploys anyway).

Only a loopback endpoint is accepted (``127.0.0.1``, ``localhost``, ``::1``): this module never
talks to real AWS. The CLI gets test credentials, path-style S3 on the same endpoint, and a
project-local ``CDK_HOME`` (``.local/cdk-home``), so a cached account of another endpoint cannot
break the deploy. boto3 is given the endpoint explicitly (plain boto3, not ``localstack-client``:
one ``endpoint_url`` is all the latter would add, and it would be another dependency).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from stacks import constants

REPO_ROOT = Path(__file__).resolve().parent.parent
CDK_CLI = REPO_ROOT / "node_modules" / ".bin" / "cdk"
CDK_HOME = REPO_ROOT / ".local" / "cdk-home"
DEFAULT_ENDPOINT = "http://127.0.0.1:4566"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
TEST_ACCESS_KEY = "test"  # LocalStack's account 000000000000
TEST_REGION = "us-east-1"
TOOLKIT_STACK = "CDKToolkit"
# AWS variables that could point the CLI or boto3 elsewhere: dropped from the deploy's environment.
AWS_OVERRIDES = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                 "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_ROLE_ARN",
                 "AWS_WEB_IDENTITY_TOKEN_FILE")


class LocalStackDeployError(RuntimeError):
    """The endpoint is not LocalStack on this machine, or bootstrap/deploy failed (message says which)."""


@dataclass(frozen=True)
class Deployment:
    """A deployed ``localstack`` target: its stack, outputs and what the deploy cost."""

    stack_name: str
    outputs: dict[str, str]
    template_hash: str
    endpoint: str
    reused: bool  # the deployed template equalled the synthesized one: no deploy ran
    bootstrap_s: float | None  # None: the account was already bootstrapped
    deploy_s: float | None  # None: reused
    synth_s: float


def check_local_endpoint(url: str) -> str:
    """``url`` if it is an http(s) URL on a loopback host; raises otherwise (never real AWS)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or parts.hostname not in LOOPBACK_HOSTS:
        raise LocalStackDeployError(
            f"refusing to deploy to {url!r}: only LocalStack on this machine "
            f"(http://{{{'|'.join(LOOPBACK_HOSTS)}}}:PORT) is allowed")
    return url


def deploy_env(endpoint: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The CDK CLI's environment for ``endpoint``: test credentials, path-style S3, its own CDK_HOME."""
    check_local_endpoint(endpoint)
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in AWS_OVERRIDES and not k.startswith("AWS_ENDPOINT_URL")}
    env.update({
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_S3_FORCE_PATH_STYLE": "1",
        "AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": TEST_ACCESS_KEY,
        "AWS_DEFAULT_REGION": TEST_REGION,
        "AWS_REGION": TEST_REGION,
        "CDK_HOME": str(CDK_HOME),
        "CDK_DISABLE_CLI_TELEMETRY": "true",
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    })
    return env


def client(service: str, endpoint: str = DEFAULT_ENDPOINT) -> Any:
    """A boto3 client for LocalStack at ``endpoint`` (test credentials; refuses anything else)."""
    import boto3

    return boto3.client(service, endpoint_url=check_local_endpoint(endpoint), region_name=TEST_REGION,
                        aws_access_key_id=TEST_ACCESS_KEY, aws_secret_access_key=TEST_ACCESS_KEY)


def synthesize(outdir: Path, context: Mapping[str, Any] | None = None) -> tuple[str, Path]:
    """Synthesize the ``localstack`` target into ``outdir``: its stack name and template path."""
    from stacks.application import build_app

    app, stack = build_app(context={**(context or {}), constants.CTX_TARGET: constants.TARGET_LOCALSTACK},
                           outdir=str(outdir))
    app.synth()
    return stack.stack_name, outdir / f"{stack.stack_name}.template.json"


def template_hash(template: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()


def _stack(cfn: Any, name: str) -> dict[str, Any] | None:
    from botocore.exceptions import ClientError

    try:
        stacks = cfn.describe_stacks(StackName=name)["Stacks"]
    except ClientError as exc:
        if "does not exist" in str(exc):
            return None
        raise
    return stacks[0] if stacks and not stacks[0]["StackStatus"].startswith("DELETE_") else None


def deployed_template(cfn: Any, name: str) -> dict[str, Any] | None:
    """The template ``name`` runs now, or None if it is not (completely) deployed."""
    stack = _stack(cfn, name)
    if stack is None or stack["StackStatus"] not in ("CREATE_COMPLETE", "UPDATE_COMPLETE"):
        return None
    body = cfn.get_template(StackName=name, TemplateStage="Original")["TemplateBody"]
    return body if isinstance(body, dict) else json.loads(body)


def alarms_of(template: Mapping[str, Any]) -> dict[str, Any]:
    return {k: r.get("Properties") for k, r in template.get("Resources", {}).items()
            if r.get("Type") == "AWS::CloudWatch::Alarm"}


def _delete(cfn: Any, name: str, timeout_s: float = 600.0) -> None:
    cfn.delete_stack(StackName=name)
    deadline = time.monotonic() + timeout_s
    while _stack(cfn, name) is not None:
        if time.monotonic() > deadline:
            raise LocalStackDeployError(f"stack {name} was not deleted within {timeout_s:.0f} s")
        time.sleep(1.0)


def stack_outputs(name: str, endpoint: str = DEFAULT_ENDPOINT) -> dict[str, str]:
    stack = _stack(client("cloudformation", endpoint), name)
    if stack is None:
        raise LocalStackDeployError(f"stack {name} is not deployed on {endpoint}")
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def _cdk(args: list[str], env: Mapping[str, str], what: str) -> float:
    if not CDK_CLI.exists():
        raise LocalStackDeployError(f"the CDK CLI is missing at {CDK_CLI}: run `npm ci` in {REPO_ROOT}")
    started = time.monotonic()
    done = subprocess.run([str(CDK_CLI), *args, "--no-notices", "--no-version-reporting"], cwd=REPO_ROOT,
                          env=dict(env), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise LocalStackDeployError(f"cdk {what} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return time.monotonic() - started


def deploy(endpoint: str = DEFAULT_ENDPOINT, *, force: bool = False,
           context: Mapping[str, Any] | None = None) -> Deployment:
    """Deploy (or reuse) the ``localstack`` target on LocalStack at ``endpoint``; its outputs."""
    env = deploy_env(endpoint)
    cfn = client("cloudformation", endpoint)
    CDK_HOME.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cdk.out.localstack-") as tmp:
        started = time.monotonic()
        name, template_path = synthesize(Path(tmp), context)
        synth_s = time.monotonic() - started
        template = json.loads(template_path.read_text())
        wanted, deployed = template_hash(template), deployed_template(cfn, name)
        if not force and deployed is not None and template_hash(deployed) == wanted:
            outputs = stack_outputs(name, endpoint)
            return Deployment(name, outputs, wanted, endpoint, True, None, None, synth_s)
        if deployed is not None and alarms_of(deployed) != alarms_of(template):
            # LocalStack updates no alarm in place (measured on 4.13: UPDATE_COMPLETE, the alarm's
            # namespace unchanged), and its alarms are what the target is for: start afresh.
            _delete(cfn, name)
        bootstrap_s = None
        if _stack(cfn, TOOLKIT_STACK) is None:
            bootstrap_s = _cdk(["bootstrap", f"aws://000000000000/{TEST_REGION}", "--app", tmp],
                               env, "bootstrap")
        deploy_s = _cdk(["deploy", name, "--app", tmp, "--require-approval", "never", "--progress", "events"],
                        env, "deploy")
    return Deployment(name, stack_outputs(name, endpoint), wanted, endpoint, False, bootstrap_s, deploy_s,
                      synth_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.localstack_deploy",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--endpoint", default=os.environ.get("SWITCHYARD_LOCALSTACK_URL", DEFAULT_ENDPOINT),
                        help=f"LocalStack's URL (default {DEFAULT_ENDPOINT}; loopback only)")
    parser.add_argument("--force", action="store_true", help="deploy even if the template is unchanged")
    args = parser.parse_args(argv)
    try:
        result = deploy(args.endpoint, force=args.force)
    except LocalStackDeployError as exc:
        print(f"localstack deploy: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"stack": result.stack_name, "reused": result.reused,
                      "synth_s": round(result.synth_s, 1),
                      "bootstrap_s": result.bootstrap_s and round(result.bootstrap_s, 1),
                      "deploy_s": result.deploy_s and round(result.deploy_s, 1), "outputs": result.outputs},
                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
