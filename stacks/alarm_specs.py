"""What an alarm is made of (``AlarmSpec``: metric, threshold and the sentence that justifies it), the
alarm period, and the alarm every function gets (``errors_or_throttles``). ``stacks/monitoring.py``
builds the alarms; the bus and the pending queue add theirs with these too."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_lambda as lambda_

from stacks import constants

PERIOD = Duration.minutes(constants.ALARM_PERIOD_MINUTES)


@dataclass(frozen=True)
class AlarmSpec:
    """An alarm's metric, threshold and the sentence that justifies the threshold."""

    name: str
    metric: cw.IMetric
    threshold: float
    why: str
    periods: int = 1
    comparison: cw.ComparisonOperator = cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD
    # No data is normal for counts of what went wrong; for a heartbeat it is the outage itself.
    missing: cw.TreatMissingData = cw.TreatMissingData.NOT_BREACHING
    # A pool's alarm is made in the pool's nested stack (stacks/pool_stacks.py).
    pool: str | None = None


def errors_or_throttles(name: str, fn: lambda_.IFunction, pool: str | None = None) -> AlarmSpec:
    """The alarm on ``fn``'s failed or throttled invocations, named ``{name}-errors-or-throttles``."""
    errors = fn.metric_errors(period=PERIOD)
    throttles = fn.metric_throttles(period=PERIOD)
    return AlarmSpec(
        f"{name}-errors-or-throttles",
        cw.MathExpression(
            expression="errors + throttles",
            using_metrics={"errors": errors, "throttles": throttles},
            label=f"{name}: errors + throttles",
            period=PERIOD,
        ),
        1,
        "Any failed or throttled invocation: every handler is at-least-once and retried, so one error "
        "delays work and a throttle means reserved concurrency or the account limit was hit.",
        pool=pool,
    )
