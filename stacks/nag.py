"""cdk-nag: AwsSolutions checks on the app, and the reason for every accepted finding.

cdk-nag 3 runs as a CDK policy-validation plugin: ``app.synth()`` fails when a finding is not
acknowledged, printing the report (also written to the cloud assembly as
``policy-validation-report.json``). A finding is accepted with
``Validations.of(construct).acknowledge(id=..., reason=...)`` on the construct it concerns,
never stack-wide, so a new resource of the same kind is checked again.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, App, Validations
from cdk_nag import AwsSolutionsChecks

from stacks.switchyard_stack import SwitchyardStack

PACK = "AwsSolutions"


def rule(rule_id: str) -> str:
    """The acknowledgement id of an AwsSolutions rule, e.g. ``rule("SMG4")``."""
    return f"{PACK}::{PACK}-{rule_id}"


def apply_checks(app: App) -> None:
    """Run AwsSolutionsChecks over the whole app at synth time."""
    Validations.of(app).add_plugins(AwsSolutionsChecks(app, verbose=True))


def acknowledge(stack: SwitchyardStack) -> None:
    """Accepted findings of ``stack``, each with its reason."""
    Validations.of(stack.broker.secret).acknowledge(
        Acknowledgment(
            id=rule("SMG4"),
            reason=(
                "Amazon MQ has no managed rotation for broker users: rotating this password needs a "
                "custom rotation Lambda that also updates the broker user, which is not built yet. "
                "The secret is only usable from inside the VPC (the broker is not publicly accessible)."
            ),
        )
    )
