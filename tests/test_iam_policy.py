"""The IAM evaluator and recorder of tests/iam_policy.py, alone: they decide what the per-role test
(tests/stacks/test_iam_per_role.py) lets through, so each rule is pinned here."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.iam_policy import Call, Resolver, Statement, allowed, calls_of, denied, recording

SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:broker-AbCdEf"
OTHER = "arn:aws:secretsmanager:us-east-1:123456789012:secret:redis-XyZxYz"


def statement(**raw: Any) -> Statement:
    return Statement.parse({"Effect": "Allow", **raw})


def test_an_allow_matches_its_action_and_resource_only() -> None:
    grant = [statement(Action="secretsmanager:GetSecretValue", Resource=SECRET)]
    assert allowed(grant, Call("secretsmanager:GetSecretValue", SECRET))
    assert allowed(grant, Call("SecretsManager:getsecretvalue", SECRET))  # actions ignore case
    assert not allowed(grant, Call("secretsmanager:GetSecretValue", OTHER))
    assert not allowed(grant, Call("secretsmanager:PutSecretValue", SECRET))
    assert not allowed([], Call("secretsmanager:GetSecretValue", SECRET))  # implicit deny


def test_wildcards_in_actions_and_resources() -> None:
    grant = [statement(Action=["ssm:GetParameter*"], Resource="arn:aws:ssm:*:*:parameter/sy/config/*"),
             statement(Action="secretsmanager:GetSecretValue", Resource=SECRET[:-6] + "??????")]
    assert allowed(grant, Call("ssm:GetParametersByPath", "arn:aws:ssm:us-east-1:1:parameter/sy/config/X"))
    assert not allowed(grant, Call("ssm:GetParametersByPath", "arn:aws:ssm:us-east-1:1:parameter/sy/config"))
    assert allowed(grant, Call("secretsmanager:GetSecretValue", SECRET))
    assert not allowed(grant, Call("secretsmanager:GetSecretValue", SECRET + "x"))  # ? is one character
    assert not allowed([statement(Action="s3:GetObject", Resource="arn:aws:s3:::b/k.v")],
                       Call("s3:GetObject", "arn:aws:s3:::b/kxv"))  # "." is no wildcard


def test_an_explicit_deny_wins_and_not_action_not_resource_invert() -> None:
    everything = statement(Action="*", Resource="*")
    deny_secrets = Statement.parse({"Effect": "Deny", "Action": "secretsmanager:*", "NotResource": SECRET})
    assert allowed([everything, deny_secrets], Call("secretsmanager:GetSecretValue", SECRET))
    assert not allowed([everything, deny_secrets], Call("secretsmanager:GetSecretValue", OTHER))
    all_but_iam = statement(NotAction="iam:*", Resource="*")
    assert allowed([all_but_iam], Call("ecs:RunTask", "arn:aws:ecs:us-east-1:1:task-definition/x:1"))
    assert not allowed([all_but_iam], Call("iam:PassRole", "arn:aws:iam::1:role/x"))


def test_calls_name_the_resource_iam_authorizes_and_unknown_ones_are_refused() -> None:
    assert calls_of("secretsmanager", "GetSecretValue", {"SecretId": SECRET}) == [
        Call("secretsmanager:GetSecretValue", SECRET)]
    assert calls_of("ssm", "GetParametersByPath", {"Path": "/switchyard/S/config/"}) == [
        Call("ssm:GetParametersByPath", "arn:aws:ssm:us-east-1:123456789012:parameter/switchyard/S/config")]
    assert calls_of("s3", "ListObjectsV2", {"Bucket": "b"}) == [Call("s3:ListBucket", "arn:aws:s3:::b")]
    family = "arn:aws:ecs:us-east-1:123456789012:task-definition/workers"
    assert calls_of("ecs", "RunTask", {"taskDefinition": "workers"}) == [
        Call("ecs:RunTask", f"{family}:latest")]  # the latest revision, not the bare family
    assert calls_of("ecs", "RunTask", {"taskDefinition": f"{family}:7", "cluster": "c", "tags": [{}]}) == [
        Call("ecs:RunTask", f"{family}:7"),
        Call("ecs:TagResource", "arn:aws:ecs:us-east-1:123456789012:task/c/new")]  # tagged on create
    assert calls_of("sts", "GetCallerIdentity", {}) == []
    with pytest.raises(KeyError, match="no resource rule for sqs:SendMessage"):
        calls_of("sqs", "SendMessage", {"QueueUrl": "x"})


def test_intrinsics_resolve_to_the_given_or_consistent_fake_resources() -> None:
    resources = {"Secret": {"Type": "AWS::SecretsManager::Secret", "Properties": {}},
                 "Attachment": {"Type": "AWS::SecretsManager::SecretTargetAttachment",
                                "Properties": {"SecretId": {"Ref": "Secret"}}},
                 "Fn": {"Type": "AWS::Lambda::Function", "Properties": {}}}
    resolver = Resolver(resources, refs={"Secret": SECRET})
    assert resolver.value({"Ref": "Attachment"}) == SECRET
    arn = resolver.value({"Fn::GetAtt": ["Fn", "Arn"]})
    assert arn == "arn:aws:lambda:us-east-1:123456789012:function:fn"
    assert resolver.value({"Fn::Join": [":", [{"Ref": "AWS::Region"}, {"Fn::Select": [1, ["a", "b"]]}]]}) == \
        "us-east-1:b"
    assert resolver.value({"Fn::Sub": "${Fn.Arn}:*"}) == arn + ":*"


def test_the_recorder_sees_every_client_even_ones_made_by_a_new_session() -> None:
    requests: list[dict[str, Any]] = []
    with recording(requests):
        client = boto3.session.Session().client("secretsmanager")
        with pytest.raises(ClientError):
            client.get_secret_value(SecretId=OTHER)  # refused by moto: recorded all the same
    boto3.session.Session().client("secretsmanager").list_secrets(MaxResults=1)  # outside: not recorded
    assert [(r["service"], r["operation"]) for r in requests] == [("secretsmanager", "GetSecretValue")]
    assert denied([statement(Action="secretsmanager:GetSecretValue", Resource=SECRET)], requests) == [
        f"secretsmanager:GetSecretValue on {OTHER}"]


def test_a_resource_policy_needs_its_principal_and_its_conditions() -> None:
    from tests.iam_policy import ServiceRequest, service_refusal

    topic = "arn:aws:sns:us-east-1:123456789012:alarms"
    grant = {"Effect": "Allow", "Principal": {"Service": "cloudwatch.amazonaws.com"}, "Action": "sns:Publish",
             "Resource": topic,
             "Condition": {"ArnLike": {"aws:SourceArn": "arn:aws:cloudwatch:*:alarm:Stack-*"}}}
    tls = {"Effect": "Deny", "Principal": "*", "Action": "sns:Publish", "Resource": topic,
           "Condition": {"Bool": {"aws:SecureTransport": "false"}}}
    ours = {"aws:SourceArn": "arn:aws:cloudwatch:us-east-1:1:alarm:Stack-x", "aws:SecureTransport": "true"}
    call = Call("sns:Publish", topic)
    assert service_refusal(ServiceRequest("cloudwatch.amazonaws.com", call, ours), [grant, tls]) is None
    assert service_refusal(ServiceRequest("cloudwatch.amazonaws.com", call, ours), [tls])  # no Allow
    assert service_refusal(ServiceRequest("events.amazonaws.com", call, ours), [grant, tls])  # not named
    other = {**ours, "aws:SourceArn": "arn:aws:cloudwatch:us-east-1:1:alarm:Other-x"}
    assert service_refusal(ServiceRequest("cloudwatch.amazonaws.com", call, other), [grant, tls])
    plain = {**ours, "aws:SecureTransport": "false"}
    cloudwatch = "cloudwatch.amazonaws.com"
    assert "denied" in str(service_refusal(ServiceRequest(cloudwatch, call, plain), [grant, tls]))
    unknown = {**grant, "Condition": {"NumericLessThan": {"k": 1}}}
    with pytest.raises(KeyError, match="NumericLessThan"):
        service_refusal(ServiceRequest(cloudwatch, call, ours), [unknown])
