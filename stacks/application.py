"""Builds the CDK app: one place for app.py and the tests, so both synthesize the same thing."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from aws_cdk import App, Stack

from stacks import constants, nag
from stacks.config import ConfigError
from stacks.localstack_stack import LocalStackTargetStack
from stacks.switchyard_stack import SwitchyardStack
from switchyard.core.deployed_config import STACK_NAME_RE

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
    (``SwitchyardLocal``: what LocalStack hosts; see stacks/localstack_stack.py). The AWS target
    builds one stack per name in ``switchyard:stacks`` (staging beside production: their physical
    names derive from their stack names); the first is returned, ``stacks_of(app)`` gives all.
    """
    app = App(context={**cdk_json_context(), **(context or {})}, outdir=outdir)
    target = app.node.try_get_context(constants.CTX_TARGET) or constants.TARGET_AWS
    if target not in constants.TARGETS:
        raise ConfigError(f"{constants.CTX_TARGET} must be one of {constants.TARGETS}, got {target!r}")
    stack: SwitchyardStack | LocalStackTargetStack
    if target == constants.TARGET_LOCALSTACK:
        stack = LocalStackTargetStack(app)
        nag.acknowledge_localstack(stack)
    else:
        names = stack_names(app.node.try_get_context(constants.CTX_STACKS))
        aws_stacks = [SwitchyardStack(app, name) for name in names]
        for each in aws_stacks:
            nag.acknowledge(each)
        stack = aws_stacks[0]
    nag.apply_checks(app)
    return app, stack


def stack_names(raw: Any) -> list[str]:
    """The ``switchyard:stacks`` context: a list of distinct stack names (a JSON string from ``-c``)."""
    if raw is None:
        return [constants.STACK_ID]
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"{constants.CTX_STACKS}: not valid JSON ({exc})") from exc
    names = raw if isinstance(raw, list) else []
    valid = all(isinstance(n, str) and STACK_NAME_RE.match(n) for n in names)
    if not names or not valid or len(set(names)) != len(names):
        raise ConfigError(f"{constants.CTX_STACKS} must be a list of distinct stack names (letters, digits "
                          f"and hyphens, starting with a letter), got {raw!r}")
    return list(names)


def stacks_of(app: App) -> list[Stack]:
    """Every stack of the app, in the order they were made."""
    return [child for child in app.node.children if isinstance(child, Stack)]
