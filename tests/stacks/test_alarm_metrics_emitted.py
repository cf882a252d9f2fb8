"""Every alarm on Switchyard's own metrics watches a metric some part emits.

An alarm on a name nobody emits never fires (missing data is "not breaching"), so a renamed metric
or outcome field would silence it without a sign. The parts define their metric names once
(``switchyard/<part>/metrics.py``, ``EMITTED``); the alarms in ``stacks/`` use those constants. Here
both targets' templates are read back: plain metrics, metric-math inputs and the metric of each
Metrics Insights query, in the stack's own namespace, must all be in the union of ``EMITTED``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from stacks import constants
from switchyard.bus import metrics as bus_metrics
from switchyard.core.deployed_config import metrics_namespace
from switchyard.delay import metrics as delay_metrics
from switchyard.pending import metrics as pending_metrics
from switchyard.rpc import metrics as rpc_metrics

pytestmark = pytest.mark.slow

PARTS = {"rpc": rpc_metrics, "delay": delay_metrics, "bus": bus_metrics, "pending": pending_metrics}
EMITTED = frozenset().union(*(part.EMITTED for part in PARTS.values()))
# SELECT MAX(QueueDepth) FROM SCHEMA("Switchyard/Stack", WorkerGroup, service) ...
INSIGHTS = re.compile(r'SELECT\s+\w+\((\w+)\)\s+FROM\s+SCHEMA\("([^"]+)"', re.IGNORECASE)


@pytest.fixture(scope="module")
def local_template(local: tuple[Template, Path, Any]) -> dict[str, Any]:
    return local[0].to_json()


def _metrics(alarm: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(namespace, metric name) of everything ``alarm`` (its CloudFormation properties) reads."""
    if "MetricName" in alarm:
        yield alarm["Namespace"], alarm["MetricName"]
    for query in alarm.get("Metrics", []):
        metric = query.get("MetricStat", {}).get("Metric")
        if metric is not None:
            yield metric["Namespace"], metric["MetricName"]
        for name, namespace in INSIGHTS.findall(query.get("Expression", "")):
            yield namespace, name


def watched(template: dict[str, Any], namespace: str) -> dict[str, set[str]]:
    """Alarm logical id -> the metric names it reads in ``namespace``."""
    found: dict[str, set[str]] = {}
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] == "AWS::CloudWatch::Alarm":
            names = {name for ns, name in _metrics(resource["Properties"]) if ns == namespace}
            if names:
                found[logical_id] = names
    return found


def not_emitted(template: dict[str, Any], namespace: str) -> dict[str, set[str]]:
    """The alarms reading a metric in ``namespace`` that no part emits, with those names."""
    return {alarm: names - EMITTED for alarm, names in watched(template, namespace).items()
            if names - EMITTED}


def test_every_alarm_of_the_aws_target_watches_an_emitted_metric(template: Template,
                                                                  synthesized: Any) -> None:
    stack = synthesized[2]
    body = template.to_json()
    found = watched(body, metrics_namespace(stack.stack_name))
    read = set().union(*found.values())
    for part, module in PARTS.items():  # the walk finds each part's alarms (it reads the template right)
        assert read & module.EMITTED, f"no alarm on a {part} metric found"
    insights = {rpc_metrics.QUEUE_DEPTH, rpc_metrics.RECONCILE_DEAD_LETTERING_STRANDED}
    assert insights <= read  # read from the queries' text
    assert not_emitted(body, metrics_namespace(stack.stack_name)) == {}


def test_every_alarm_of_the_localstack_target_watches_an_emitted_metric(
        local_template: dict[str, Any]) -> None:
    namespace = metrics_namespace(constants.LOCALSTACK_STACK_ID)
    assert watched(local_template, namespace)
    assert not_emitted(local_template, namespace) == {}


def test_an_alarm_on_a_metric_nobody_emits_is_found(local_template: dict[str, Any]) -> None:
    """The check above fails when an alarm names an unknown metric: plain, math input or query."""
    namespace = metrics_namespace(constants.LOCALSTACK_STACK_ID)
    body = copy.deepcopy(local_template)
    alarms = [r for r in body["Resources"].values() if r["Type"] == "AWS::CloudWatch::Alarm"]
    plain = next(a["Properties"] for a in alarms if "MetricName" in a["Properties"])
    math = next(a["Properties"] for a in alarms
                if any("MetricStat" in q for q in a["Properties"].get("Metrics", [])))
    query = next(q for a in alarms for q in a["Properties"].get("Metrics", [])
                 if "SCHEMA(" in q.get("Expression", ""))
    plain["MetricName"] = "NobodyEmitsThis"
    next(q for q in math["Metrics"] if "MetricStat" in q)["MetricStat"]["Metric"]["MetricName"] = "NorThis"
    query["Expression"] = INSIGHTS.sub(lambda m: m.group(0).replace(m.group(1), "NorThat"),
                                       query["Expression"])
    missing = set().union(*not_emitted(body, namespace).values())
    assert missing == {"NobodyEmitsThis", "NorThis", "NorThat"}
