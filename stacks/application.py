"""Builds the CDK app: one place for app.py and the tests, so both synthesize the same thing."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from aws_cdk import App

from stacks import constants as c
from stacks import nag
from stacks.config import ConfigError
from stacks.localstack_stack import LocalStackTargetStack
from stacks.switchyard_stack import SwitchyardStack

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

CDK_JSON = Path(__file__).resolve().parent.parent / "cdk.json"


def cdk_json_context() -> dict[str, Any]:
    """The "context" of cdk.json, which the cdk CLI passes in but `python app.py` would not see."""
    return dict(json.loads(CDK_JSON.read_text()).get("context", {}))


def build_app(
    context: dict[str, Any] | None = None, outdir: str | None = None
) -> tuple[App, SwitchyardStack | LocalStackTargetStack]:
    """An App holding the target's stack with cdk-nag applied. Makes no AWS calls.

    ``context`` entries override cdk.json's, which are always applied first. The target is the
    ``switchyard:target`` context: ``aws`` (default, ``SwitchyardStack``) or ``localstack``
    (``SwitchyardLocal``: what LocalStack hosts; see stacks/localstack_stack.py).
    """
    app = App(context={**cdk_json_context(), **(context or {})}, outdir=outdir)
    target = app.node.try_get_context(c.CTX_TARGET) or c.TARGET_AWS
    if target not in c.TARGETS:
        raise ConfigError(f"{c.CTX_TARGET} must be one of {c.TARGETS}, got {target!r}")
    stack: SwitchyardStack | LocalStackTargetStack
    if target == c.TARGET_LOCALSTACK:
        stack = LocalStackTargetStack(app)
        nag.acknowledge_localstack(stack)
    else:
        stack = SwitchyardStack(app)
        nag.acknowledge(stack)
    nag.apply_checks(app)
    return app, stack
