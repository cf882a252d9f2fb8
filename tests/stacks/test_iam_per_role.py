"""IAM checked, per role: every role of the synthesized AWS template, run as its process runs on AWS.

For each role (each Switchyard function, each custom resource's provider function, the ECS task and
execution roles, the EMR job role, the scheduler roles) the test starts that process in a fresh
interpreter (``tests/iam_probe.py``: a cold start) with exactly the environment the template gives
it, the stack's configuration parameters put into moto's SSM and its secrets into moto's Secrets
Manager, and runs one representative operation (a custom resource's Create, an empty batch, a
scheduled tick, one API request, a worker's start-up). Every AWS request it makes is recorded with
the resource it names and judged against that role's statements in the template
(``tests/iam_policy.py``); one call the role does not allow fails the test, as does an operation
that fails.

Why not moto's own IAM enforcement: moto (``INITIAL_NO_AUTH_ACTION_COUNT``) matches resources only
for SQS, IAM and STS and checks every other service's action against resource ``*``, so a correctly
scoped grant (GetSecretValue on one secret's ARN) is denied and a wrong one cannot be told apart.

Where the real operation needs RabbitMQ, Postgres, Redis or Kafka, the URLs (and the secret values
that fill their placeholders) point at the local services, with the same placeholders as the
template's (so the code fills the keys the real secret has); the pool, schema, topics and bus name
are made unique, and ``SWITCHYARD_KAFKA_AUTH`` is ``none`` (``Deployment.overrides``: every variable
changed from the template's value).

What AWS itself does with a role (Lambda's logs, traces and ENIs, the event source mappings'
pollers, the Provider framework's and EventBridge Scheduler's invocations, the ECS agent's image
pull, secrets and log stream) is checked as the calls AWS's documentation lists, judged by the same
evaluator. Ignored by the evaluator, and asserted on the template instead
(``test_the_conditions_and_resource_policies_the_evaluator_ignores_hold``): IAM conditions and
resource-based policies (Lambda permissions, bucket and secret policies, keys). Not exercised: the
``kafka-cluster:*`` actions of the processes' own Kafka clients (tansu has no IAM auth; those grants
are asserted in tests/stacks/test_switchyard_stack.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import boto3
import pytest

from switchyard.core.aws_secrets import SECRET_URLS
from switchyard.core.config import Connections
from switchyard.core.deployed_config import CONFIG_PATH_ENV
from tests.iam_policy import (
    ACCOUNT,
    REGION,
    Call,
    Resolver,
    allowed,
    denied,
    raw_statements,
    references,
    role_statements,
)
from tests.stacks.conftest import DEFAULT, on_variants

# Every role of each part alone and of the parts that need each other; a size changes no role.
pytestmark = on_variants(DEFAULT, "rpc-dev", "delay-dev", "pending-dev", "bus-dev", "spark-dev")

ROOT = Path(__file__).resolve().parents[2]
MOTO = os.environ.get("AWS_ENDPOINT_URL") or "http://127.0.0.1:5000"
SERVICES = tuple(SECRET_URLS)  # the services whose URLs a secret fills
# Roles that run CDK's own code with CDK's own policies, not a Switchyard process.
NOT_OURS = ("NetworkVpcFlowLogIAMRole", "CustomVpcRestrictDefaultSG", "AWS679f53fac002430cb0da5b7982bd2287",
            "LogRetention", "CustomS3AutoDeleteObjects")
SCHEDULED = {"version": "0", "id": "iam-probe", "detail-type": "Scheduled Event", "source": "aws.scheduler",
             "account": ACCOUNT, "time": "2026-01-01T00:00:00Z", "region": REGION, "resources": [],
             "detail": {}}


def api_event(method: str, path: str, headers: Mapping[str, str]) -> dict[str, Any]:
    """An API Gateway (REST, proxy) request."""
    return {"resource": "/{proxy+}", "path": path, "httpMethod": method, "headers": dict(headers),
            "multiValueHeaders": {k: [v] for k, v in headers.items()}, "queryStringParameters": None,
            "multiValueQueryStringParameters": None, "pathParameters": {"proxy": path.lstrip("/")},
            "stageVariables": None, "body": None, "isBase64Encoded": False,
            "requestContext": {"requestId": "iam-probe", "stage": "v1", "resourcePath": "/{proxy+}",
                               "httpMethod": method, "path": f"/v1{path}",
                               "identity": {"sourceIp": "127.0.0.1"}}}


@dataclass
class Probe:
    """One process run as ``role``: ``spec`` for tests/iam_probe.py (empty: AWS itself makes the
    calls, in ``extra``), ``env`` the template's environment, ``plain`` variables set as they are
    (what ECS injects from secrets, what ``spark submit`` passes)."""

    role: str
    spec: dict[str, Any]
    env: dict[str, Any] = field(default_factory=dict)
    plain: dict[str, str] = field(default_factory=dict)
    extra: list[Call] = field(default_factory=list)


@dataclass
class Deployment:
    """The template's secrets and parameters in moto, its services on 127.0.0.1."""

    resources: dict[str, dict[str, Any]]
    resolver: Resolver
    overrides: dict[str, str]
    local_urls: dict[str, str]
    config: dict[str, str]  # the stack's configuration parameters, as put into SSM

    def localize(self, env: Mapping[str, Any]) -> dict[str, str]:
        """The resolved ``env`` with the service URLs pointed at the local services (same
        placeholders: the secret keys the template's URL names are the ones the code fills)."""
        out = {}
        for name, raw in env.items():
            value = str(self.resolver.value(raw))
            if name in self.local_urls:
                assert _fields(value) == _fields(self.local_urls[name]), (name, value)
                value = self.local_urls[name]
            out[name] = self.overrides.get(name, value)
        return out

    def process_env(self, env: Mapping[str, Any]) -> dict[str, str]:
        return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "PYTHONPATH": str(ROOT),
                "AWS_ENDPOINT_URL": MOTO, "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION,
                "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "POWERTOOLS_TRACE_DISABLED": "true", **self.localize(env)}


def _fields(url: str) -> set[str]:
    from string import Formatter

    return {f for _, f, _, _ in Formatter().parse(url) if f}


def _local() -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Each service URL of the local stack as a template, and the secret values that fill it."""
    local = Connections.from_env()
    amqp, mgmt = urlsplit(local.amqp_url), urlsplit(local.management_url)
    redis_, pg = urlsplit(local.redis_url), urlsplit(local.postgres_dsn)
    urls = {
        "SWITCHYARD_AMQP_URL": f"{amqp.scheme}://{{username}}:{{password}}@{amqp.hostname}:"
                               f"{amqp.port or 5672}{amqp.path}",
        "SWITCHYARD_MANAGEMENT_URL": f"{mgmt.scheme}://{{username}}:{{password}}@{mgmt.hostname}:{mgmt.port}",
        "SWITCHYARD_REDIS_URL": f"{redis_.scheme}://:{{password}}@{redis_.hostname}:{redis_.port or 6379}"
                                f"{redis_.path}",
        "SWITCHYARD_POSTGRES_DSN": "postgresql://{username}:{password}@{host}:{port}/{dbname}",
        "SWITCHYARD_KAFKA_BOOTSTRAP": local.kafka_bootstrap,
    }
    secrets = {
        "AMQP": {"username": unquote(amqp.username or ""), "password": unquote(amqp.password or "")},
        "REDIS": {"password": unquote(redis_.password or "")},
        "POSTGRES": {"username": pg.username or "", "password": unquote(pg.password or ""),
                     "host": pg.hostname or "", "port": str(pg.port or 5432), "dbname": pg.path.lstrip("/")},
    }
    return urls, secrets


def _of_kind(resources: Mapping[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in resources.items() if v["Type"] == kind}


def _secret_logical(resources: Mapping[str, Any], ref: Any) -> str:
    logical = ref["Ref"]
    if resources[logical]["Type"] == "AWS::SecretsManager::SecretTargetAttachment":
        return resources[logical]["Properties"]["SecretId"]["Ref"]
    return logical


def _service_secrets(resources: dict[str, dict[str, Any]], config: Mapping[str, Any]) -> dict[str, str]:
    """Secret logical id -> the service whose URLs it fills, wherever a process finds it: the deployed
    configuration, a function's environment (each broker role names its own user's secret) or an ECS
    task's injected secrets. Each gets the local service's credentials: this test is about IAM; the
    broker users' own permissions are tests/rpc/test_broker_users.py's."""
    found: dict[str, str] = {}
    environments = [config, *(fn["Properties"].get("Environment", {}).get("Variables", {})
                              for fn in _of_kind(resources, "AWS::Lambda::Function").values())]
    for env in environments:
        found.update({_secret_logical(resources, env[f"SWITCHYARD_{s}_SECRET_ARN"]): s
                      for s in SERVICES if f"SWITCHYARD_{s}_SECRET_ARN" in env})
    for task in _of_kind(resources, "AWS::ECS::TaskDefinition").values():
        for container in task["Properties"]["ContainerDefinitions"]:
            for secret in container.get("Secrets", []):
                service = next((s for s in SERVICES if secret["Name"].startswith(f"SWITCHYARD_{s}_")), None)
                for logical in (r for r in references(secret["ValueFrom"]) if service and r in resources):
                    found[_secret_logical(resources, {"Ref": logical})] = service
    return found


def _own_config_path(resources: dict[str, dict[str, Any]], tag: str) -> dict[str, dict[str, Any]]:
    """The template with its configuration path made unique, as if synthesized under another stack
    name: moto is shared with other test runs, which may write or delete the default path."""
    path = next(fn["Properties"]["Environment"]["Variables"][CONFIG_PATH_ENV]
                for fn in _of_kind(resources, "AWS::Lambda::Function").values()
                if CONFIG_PATH_ENV in fn["Properties"].get("Environment", {}).get("Variables", {}))
    own = path.rstrip("/") + f"-iam{tag}/"
    return json.loads(json.dumps(resources).replace(path.rstrip("/"), own.rstrip("/")))


@pytest.fixture(scope="module")
def deployment(resources: dict[str, dict[str, Any]]) -> Iterator[Deployment]:
    tag = uuid.uuid4().hex[:8]
    resources = _own_config_path(resources, tag)
    local_urls, local_secrets = _local()
    params = {v["Properties"]["Name"]: v["Properties"]["Value"]
              for v in _of_kind(resources, "AWS::SSM::Parameter").values()}
    by_variable = {name.rsplit("/", 1)[1]: value for name, value in params.items()}
    service_secret = _service_secrets(resources, by_variable)
    sm = boto3.client("secretsmanager", endpoint_url=MOTO, region_name=REGION)
    refs: dict[str, str] = {}
    for logical, res in _of_kind(resources, "AWS::SecretsManager::Secret").items():
        if logical in service_secret:
            value = local_secrets[service_secret[logical]]
        else:
            generate = res["Properties"].get("GenerateSecretString", {})
            value = {**json.loads(generate.get("SecretStringTemplate", "{}")),
                     generate.get("GenerateStringKey", "value"): "iam-probe-" + tag}
        refs[logical] = sm.create_secret(Name=f"{logical}-{tag}", SecretString=json.dumps(value))["ARN"]
    pool, schema = f"iam{tag}", f"iam_{tag}"
    topics = (f"iam-in-{tag}", f"iam-out-{tag}")
    overrides = {"SWITCHYARD_KAFKA_AUTH": "none",  # tansu speaks no MSK IAM auth
                 "SWITCHYARD_RPC_POOL": pool, "WORKER_POOL": pool, "IAM_PROBE_POOL": pool,
                 "SWITCHYARD_DELAY_SCHEMA": schema, "SWITCHYARD_DELAY_INPUT_TOPIC": topics[0],
                 "SWITCHYARD_DELAY_OUTPUT_TOPIC": topics[1], "SWITCHYARD_BUS_NAME": f"iam{tag}"}
    for logical in _of_kind(resources, "AWS::ECS::Cluster"):
        refs[logical] = f"iam-{tag}"
    resolver = Resolver(resources, refs)
    dep = Deployment(resources, resolver, overrides, local_urls, {})
    dep.config = dep.localize({name.rsplit("/", 1)[1]: value for name, value in params.items()})
    ssm = boto3.client("ssm", endpoint_url=MOTO, region_name=REGION)
    for name in params:
        ssm.put_parameter(Name=name, Value=dep.config[name.rsplit("/", 1)[1]], Type="String", Overwrite=True)
    _make_aws_resources(dep)
    cleanup = _make_local_resources(pool, schema, topics)
    try:
        yield dep
    finally:
        cleanup()
        ssm.delete_parameters(Names=list(params))
        for logical, ref in refs.items():
            if ref.startswith("arn:aws:secretsmanager"):
                sm.delete_secret(SecretId=ref, ForceDeleteWithoutRecovery=True)
            elif logical in _of_kind(resources, "AWS::ECS::Cluster"):
                ecs = boto3.client("ecs", endpoint_url=MOTO, region_name=REGION)
                for task in ecs.list_tasks(cluster=ref)["taskArns"]:  # what the orphan probe started
                    ecs.stop_task(cluster=ref, task=task)
                with contextlib.suppress(ecs.exceptions.ClientError):
                    ecs.delete_cluster(cluster=ref)


def _make_aws_resources(dep: Deployment) -> None:
    """In moto: the ECS cluster and task definitions (the control plane runs and lists tasks),
    the workers' log groups and the image repository (the ECS agent's calls)."""
    ecs = boto3.client("ecs", endpoint_url=MOTO, region_name=REGION)
    logs = boto3.client("logs", endpoint_url=MOTO, region_name=REGION)
    ecr = boto3.client("ecr", endpoint_url=MOTO, region_name=REGION)
    for logical in _of_kind(dep.resources, "AWS::ECS::Cluster"):
        ecs.create_cluster(clusterName=dep.resolver.ref(logical))
    for task in _of_kind(dep.resources, "AWS::ECS::TaskDefinition").values():
        props = dep.resolver.value(task["Properties"])
        containers = [{"name": c["Name"], "image": c["Image"], "memory": c["Memory"]}
                      for c in props["ContainerDefinitions"]]
        ecs.register_task_definition(family=props["Family"], containerDefinitions=containers,
                                     requiresCompatibilities=["FARGATE"], networkMode="awsvpc",
                                     cpu=props["Cpu"], memory=props["Memory"],
                                     taskRoleArn=props["TaskRoleArn"],
                                     executionRoleArn=props["ExecutionRoleArn"])
        for c in props["ContainerDefinitions"]:
            with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):  # shared by runs
                logs.create_log_group(logGroupName=c["LogConfiguration"]["Options"]["awslogs-group"])
            with contextlib.suppress(ecr.exceptions.RepositoryAlreadyExistsException):
                ecr.create_repository(repositoryName=c["Image"].split("/", 1)[1].split(":")[0])


def _make_local_resources(pool: str, schema: str, topics: tuple[str, str]) -> Any:
    """The pool, the delay schema and topics the probes work on (unique names), and their cleanup."""
    import psycopg
    import redis

    from switchyard.aws import deploy
    from tests.delay.conftest import delete_topics
    from tests.rpc.conftest import delete_pool, flush_pool_state

    local = Connections.from_env()
    deploy.declare_pools({"RequestType": "Create", "ResourceProperties": {"Pools": [pool]}})
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SWITCHYARD_DELAY_SCHEMA", schema)
        deploy.migrate_delay_schema({"RequestType": "Create", "ResourceProperties": {"Schema": schema}})
    from confluent_kafka.admin import AdminClient

    deploy.create_topics({"RequestType": "Create", "ResourceProperties": {
        "Topics": list(topics), "Partitions": 1, "ReplicationFactor": 1}},
        AdminClient({"bootstrap.servers": local.kafka_bootstrap}))

    def cleanup() -> None:
        from switchyard.rpc.settings import RpcSettings

        delete_pool(RpcSettings.from_env(), pool)
        flush_pool_state(redis.Redis.from_url(local.redis_url), pool)  # the group the orphan probe started
        with psycopg.connect(local.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        delete_topics(local.kafka_bootstrap, *topics)

    return cleanup


# -- the probes, one per role ---------------------------------------------------------------------------
def _role_of(arn: Mapping[str, Any]) -> str:
    return arn["Fn::GetAtt"][0]


def _orphan_event(pool: str, broker: str) -> dict[str, Any]:
    import pika

    from switchyard.local.rmq_bridge import RmqDelivery, build_rmq_event
    from switchyard.rpc import protocol

    request = RmqDelivery(b"{}", pika.BasicProperties(headers={protocol.KEY_HEADER: "iam-probe-key"},
                                                       correlation_id="iam-probe", expiration="60000"))
    return build_rmq_event(protocol.orphan_queue(pool), "/", [request], broker_arn=broker)


def _fired_event(pool: str, topic: str, kafka: object) -> dict[str, Any]:
    """Two fired scheduled calls: one into the probe's pool (published as the relay's broker user),
    one for a pool that does not exist (parked in the delay store)."""
    import base64
    from datetime import UTC, datetime

    from switchyard.rpc.scheduling import ScheduledCall, scheduled_headers

    records = []
    for offset, target in enumerate((pool, "iam_probe_no_such_pool")):
        call = ScheduledCall(f"iam-probe-{offset}", target, "iam-probe-key", b"{}")
        headers = [{name: list(value)} for name, value in scheduled_headers(call, datetime.now(UTC))
                   if not name.startswith("chronos")]
        records.append({"topic": topic, "partition": 0, "offset": offset, "timestamp": 0,
                        "timestampType": "CREATE_TIME", "value": base64.b64encode(call.body).decode(),
                        "headers": headers})
    return {"eventSource": "aws:kafka", "eventSourceArn": kafka, "bootstrapServers": "127.0.0.1:9092",
            "records": {f"{topic}-0": records}}


def _arn_of(dep: Deployment, kind: str, part: str) -> str:
    """The ARN of the template's one ``kind``; a stand-in where its part is not deployed (no
    function of the template then takes the events that name it)."""
    found = _of_kind(dep.resources, kind)
    return dep.resolver.get_att(next(iter(found)), "Arn") if found else f"arn:aws:{part}:not-deployed"


def _events(dep: Deployment) -> dict[str, Any]:
    """A representative invocation per handler module: a custom resource's Create on the probe's own
    names, an empty batch, a scheduled tick, one authenticated API request (refused: wrong token)."""
    broker = _arn_of(dep, "AWS::AmazonMQ::Broker", "rpc")
    kafka = _arn_of(dep, "AWS::MSK::Cluster", "delay")
    o = dep.overrides
    rmq = {"eventSource": "aws:rmq", "eventSourceArn": broker, "rmqMessagesByQueue": {}}
    return {
        # one orphan of a new key: the control plane starts its worker group (ECS RunTask)
        "rpc_orphans": _orphan_event(o["SWITCHYARD_RPC_POOL"], broker),
        "deploy_pools": {"RequestType": "Create",
                         "ResourceProperties": {"Pools": [o["SWITCHYARD_RPC_POOL"]]}},
        "deploy_delay_schema": {"RequestType": "Create",
                                "ResourceProperties": {"Schema": o["SWITCHYARD_DELAY_SCHEMA"]}},
        "deploy_topics": {"RequestType": "Create", "ResourceProperties": {
            "Topics": [o["SWITCHYARD_DELAY_INPUT_TOPIC"]], "Partitions": 1, "ReplicationFactor": 1}},
        "rpc_dead_letters": rmq, "rpc_activity": rmq,
        "rpc_reconcile": SCHEDULED, "delay_fire": SCHEDULED, "delay_sweep": SCHEDULED,
        "bus_housekeeping": SCHEDULED,
        "rpc_scheduled": _fired_event(o["SWITCHYARD_RPC_POOL"], o["SWITCHYARD_DELAY_OUTPUT_TOPIC"], kafka),
        "delay_enqueue": {"eventSource": "aws:kafka", "eventSourceArn": kafka,
                          "bootstrapServers": "127.0.0.1:9092", "records": {}},
        "bus_api": api_event("GET", "/api_tokens", {"Authorization": "Basic aWFtOnByb2Jl"}),
        "pending_api": api_event("GET", "/endpoints/example/next", {"Authorization": "Bearer iam-probe"}),
    }


def _lambda_probes(dep: Deployment) -> list[Probe]:
    events, probes = _events(dep), []
    for fn in _of_kind(dep.resources, "AWS::Lambda::Function").values():
        props = fn["Properties"]
        module, handler = props["Handler"].rsplit(".", 1)
        env = props.get("Environment", {}).get("Variables", {})
        if module in events:
            probes.append(Probe(_role_of(props["Role"]), {"kind": "lambda", "module": module,
                                                          "handler": handler, "event": events[module]}, env))
        elif module == "framework" and "USER_ON_EVENT_FUNCTION_ARN" in env:
            # A custom resource's Provider framework (CDK's code) invokes the user's function.
            target = str(dep.resolver.value(env["USER_ON_EVENT_FUNCTION_ARN"]))
            probes.append(Probe(_role_of(props["Role"]), {}, extra=[Call("lambda:InvokeFunction", target)]))
    return probes


def _ecs_probes(dep: Deployment) -> list[Probe]:
    """Per task definition: the container's start-up as its task role, the ECS agent's calls
    (image, secrets, logs) as its execution role."""
    sm = boto3.client("secretsmanager", endpoint_url=MOTO, region_name=REGION)
    probes = []
    for task in _of_kind(dep.resources, "AWS::ECS::TaskDefinition").values():
        props = task["Properties"]
        (container,) = props["ContainerDefinitions"]
        resolved = dep.resolver.value(container)
        injected = {}
        for secret in resolved.get("Secrets", []):  # ARN:key:: -> the key's value, as ECS injects it
            arn, key = secret["ValueFrom"].rsplit(":", 3)[:2]
            injected[secret["Name"]] = json.loads(sm.get_secret_value(SecretId=arn)["SecretString"])[key]
        target = "bus_worker" if container["Command"][:1] == ["bus"] else "rpc_worker"
        env = {e["Name"]: e["Value"] for e in container.get("Environment", [])}
        probes.append(Probe(_role_of(props["TaskRoleArn"]),
                            {"kind": "call", "target": f"tests.iam_probe:{target}"}, env, injected))
        options = resolved["LogConfiguration"]["Options"]
        agent = [sorted({s["ValueFrom"].rsplit(":", 3)[0] for s in resolved.get("Secrets", [])}),
                 options["awslogs-group"], f"{options['awslogs-stream-prefix']}/probe/{uuid.uuid4().hex}",
                 resolved["Image"].split("/", 1)[1].split(":")[0]]
        probes.append(Probe(_role_of(props["ExecutionRoleArn"]),
                            {"kind": "call", "target": "tests.iam_probe:ecs_agent", "args": agent}))
    return probes


def _scheduler_probes(dep: Deployment) -> list[Probe]:
    """EventBridge Scheduler invokes the target with the schedule's role (AWS's call, recorded as such)."""
    probes = []
    for schedule in _of_kind(dep.resources, "AWS::Scheduler::Schedule").values():
        target = schedule["Properties"]["Target"]
        probes.append(Probe(_role_of(target["RoleArn"]), {},
                            extra=[Call("lambda:InvokeFunction", str(dep.resolver.value(target["Arn"])))]))
    return probes


ENI_ACTIONS = ("ec2:CreateNetworkInterface", "ec2:DescribeNetworkInterfaces", "ec2:DeleteNetworkInterface")
POLLER_ENI_ACTIONS = (*ENI_ACTIONS, "ec2:DescribeSecurityGroups", "ec2:DescribeSubnets", "ec2:DescribeVpcs")


def _lambda_service_probes(dep: Deployment) -> list[Probe]:
    """What Lambda does with each function's role (AWS's documented calls, not the handler's): write
    its logs, send its traces, attach it to the VPC; and each event source mapping's pollers:
    Amazon MQ (the broker, its credentials secret, ENIs) and MSK with IAM auth (the cluster, its
    brokers, the consumer group, the topics, ENIs)."""
    probes = []
    functions = _of_kind(dep.resources, "AWS::Lambda::Function")
    for logical, fn in functions.items():
        props = fn["Properties"]
        name = dep.resolver.ref(logical)
        group = dep.resolver.value(props.get("LoggingConfig", {}).get("LogGroup", f"/aws/lambda/{name}"))
        stream = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{group}:log-stream:2026/01/01/[$LATEST]probe"
        calls = [Call("logs:CreateLogStream", stream), Call("logs:PutLogEvents", stream)]
        if props.get("TracingConfig", {}).get("Mode") == "Active":
            calls += [Call("xray:PutTraceSegments", "*"), Call("xray:PutTelemetryRecords", "*")]
        if "VpcConfig" in props:
            calls += [Call(action, "*") for action in ENI_ACTIONS]
        probes.append(Probe(_role_of(props["Role"]), {}, extra=calls))
    for mapping in _of_kind(dep.resources, "AWS::Lambda::EventSourceMapping").values():
        props = dep.resolver.value(mapping["Properties"])
        role = _role_of(functions[mapping["Properties"]["FunctionName"]["Ref"]]["Properties"]["Role"])
        source = props["EventSourceArn"]
        calls = [Call(action, "*") for action in POLLER_ENI_ACTIONS]
        if ":mq:" in source:
            calls.append(Call("mq:DescribeBroker", source))
            calls += [Call("secretsmanager:GetSecretValue", c["URI"])
                      for c in props.get("SourceAccessConfigurations", []) if c["Type"] == "BASIC_AUTH"]
        else:
            group = props["AmazonManagedKafkaEventSourceConfig"]["ConsumerGroupId"]
            calls += [Call("kafka:DescribeClusterV2", source), Call("kafka:GetBootstrapBrokers", source),
                      Call("kafka-cluster:Connect", source),
                      Call("kafka-cluster:DescribeClusterDynamicConfiguration", source),
                      *(Call(f"kafka-cluster:{a}", source.replace(":cluster/", ":group/") + f"/{group}")
                        for a in ("DescribeGroup", "AlterGroup")),
                      *(Call(f"kafka-cluster:{a}", source.replace(":cluster/", ":topic/") + f"/{topic}")
                        for topic in props["Topics"] for a in ("DescribeTopic", "ReadData"))]
        probes.append(Probe(role, {}, extra=calls))
    return probes


def _emr_probe(dep: Deployment) -> Probe:
    """The publish job as ``switchyard spark submit --stack`` starts it: with the variables it passes."""
    import argparse

    from switchyard.spark.emr import spec_from_args

    role = next(k for k, v in _of_kind(dep.resources, "AWS::IAM::Role").items()
                if "emr-serverless" in json.dumps(v["Properties"]["AssumeRolePolicyDocument"]))
    # the job's input and output: in the bucket its role names (the pipeline bucket)
    (bucket,) = {r for r in references(raw_statements(dep.resources, role, dep.resolver))
                 if dep.resources.get(r, {}).get("Type") == "AWS::S3::Bucket"}
    s3 = boto3.client("s3", endpoint_url=MOTO, region_name=REGION)
    name, prefix = dep.resolver.ref(bucket), f"iam-probe/{uuid.uuid4().hex}"
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket=name)
    s3.put_object(Bucket=name, Key=f"{prefix}/input.csv", Body=b"pool,key,payload\n")
    s3.put_object(Bucket=name, Key=f"{prefix}/output/results/old.json", Body=b"{}\n")
    args = argparse.Namespace(
        bucket=None, entry_point="s3://pipeline/publish_requests.py", archive="s3://pipeline/env.tar.gz",
        logs="s3://pipeline/logs/", application_id="app1", role_arn=dep.resolver.get_att(role, "Arn"),
        job_args=[], env=[], name="iam-probe")
    job_env = dict(spec_from_args(args, {}, dep.config).env)
    return Probe(role, {"kind": "call", "target": "tests.iam_probe:emr_job",
                        "args": [f"s3://{name}/{prefix}/input.csv", f"s3://{name}/{prefix}/output"]},
                 plain={k: dep.overrides.get(k, v) for k, v in job_env.items()})


def _run(dep: Deployment, probe: Probe) -> dict[str, Any]:
    if not probe.spec:
        return {"requests": [], "error": None}
    env = {**dep.process_env(probe.env), **probe.plain, "IAM_PROBE_POOL": dep.overrides["IAM_PROBE_POOL"]}
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = Path(tmp, "spec.json"), Path(tmp, "out.json")
        spec_path.write_text(json.dumps(probe.spec))
        done = subprocess.run([sys.executable, "-m", "tests.iam_probe", str(spec_path), str(out_path)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
        if not out_path.exists():
            return {"requests": [], "error": f"the probe did not finish: {done.stderr[-2000:]}"}
        return json.loads(out_path.read_text())


def _pass_roles(dep: Deployment, requests: list[dict[str, Any]]) -> list[Call]:
    """RunTask passes the task definition's roles: IAM checks ``iam:PassRole`` on each."""
    roles = {}
    for task in _of_kind(dep.resources, "AWS::ECS::TaskDefinition").values():
        props = dep.resolver.value(task["Properties"])
        roles[props["Family"]] = [props["TaskRoleArn"], props["ExecutionRoleArn"]]
    run_task = [r for r in requests if (r["service"], r["operation"]) == ("ecs", "RunTask")]
    return [Call("iam:PassRole", arn) for r in run_task
            for arn in roles[r["params"]["taskDefinition"].rsplit("/", 1)[-1].split(":")[0]]]


@pytest.fixture(scope="module")
def probed(deployment: Deployment) -> list[tuple[Probe, dict[str, Any]]]:
    has_emr = _of_kind(deployment.resources, "AWS::EMRServerless::Application")
    emr = [_emr_probe(deployment)] if has_emr else []
    probes = [*_lambda_probes(deployment), *_ecs_probes(deployment), *_scheduler_probes(deployment),
              *emr, *_lambda_service_probes(deployment)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        return list(zip(probes, pool.map(lambda p: _run(deployment, p), probes), strict=True))


def test_every_role_of_the_template_is_probed(resources: dict[str, Any],
                                               probed: list[tuple[Probe, dict[str, Any]]]) -> None:
    roles = set(_of_kind(resources, "AWS::IAM::Role"))
    unprobed = {r for r in roles - {p.role for p, _ in probed} if not r.startswith(NOT_OURS)}
    assert not unprobed, f"roles no probe runs as (add one to this test): {sorted(unprobed)}"


def test_every_aws_call_of_every_role_is_allowed_by_its_statements(
        deployment: Deployment, probed: list[tuple[Probe, dict[str, Any]]]) -> None:
    failures, summary = [], []
    for probe, result in probed:
        if probe.role.startswith(NOT_OURS):
            continue  # CDK's own functions: what Lambda does for them is CDK's to grant
        statements = role_statements(deployment.resources, probe.role, deployment.resolver)
        extra = [*probe.extra, *_pass_roles(deployment, result["requests"])]
        refused = [*denied(statements, result["requests"]),
                   *(str(c) for c in extra if not allowed(statements, c))]
        what = probe.spec.get("module") or probe.spec.get("target") or "AWS with the role"
        summary.append(f"{probe.role} ({what}): {len(result['requests']) + len(extra)} calls")
        failures += [f"{probe.role} ({what}) is not allowed {call}" for call in dict.fromkeys(refused)]
        if result["error"]:
            failures.append(f"{probe.role} ({what}) failed: {result['error'].strip().splitlines()[-1]}")
    print("\n".join(summary))
    assert not failures, "\n".join(failures)


def _condition_holds(dep: Deployment, operator: str, key: str, value: Any) -> bool:
    """Each condition key the roles use, and the value under which the probed calls meet it."""
    clusters = {dep.resolver.get_att(c, "Arn") for c in _of_kind(dep.resources, "AWS::ECS::Cluster")}
    expected = {("ArnEquals", "ecs:cluster"): lambda v: v in clusters,  # the calls name the stack's cluster
                ("StringEquals", "ecs:CreateAction"): lambda v: v == "RunTask",  # tags given at RunTask
                ("StringEquals", "iam:PassedToService"): lambda v: v == "ecs-tasks.amazonaws.com"}
    check = expected.get((operator, key))
    return check is not None and check(value)


def test_the_conditions_and_resource_policies_the_evaluator_ignores_hold(
        deployment: Deployment, probed: list[tuple[Probe, dict[str, Any]]]) -> None:
    """Conditions: every condition of a probed role is one whose value the probed calls meet (and
    the ECS calls name the stack's cluster, as ``ecs:cluster`` requires). Resource policies: no
    secret has one or a customer key (GetSecretValue would need kms:Decrypt too), buckets deny only
    requests without TLS, and each API Gateway integration may invoke its function."""
    dep, problems = deployment, []
    clusters = {dep.resolver.ref(c) for c in _of_kind(dep.resources, "AWS::ECS::Cluster")}
    for probe, result in probed:
        for statement in raw_statements(dep.resources, probe.role, dep.resolver):
            for operator, keys in dep.resolver.value(statement.get("Condition", {})).items():
                problems += [f"{probe.role}: {operator} {key} = {value!r} is not a condition this test "
                             "knows how the calls meet (add it to _condition_holds)"
                             for key, value in keys.items()
                             if not _condition_holds(dep, operator, key, value)]
        problems += [f"{probe.role}: {r['operation']} names cluster {r['params'].get('cluster')!r}"
                     for r in result["requests"] if r["service"] == "ecs"
                     and str(r["params"].get("cluster", "default")).rsplit("/", 1)[-1] not in clusters]
    assert not problems, "\n".join(problems)

    assert not _of_kind(dep.resources, "AWS::SecretsManager::ResourcePolicy")
    assert [k for k, v in _of_kind(dep.resources, "AWS::SecretsManager::Secret").items()
            if "KmsKeyId" in v["Properties"]] == []
    for policy in _of_kind(dep.resources, "AWS::S3::BucketPolicy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if statement["Effect"] == "Deny":
                assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}, statement
    permissions = [p["Properties"] for p in _of_kind(dep.resources, "AWS::Lambda::Permission").values()]
    checked = set()
    for method in _of_kind(dep.resources, "AWS::ApiGateway::Method").values():
        integration = method["Properties"].get("Integration", {})
        api = method["Properties"]["RestApiId"]["Ref"]
        for fn in {r for r in references(integration.get("Uri", {}))
                   if dep.resources.get(r, {}).get("Type") == "AWS::Lambda::Function"}:
            assert any(p["Principal"] == "apigateway.amazonaws.com" and p["Action"] == "lambda:InvokeFunction"
                       and fn in references(p["FunctionName"]) and api in references(p["SourceArn"])
                       for p in permissions), f"API {api} may not invoke {fn}"
            checked.add(fn)
    # one function per API: the event bus's and the pending queue's, those of them the variant deploys
    assert len(checked) == len(_of_kind(dep.resources, "AWS::ApiGateway::RestApi")), checked
