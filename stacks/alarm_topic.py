"""The SNS topic the alarms notify, and what CloudWatch needs to publish to it.

``enforce_ssl`` gives the topic an ``AWS::SNS::TopicPolicy``, which replaces SNS's default policy
(the one that lets the account's services publish): without a statement for
``cloudwatch.amazonaws.com`` every notification is refused ("no resource-based policy allows the
SNS:Publish action") and no alarm reaches anyone. Both grants, the topic's and its key's, name the
stack's account and its alarms (``aws:SourceAccount``, ``aws:SourceArn``: the confused deputy).
"""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from stacks.names import alarm_prefix

CLOUDWATCH = "cloudwatch.amazonaws.com"


def alarm_source(scope: Construct) -> dict[str, dict[str, str]]:
    """The condition that limits CloudWatch to this stack's alarms (their names share the prefix)."""
    stack = Stack.of(scope)
    alarms = f"arn:{stack.partition}:cloudwatch:{stack.region}:{stack.account}:alarm:{alarm_prefix(scope)}*"
    return {"StringEquals": {"aws:SourceAccount": stack.account}, "ArnLike": {"aws:SourceArn": alarms}}


def build_alarm_topic(scope: Construct, *, encrypt: bool, email: str | None) -> sns.Topic:
    """``encrypt``: with a customer managed key (CloudWatch can publish to an encrypted topic only
    through a key whose policy lets it; AWS managed keys cannot be given that grant)."""
    key = None
    if encrypt:
        key = kms.Key(scope, "AlarmTopicKey", enable_key_rotation=True,
                      description="Switchyard alarm topic encryption (CloudWatch may use it)")
        key.add_to_resource_policy(iam.PolicyStatement(
            principals=[iam.ServicePrincipal(CLOUDWATCH)], actions=["kms:Decrypt", "kms:GenerateDataKey*"],
            resources=["*"], conditions=alarm_source(scope)))
    topic = sns.Topic(scope, "AlarmTopic", display_name="Switchyard alarms", master_key=key, enforce_ssl=True)
    topic.add_to_resource_policy(iam.PolicyStatement(
        principals=[iam.ServicePrincipal(CLOUDWATCH)], actions=["sns:Publish"], resources=[topic.topic_arn],
        conditions=alarm_source(scope)))
    if email:
        topic.add_subscription(subscriptions.EmailSubscription(email))
    return topic
