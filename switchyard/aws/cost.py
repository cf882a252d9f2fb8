"""What a synthesized stack costs a month idle: counted from its CloudFormation template (and its pools'
nested templates), priced per AWS's pricing pages (us-east-1, on-demand, 730 hours a month).

Read, not deployed: ``switchyard cost`` prints it from ``cdk.out`` before a deploy, and
docs/deployment.md's and the README's cost tables are generated from it (``python -m scripts.costs docs``;
tests/stacks/test_cost_table.py keeps the two in step). Idle means no traffic: the always-on
instances, NAT gateways, endpoints, the Lambda loops (a scheduled function whose timeout outlasts its
one-minute rate runs the whole month), the bus's workers, the pools' warm spares (``minSpares``), alarms,
secrets and keys. Per-use charges
(requests, data, RPC worker tasks, EMR jobs, the MSK event pollers' hours) are named, not added.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from switchyard.rpc.settings import ECS_CAPACITY_PROVIDER, ECS_TASK_DEFINITION, MIN_SPARES

HOURS = 730  # a month, as AWS's pages price one
SECONDS = HOURS * 3600

MQ, MSK, RDS, CACHE = ("aws.amazon.com/amazon-mq/pricing", "aws.amazon.com/msk/pricing",
                       "aws.amazon.com/rds/postgresql/pricing", "aws.amazon.com/elasticache/pricing")
VPC, LINK, FARGATE, LAMBDA = ("aws.amazon.com/vpc/pricing", "aws.amazon.com/privatelink/pricing",
                              "aws.amazon.com/fargate/pricing", "aws.amazon.com/lambda/pricing")
WATCH, SECRETS, KMS = ("aws.amazon.com/cloudwatch/pricing", "aws.amazon.com/secrets-manager/pricing",
                       "aws.amazon.com/kms/pricing")

# USD per instance-hour, by instance type (us-east-1, on-demand; ElastiCache: a Valkey node).
INSTANCE_HOURLY = {
    "mq.t3.micro": 0.0216, "mq.m7g.large": 0.274,
    "kafka.t3.small": 0.0456, "kafka.m7g.large": 0.204,
    "db.t4g.micro": 0.016, "db.t4g.small": 0.032,
    "cache.t4g.micro": 0.0128, "cache.t4g.small": 0.0256,
}
BROKER_INSTANCES = {"SINGLE_INSTANCE": 1, "CLUSTER_MULTI_AZ": 3}
MSK_GB_MONTH = 0.10
RDS_GP3_GB_MONTH = 0.115
NAT_HOURLY, PUBLIC_IPV4_HOURLY, ENDPOINT_AZ_HOURLY = 0.045, 0.005, 0.01
FARGATE_VCPU_HOURLY, FARGATE_GB_HOURLY = 0.04048, 0.004445
FARGATE_SPOT_SHARE = 0.3  # Spot is "up to 70% off" on-demand; its price moves
LAMBDA_GB_SECOND = 0.0000166667
ALARM_METRIC, DASHBOARD, SECRET, KMS_KEY = 0.10, 3.0, 0.40, 1.0


@dataclass(frozen=True)
class Line:
    """One priced item: what the template runs of it and its monthly figure (0: per use only)."""

    item: str
    runs: str
    usd: float
    source: str


class TemplateError(ValueError):
    """No template where one was expected: the message says what to run."""


def load_resources(path: Path, stack: str | None = None) -> dict[str, dict[str, Any]]:
    """A template's resources with its nested stacks' (a cdk.out directory: ``stack``'s, or its one
    stack's; a file: that template alone)."""
    if path.is_file():
        return dict(json.loads(path.read_text()).get("Resources", {}))
    if not path.is_dir():
        raise TemplateError(f"{path} does not exist: run ./dev cdk synth (or `python app.py`) first")
    names = sorted(p.name.removesuffix(".template.json") for p in path.glob("*.template.json")
                   if not p.name.endswith(".nested.template.json"))
    if stack is None and len(names) == 1:
        stack = names[0]
    if stack not in names:
        raise TemplateError(f"no stack {stack!r} in {path} (it holds {names or 'none'}): "
                            "run ./dev cdk synth first, or name one with --stack-name")
    resources = dict(json.loads((path / f"{stack}.template.json").read_text()).get("Resources", {}))
    assets = path / f"{stack}.assets.json"
    files = json.loads(assets.read_text()).get("files", {}) if assets.is_file() else {}
    for asset in files.values():
        nested = str(asset.get("source", {}).get("path", ""))
        if nested.endswith(".nested.template.json"):
            resources.update(json.loads((path / nested).read_text()).get("Resources", {}))
    return resources


def _of(resources: dict[str, dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r.get("Properties", {}) for r in resources.values() if r["Type"] == kind]


def _hourly(instance_type: str) -> float:
    if instance_type not in INSTANCE_HOURLY:
        raise TemplateError(f"no price for {instance_type} in switchyard/aws/cost.py (INSTANCE_HOURLY): "
                            "add it from the service's pricing page")
    return INSTANCE_HOURLY[instance_type]


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _broker(resources: dict[str, dict[str, Any]]) -> Iterable[Line]:
    for broker in _of(resources, "AWS::AmazonMQ::Broker"):
        kind, mode = broker["HostInstanceType"], broker["DeploymentMode"]
        n = BROKER_INSTANCES[mode]
        yield Line("Amazon MQ", f"{n} x `{kind}` ({mode}, RabbitMQ {broker['EngineVersion']})",
                   n * _hourly(kind) * HOURS, MQ)


def _msk(resources: dict[str, dict[str, Any]]) -> Iterable[Line]:
    for cluster in _of(resources, "AWS::MSK::Cluster"):
        group, n = cluster["BrokerNodeGroupInfo"], int(cluster["NumberOfBrokerNodes"])
        gib = int(group["StorageInfo"]["EBSStorageInfo"]["VolumeSize"])
        kind = group["InstanceType"]
        yield Line("MSK", f"{n} x `{kind}` + {n} x {gib} GiB",
                   n * (_hourly(kind) * HOURS + gib * MSK_GB_MONTH), MSK)


def _rds(resources: dict[str, dict[str, Any]]) -> Iterable[Line]:
    for db in _of(resources, "AWS::RDS::DBInstance"):
        copies = 2 if db.get("MultiAZ") else 1
        gib, kind = int(db["AllocatedStorage"]), db["DBInstanceClass"]
        az = "Multi-AZ" if copies == 2 else "single-AZ"
        yield Line("RDS Postgres", f"`{kind}`, {gib} GiB gp3, {az}",
                   copies * (_hourly(kind) * HOURS + gib * RDS_GP3_GB_MONTH), RDS)


def _cache(resources: dict[str, dict[str, Any]]) -> Iterable[Line]:
    for group in _of(resources, "AWS::ElastiCache::ReplicationGroup"):
        shards = int(group.get("NumNodeGroups", 1))
        per_shard = 1 + int(group.get("ReplicasPerNodeGroup", int(group.get("NumCacheClusters", 1)) - 1))
        kind = group["CacheNodeType"]
        nodes = shards * per_shard
        replicas = _plural(per_shard - 1, "replica")
        yield Line("ElastiCache", f"{nodes} x `{kind}` {group['Engine']} ({replicas} per shard)",
                   nodes * _hourly(kind) * HOURS, CACHE)


def _network(resources: dict[str, dict[str, Any]]) -> Iterable[Line]:
    nat, ips = len(_of(resources, "AWS::EC2::NatGateway")), len(_of(resources, "AWS::EC2::EIP"))
    if nat:
        yield Line("NAT gateway", f"{nat}, + $0.045 per GB through it", nat * NAT_HOURLY * HOURS, VPC)
    if ips:
        yield Line("Public IPv4", f"{_plural(ips, 'Elastic IP')} (the NAT gateways')",
                   ips * PUBLIC_IPV4_HOURLY * HOURS, VPC)
    for endpoint in _of(resources, "AWS::EC2::VPCEndpoint"):
        if endpoint.get("VpcEndpointType") == "Interface":
            azs = len(endpoint.get("SubnetIds", []))
            yield Line("Interface endpoint", f"SQS, in {azs} AZs (the MSK mappings' on-failure queue)",
                       azs * ENDPOINT_AZ_HOURLY * HOURS, LINK)


def _fargate(resources: dict[str, dict[str, Any]]) -> Iterable[Line]:
    tasks = {logical: r.get("Properties", {}) for logical, r in resources.items()
             if r["Type"] == "AWS::ECS::TaskDefinition"}
    for service in _of(resources, "AWS::ECS::Service"):
        task = tasks[service["TaskDefinition"]["Ref"]]
        n = int(service.get("DesiredCount", 1))
        providers = [s["CapacityProvider"] for s in service.get("CapacityProviderStrategy", [])]
        spot = providers == ["FARGATE_SPOT"]
        vcpu, gb, usd = _task_month(task, n, spot)
        yield Line("Fargate, bus workers", f"{_plural(n, 'task')} x {vcpu:g} vCPU / {gb:g} GB, always on"
                   + (", Spot (its price moves)" if spot else ""), usd, FARGATE)
    yield from _spares(resources, tasks)
    pools = len(tasks) - len(_of(resources, "AWS::ECS::Service"))
    if pools:
        yield Line("Fargate, RPC workers", f"{_plural(pools, 'pool')}: a task per running worker, "
                   "started per key (none idle)", 0.0, FARGATE)


def _task_month(task: dict[str, Any], n: int, spot: bool) -> tuple[float, float, float]:
    """A task definition's vCPU and GB, and ``n`` such tasks' month always on."""
    vcpu, gb = int(task["Cpu"]) / 1024, int(task["Memory"]) / 1024
    share = FARGATE_SPOT_SHARE if spot else 1.0
    return vcpu, gb, n * share * (vcpu * FARGATE_VCPU_HOURLY + gb * FARGATE_GB_HOURLY) * HOURS


def _spares(resources: dict[str, dict[str, Any]], tasks: dict[str, dict[str, Any]]) -> Iterable[Line]:
    """A pool's warm spares (``minSpares``, in its control plane's environment): tasks of the pool's
    size that run the whole month, on its capacity provider."""
    pools: dict[str, tuple[int, str]] = {}
    for fn in _of(resources, "AWS::Lambda::Function"):
        env = fn.get("Environment", {}).get("Variables", {})
        family, spares = env.get(ECS_TASK_DEFINITION.name), int(env.get(MIN_SPARES.name) or 0)
        if isinstance(family, str) and spares:
            pools[family] = (spares, env.get(ECS_CAPACITY_PROVIDER.name, "FARGATE"))
    for family, (n, provider) in sorted(pools.items()):
        task = next((t for t in tasks.values() if t.get("Family") == family), None)
        if task is None:
            continue
        spot = provider == "FARGATE_SPOT"
        vcpu, gb, usd = _task_month(task, n, spot)
        yield Line("Fargate, RPC spares", f"{_plural(n, 'spare')} of {family} x {vcpu:g} vCPU / {gb:g} GB, "
                   "always on (minSpares)" + (", Spot (its price moves)" if spot else ""), usd, FARGATE)


def _lambda(resources: dict[str, dict[str, Any]]) -> Iterable[Line]:
    functions = {logical: r.get("Properties", {}) for logical, r in resources.items()
                 if r["Type"] == "AWS::Lambda::Function"}
    gb, loops = 0.0, 0
    for schedule in _of(resources, "AWS::Scheduler::Schedule"):
        arn = schedule["Target"]["Arn"]
        target = arn["Fn::GetAtt"][0] if isinstance(arn, dict) and "Fn::GetAtt" in arn else ""
        fn = functions.get(target, {})
        if schedule.get("ScheduleExpression") == "rate(1 minute)" and int(fn.get("Timeout", 3)) > 60:
            loops += 1  # it loops until its time runs short; the next tick starts the next one
            gb += int(fn.get("MemorySize", 128)) / 1024
    if loops:
        yield Line("Lambda", f"{_plural(loops, 'loop')} running all month ({gb:g} GB), + the event-driven "
                   "handlers per use", gb * SECONDS * LAMBDA_GB_SECOND, LAMBDA)
    mappings = [m for m in _of(resources, "AWS::Lambda::EventSourceMapping")
                if "ProvisionedPollerConfig" in m]
    if mappings:
        pollers = sum(int(m["ProvisionedPollerConfig"].get("MinimumPollers", 1)) for m in mappings)
        yield Line("MSK event pollers", f"{_plural(len(mappings), 'mapping')} in provisioned mode: at most "
                   f"{pollers * HOURS:,} event poller unit-hours (not in the total: see the page)",
                   0.0, LAMBDA)


def _alarm_metrics(alarm: dict[str, Any]) -> int:
    """CloudWatch bills an alarm per metric it reads (a math expression: each metric in it)."""
    metrics = alarm.get("Metrics")
    return max(1, sum(1 for m in metrics if "MetricStat" in m)) if metrics else 1


def _monitoring(resources: dict[str, dict[str, Any]]) -> Iterable[Line]:
    alarms = _of(resources, "AWS::CloudWatch::Alarm")
    metrics = sum(_alarm_metrics(a) for a in alarms)
    boards = len(_of(resources, "AWS::CloudWatch::Dashboard"))
    yield Line("CloudWatch", f"{_plural(len(alarms), 'alarm')} ({metrics} metrics), "
               f"{_plural(boards, 'dashboard')}, + logs and metrics by volume",
               metrics * ALARM_METRIC + boards * DASHBOARD, WATCH)
    secrets, keys = len(_of(resources, "AWS::SecretsManager::Secret")), len(_of(resources, "AWS::KMS::Key"))
    yield Line("Secrets Manager, KMS", f"{_plural(secrets, 'secret')}, {_plural(keys, 'key')}",
               secrets * SECRET + keys * KMS_KEY, f"{SECRETS}, {KMS}")


def _per_use(resources: dict[str, dict[str, Any]]) -> Iterable[Line]:
    apis = len(_of(resources, "AWS::ApiGateway::RestApi"))
    if apis:
        yield Line("API Gateway", f"{_plural(apis, 'REST API')}: $3.50 per million requests", 0.0,
                   "aws.amazon.com/api-gateway/pricing")
    if _of(resources, "AWS::EMRServerless::Application"):
        yield Line("EMR Serverless", "idle application: vCPU- and GB-hours while jobs run", 0.0,
                   "aws.amazon.com/emr/pricing")


def monthly(resources: dict[str, dict[str, Any]]) -> list[Line]:
    """Every priced item of the template, the largest first (ties: by name)."""
    parts = (_broker, _msk, _rds, _cache, _network, _fargate, _lambda, _monitoring, _per_use)
    lines = [line for part in parts for line in part(resources)]
    return sorted(lines, key=lambda line: (-round(line.usd, 2), line.item))


def total(lines: Iterable[Line]) -> float:
    return sum(line.usd for line in lines)


def dollars(usd: float) -> str:
    """A monthly figure as the tables print it: whole dollars (cents under $10)."""
    return "per use" if usd == 0 else f"${usd:,.2f}" if usd < 10 else f"${usd:,.0f}"


def table(lines: list[Line]) -> list[str]:
    """A Markdown table of ``lines`` and their total."""
    rows = ["| item | runs | a month | price source |", "|---|---|---|---|"]
    rows += [f"| {line.item} | {line.runs} | {dollars(line.usd)} | {line.source} |" for line in lines]
    rows.append(f"| **total, idle** | | **{dollars(total(lines))}** | |")
    return rows


def as_json(lines: list[Line]) -> dict[str, Any]:
    return {"hours": HOURS, "total_usd": round(total(lines), 2),
            "lines": [{**asdict(line), "usd": round(line.usd, 2)} for line in lines]}
