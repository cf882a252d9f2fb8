"""What AWS services do for the stack, checked like the roles: each call a service makes on the
stack's behalf (CloudWatch publishing an alarm and using the topic's key, EventBridge Scheduler
invoking its targets, API Gateway invoking its functions, the event source pollers reading their
secrets and sources, EMR Serverless reading its buckets, ECS pulling images and writing logs) is
evaluated with the request context AWS documents for it (``aws:SourceAccount``, ``aws:SourceArn``,
TLS) against the template's resource policy and key policy, and, where the service assumes a role,
against that role's trust policy and then its statements (``tests/iam_policy.py``, the evaluator of
the per-role test, tests/stacks/test_iam_per_role.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.iam_policy import (
    ACCOUNT,
    PARTITION,
    REGION,
    Call,
    Resolver,
    ServiceRequest,
    raw_statements,
    references,
    resource_policies,
    role_statements,
    service_refusal,
)
from tests.stacks.conftest import DEFAULT, VARIANTS, on_variants
from tests.stacks.test_iam_per_role import Deployment, _lambda_service_probes, _of_kind, _role_of

TLS = {"aws:SecureTransport": "true"}
SOURCE = {"aws:SourceAccount": ACCOUNT, **TLS}


def _arn(service: str, tail: str) -> str:
    return f"arn:{PARTITION}:{service}:{REGION}:{ACCOUNT}:{tail}"


# (what the service does, its principal, the role it assumes or None, the request, the role's context)
Step = tuple[str, str, str | None, ServiceRequest]


def _alarms(resources: dict[str, Any], resolver: Resolver) -> Iterator[Step]:
    """CloudWatch publishes each alarm's notification to the topic, as the alarm (AWS's SNS and KMS
    pages: ``aws:SourceArn`` is the alarm's ARN), through the topic's key when it has one."""
    for alarm in _of_kind(resources, "AWS::CloudWatch::Alarm").values():
        props = alarm["Properties"]
        context = {**SOURCE, "aws:SourceArn": _arn("cloudwatch", f"alarm:{props['AlarmName']}")}
        for action in props.get("AlarmActions", []):
            (topic,) = references(action)
            arn = resolver.ref(topic)
            yield "publish an alarm", "", None, ServiceRequest("cloudwatch.amazonaws.com",
                                                               Call("sns:Publish", arn), context)
            key = resources[topic]["Properties"].get("KmsMasterKeyId")
            for action_name in ("kms:GenerateDataKey", "kms:Decrypt") if key else ():
                yield "use the topic's key", "", None, ServiceRequest(
                    "cloudwatch.amazonaws.com", Call(action_name, str(resolver.value(key))),
                    {**context, "kms:EncryptionContext:aws:sns:topicArn": arn})


def _schedules(resources: dict[str, Any], resolver: Resolver) -> Iterator[Step]:
    """EventBridge Scheduler assumes the target's role (``aws:SourceArn``: the schedule group) and
    invokes the target with it."""
    for schedule in _of_kind(resources, "AWS::Scheduler::Schedule").values():
        props = schedule["Properties"]
        group = props.get("GroupName", "default")
        context = {**SOURCE, "aws:SourceArn": _arn("scheduler", f"schedule-group/{group}")}
        target = props["Target"]
        yield "invoke a schedule's target", "scheduler.amazonaws.com", _role_of(target["RoleArn"]), \
            ServiceRequest("", Call("lambda:InvokeFunction", str(resolver.value(target["Arn"]))), context)


def _apis(resources: dict[str, Any], resolver: Resolver) -> Iterator[Step]:
    """API Gateway invokes each method's function as the stage's method (``aws:SourceArn``:
    ``execute-api:.../{api}/{stage}/{verb}/{path}``), by the function's resource policy."""
    stages = {s["Properties"]["RestApiId"]["Ref"]: logical
              for logical, s in _of_kind(resources, "AWS::ApiGateway::Stage").items()}
    for method in _of_kind(resources, "AWS::ApiGateway::Method").values():
        props = method["Properties"]
        api = props["RestApiId"]["Ref"]
        path = "" if "Fn::GetAtt" in props["ResourceId"] else "topics/example"
        for fn in [r for r in references(props.get("Integration", {}).get("Uri", {}))
                   if resources.get(r, {}).get("Type") == "AWS::Lambda::Function"]:
            verb = "POST" if props["HttpMethod"] == "ANY" else props["HttpMethod"]
            source = _arn("execute-api", f"{resolver.ref(api)}/{resolver.ref(stages[api])}/{verb}/{path}")
            yield "invoke an API's function", "", None, ServiceRequest(
                "apigateway.amazonaws.com", Call("lambda:InvokeFunction", resolver.get_att(fn, "Arn")),
                {**SOURCE, "aws:SourceArn": source})


def _pollers(resources: dict[str, Any], resolver: Resolver) -> Iterator[Step]:
    """Lambda's event source pollers, as the function's role: the per-role test's list of their
    calls (secrets, brokers, topics), here with the resources' own policies."""
    dep = Deployment(resources, resolver, {}, {}, {})
    for probe in _lambda_service_probes(dep):
        for call in probe.extra:
            yield "poll an event source", "lambda.amazonaws.com", probe.role, ServiceRequest("", call, SOURCE)


def _emr(resources: dict[str, Any], resolver: Resolver) -> Iterator[Step]:
    """EMR Serverless assumes the job role and reads and writes the buckets that role names."""
    for logical in _of_kind(resources, "AWS::EMRServerless::Application"):
        application = _arn("emr-serverless", f"/applications/{resolver.ref(logical)}")
        context = {**SOURCE, "aws:SourceArn": application}
        for role, props in _of_kind(resources, "AWS::IAM::Role").items():
            if "emr-serverless" not in str(props["Properties"]["AssumeRolePolicyDocument"]):
                continue
            buckets = {r for r in references(raw_statements(resources, role, resolver))
                       if resources.get(r, {}).get("Type") == "AWS::S3::Bucket"}
            for bucket in sorted(buckets):
                arn = resolver.get_att(bucket, "Arn")
                for call in (Call("s3:ListBucket", arn), Call("s3:GetObject", f"{arn}/input.csv"),
                             Call("s3:PutObject", f"{arn}/output/part-0.json")):
                    yield "run the Spark job", "emr-serverless.amazonaws.com", role, \
                        ServiceRequest("", call, context)


def _ecs(resources: dict[str, Any], resolver: Resolver) -> Iterator[Step]:
    """The ECS agent, as each task definition's execution role: the image and the log stream."""
    context = {**SOURCE, "aws:SourceArn": _arn("ecs", "task/*")}
    for task in _of_kind(resources, "AWS::ECS::TaskDefinition").values():
        props = task["Properties"]
        (container,) = resolver.value(props["ContainerDefinitions"])
        repository = container["Image"].split("/", 1)[1].split(":")[0]
        group = container["LogConfiguration"]["Options"]["awslogs-group"]
        stream = _arn("logs", f"log-group:{group}:log-stream:probe/task")
        for call in (Call("ecr:GetAuthorizationToken", "*"),
                     Call("ecr:BatchGetImage", _arn("ecr", f"repository/{repository}")),
                     Call("logs:CreateLogStream", stream), Call("logs:PutLogEvents", stream)):
            yield "start a task", "ecs-tasks.amazonaws.com", _role_of(props["ExecutionRoleArn"]), \
                ServiceRequest("", call, context)


def refusals(resources: dict[str, Any]) -> tuple[list[str], int]:
    """Every refused step (one line each), and how many steps were checked."""
    resolver = Resolver(resources)
    policies = resource_policies(resources, resolver)
    steps = [step for source in (_alarms, _schedules, _apis, _pollers, _emr, _ecs)
             for step in source(resources, resolver)]
    out = []
    for what, service, role, request in steps:
        if role is None:
            refusal = service_refusal(request, policies)
        else:
            arn = resolver.get_att(role, "Arn")
            trust = [{**s, "Resource": arn} for s in resolver.value(
                resources[role]["Properties"]["AssumeRolePolicyDocument"]["Statement"])]
            assume = ServiceRequest(service, Call("sts:AssumeRole", arn), request.context)
            refusal = service_refusal(assume, trust) or service_refusal(
                ServiceRequest(arn, request.call, TLS), policies, role_statements(resources, role, resolver))
        if refusal:
            out.append(f"{what}: {refusal}")
    return list(dict.fromkeys(out)), len(steps)


@on_variants(DEFAULT, *VARIANTS)
def test_every_call_aws_makes_for_the_stack_is_allowed(resources: dict[str, Any], variant: str) -> None:
    refused, checked = refusals(resources)
    assert checked > (50 if variant == DEFAULT else 5), checked  # every kind of step found something
    assert not refused, "\n".join(refused[:8]) + f"\n({len(refused)} refused of {checked})"


@pytest.mark.parametrize("kind", ["AWS::CloudWatch::Alarm", "AWS::Scheduler::Schedule",
                                  "AWS::ApiGateway::Method", "AWS::Lambda::EventSourceMapping",
                                  "AWS::EMRServerless::Application", "AWS::ECS::TaskDefinition"])
def test_each_kind_of_service_call_is_found_in_the_template(resources: dict[str, Any], kind: str) -> None:
    assert _of_kind(resources, kind), f"the template has no {kind}: the check above would pass on nothing"


@on_variants(DEFAULT, *VARIANTS)
def test_every_service_grant_in_a_resource_policy_names_its_source(resources: dict[str, Any]) -> None:
    """A service principal allowed without ``aws:SourceAccount``/``aws:SourceArn`` may act for any
    account's resource (the confused deputy): each grant names the stack's account or resources."""
    def names_source(statement: dict[str, Any]) -> bool:
        keys = {k for keys in statement.get("Condition", {}).values() for k in keys}
        return bool({"aws:SourceAccount", "aws:SourceArn"} & keys)

    loose = [f"{s['Principal']['Service']}: {s['Action']} on {s['Resource']}"
             for s in resource_policies(resources, Resolver(resources))
             if s["Effect"] == "Allow" and isinstance(s.get("Principal"), dict)
             and "Service" in s["Principal"] and not names_source(s)]
    assert not loose, loose
