"""The MSK mappings' retries are bounded, with a destination for what exhausts them (issue 34 item 2):
a batch no retry can take goes to an SQS queue (reachable from the cluster's subnets) and an alarm
says so, instead of its partition being delivered again for ever."""

from __future__ import annotations

import json

import pytest

from stacks import constants
from tests.stacks.test_event_source_network import _endpoint_covers, _ref, _source_subnets
from tests.stacks.test_switchyard_stack import (
    Resources,
    actions_of,
    msk_mappings,
    of_type,
    only,
    policy_statements,
)

pytestmark = pytest.mark.slow


def test_each_msk_mapping_retries_a_bounded_number_of_times_then_sends_the_batch_to_a_queue(
        resources: Resources) -> None:
    mappings = msk_mappings(resources)
    assert set(mappings) == {"switchyard-delay-input", "switchyard-delay-output"}
    queues = of_type(resources, "AWS::SQS::Queue")
    for topic, props in mappings.items():
        retries = props.get("MaximumRetryAttempts", -1)
        assert 0 <= retries <= 10_000, f"{topic}: MaximumRetryAttempts {retries} (-1: for ever)"
        destination = props.get("DestinationConfig", {}).get("OnFailure", {}).get("Destination")
        queue = _ref(destination)
        assert queue in queues, f"{topic}: on-failure destination {destination!r}"
        assert queues[queue]["Properties"]["SqsManagedSseEnabled"] is True
        assert queues[queue]["Properties"]["MessageRetentionPeriod"] == 14 * 24 * 3600
        # the mapping sends with the function's role
        function = resources[_ref(props["FunctionName"]) or ""]
        sends = [s for s in policy_statements(resources, function) if "sqs:SendMessage" in actions_of([s])]
        assert sends and all(_ref(s["Resource"]) == queue for s in sends), (topic, sends)


def test_the_failure_queue_is_reachable_from_the_clusters_subnets_and_alarmed(resources: Resources) -> None:
    _, kafka = only(resources, "AWS::MSK::Cluster")
    for subnet in _source_subnets(kafka):
        assert _endpoint_covers(resources, "sqs", subnet), subnet
    mappings = msk_mappings(resources).values()
    (queue,) = {_ref(m["DestinationConfig"]["OnFailure"]["Destination"]) for m in mappings}
    alarms = [a["Properties"] for a in of_type(resources, "AWS::CloudWatch::Alarm").values()
              if "kafka-batches-failed" in json.dumps(a["Properties"].get("AlarmName"))]
    assert len(alarms) == 1, alarms
    (alarm,) = alarms
    assert alarm["Namespace"] == "AWS/SQS" and alarm["MetricName"] == "ApproximateNumberOfMessagesVisible"
    assert alarm["Dimensions"] == [{"Name": "QueueName", "Value": {"Fn::GetAtt": [queue, "QueueName"]}}]
    assert alarm["Threshold"] == 1 and alarm["AlarmActions"]
    assert constants.KAFKA_RETRY_ATTEMPTS <= 10_000
