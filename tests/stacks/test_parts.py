"""``switchyard:parts`` and ``switchyard:size`` (issue 37): each variant's template holds its chosen
parts' resources and nothing of the others (services, functions, alarms, parameters, custom
resources, outputs), every alarm reads a metric a chosen part emits, a part without what it needs
fails synth in one line, and the sizes pick what docs/deployment.md says they do."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App
from aws_cdk.assertions import Template

from stacks import constants
from stacks.application import build_app
from stacks.broker import BrokerSettings
from stacks.config import ConfigError, DeploymentConfig
from stacks.names import alarm_prefix
from switchyard.core.deployed_config import metrics_namespace
from tests.stacks.conftest import VARIANTS, synth
from tests.stacks.test_alarm_metrics_emitted import PARTS as EMITTING
from tests.stacks.test_alarm_metrics_emitted import _metrics

ALL = frozenset(constants.PARTS)
REDIS = frozenset({"rpc", "pending", "bus"})
# What a resource belongs to: a kind of resource, a function's handler module (by prefix), a parameter
# or output (by name prefix), an alarm (by its spec name's prefix); "any of" the parts in each set.
KINDS = {"AWS::AmazonMQ::Broker": {"rpc"}, "Custom::SwitchyardPools": {"rpc"},
         "AWS::MSK::Cluster": {"delay"}, "AWS::RDS::DBInstance": {"delay"}, "AWS::SQS::Queue": {"delay"},
         "Custom::SwitchyardDelaySchema": {"delay"}, "Custom::SwitchyardTopics": {"delay"},
         "AWS::EMRServerless::Application": {"spark"}, "AWS::ElastiCache::ReplicationGroup": REDIS,
         "AWS::ECS::Cluster": {"rpc", "bus"}, "AWS::ECS::Service": {"bus"},
         "AWS::ApiGateway::RestApi": {"pending", "bus"}}
HANDLERS = {"rpc_scheduled": {"rpc+delay"}, "rpc_": {"rpc"}, "deploy_pools": {"rpc"}, "delay_": {"delay"},
            "deploy_delay_schema": {"delay"}, "deploy_topics": {"delay"}, "bus_": {"bus"},
            "pending_": {"pending"}}
PARAMETERS = {"SWITCHYARD_AMQP_": {"rpc"}, "SWITCHYARD_MANAGEMENT_": {"rpc"}, "SWITCHYARD_RPC_": {"rpc"},
              "SWITCHYARD_REDIS_": REDIS, "SWITCHYARD_POSTGRES_": {"delay"}, "SWITCHYARD_KAFKA_": {"delay"},
              "SWITCHYARD_DELAY_": {"delay"}}
OUTPUTS = {"Broker": {"rpc"}, "Kafka": {"delay"}, "Postgres": {"delay"}, "EcsCluster": {"rpc", "bus"},
           "Pipeline": {"spark"}, "Bus": {"bus"}, "Pending": {"pending"}}
ALARMS = {"scheduled-": {"rpc+delay"}, "delay-": {"delay"}, "postgres-": {"delay"}, "msk-": {"delay"},
          "kafka-": {"delay"}, "rabbitmq-": {"rpc"}, "core-": {"rpc"}, "elasticache-": REDIS, "bus-": {"bus"},
          "pending-": {"pending"}}
# AWS's own metrics, by namespace: the part whose service publishes them.
NAMESPACES = {"AWS/AmazonMQ": {"rpc"}, "AWS/Kafka": {"delay"}, "AWS/RDS": {"delay"}, "AWS/SQS": {"delay"},
              "AWS/ElastiCache": REDIS, "AWS/Lambda": ALL}


def chosen(variant: str) -> frozenset[str]:
    return frozenset(VARIANTS[variant].get(constants.CTX_PARTS, constants.PARTS))


def _allowed(owners: set[str] | frozenset[str], parts: frozenset[str]) -> bool:
    """Whether a thing owned by any of ``owners`` may be in a stack of ``parts`` ("a+b": both)."""
    return any(set(owner.split("+")) <= parts for owner in owners)


def _owner(table: dict[str, Any], name: str) -> Any:
    return next((owners for prefix, owners in table.items() if name.startswith(prefix)), None)


def _things(body: dict[str, Any], alarm_prefix: str) -> Iterator[tuple[str, Any]]:
    """Each resource, function, parameter, output and alarm of ``body`` with the parts that own it."""
    for logical, resource in body["Resources"].items():
        props = resource.get("Properties", {})
        if resource["Type"] in KINDS:
            yield logical, KINDS[resource["Type"]]
        if resource["Type"] == "AWS::Lambda::Function":
            yield f"function {logical}", _owner(HANDLERS, str(props.get("Handler", "")))
        if resource["Type"] == "AWS::SSM::Parameter":
            yield f"parameter {props['Name']}", _owner(PARAMETERS, str(props["Name"]).rsplit("/", 1)[-1])
        if resource["Type"] == "AWS::CloudWatch::Alarm":
            spec = str(props["AlarmName"]).removeprefix(alarm_prefix)
            yield f"alarm {props['AlarmName']}", _owner(ALARMS, spec)
    for name in body.get("Outputs", {}):
        yield f"output {name}", _owner(OUTPUTS, name)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_variant_holds_its_parts_and_nothing_of_the_others(
        variant: str, variants: Callable[[str], tuple[Template, Path, Any]]) -> None:
    template, _, stack = variants(variant)
    parts, body = chosen(variant), template.to_json()
    found = list(_things(body, alarm_prefix(stack)))
    foreign = [what for what, owners in found if owners is not None and not _allowed(owners, parts)]
    assert foreign == [], f"{variant} ({sorted(parts)}) holds what no chosen part needs: {foreign}"
    kinds = {resource["Type"] for resource in body["Resources"].values()}
    missing = [kind for kind, owners in KINDS.items() if _allowed(owners, parts) and kind not in kinds]
    assert missing == [], f"{variant} lacks {missing}"  # and each chosen part's resources are there


def test_the_check_finds_each_foreign_part(template: Template, synthesized: Any) -> None:
    """Read as if only rpc were chosen, the full template holds each other part's services,
    functions, parameters, alarms and outputs: the check above can fail on each kind."""
    body = template.to_json()
    found = list(_things(body, alarm_prefix(synthesized[2])))
    rpc = frozenset({"rpc"})
    foreign = {what for what, owners in found if owners is not None and not _allowed(owners, rpc)}
    kinds = {body["Resources"][what]["Type"] for what in foreign if what in body["Resources"]}
    assert kinds >= {"AWS::MSK::Cluster", "AWS::RDS::DBInstance", "AWS::EMRServerless::Application",
                     "AWS::ApiGateway::RestApi", "AWS::ECS::Service"}, kinds
    assert {what.split(" ")[0] for what in foreign} >= {"function", "parameter", "alarm", "output"}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_alarm_reads_a_metric_a_chosen_part_emits(
        variant: str, variants: Callable[[str], tuple[Template, Path, Any]]) -> None:
    template, _, stack = variants(variant)
    parts = chosen(variant)
    emitted = frozenset().union(*(m.EMITTED for name, m in EMITTING.items() if name in parts))
    own = metrics_namespace(stack.stack_name)
    wrong = []
    for logical, resource in template.to_json()["Resources"].items():
        if resource["Type"] != "AWS::CloudWatch::Alarm":
            continue
        for namespace, name in _metrics(resource["Properties"]):
            ok = name in emitted if namespace == own else _allowed(NAMESPACES.get(namespace, set()), parts)
            if not ok:
                wrong.append(f"{logical}: {namespace} {name}")
    assert wrong == [], f"{variant}: alarms on metrics no chosen part emits: {wrong}"


@pytest.mark.parametrize(("parts", "says"), [
    (["spark"], "switchyard:parts: spark needs delay and rpc"),
    (["spark", "rpc"], "add delay, or leave spark out"),
    (["rpc", "kafka"], "unknown part(s) ['kafka']"),
    ("[]", "must be a list of parts"),
])
def test_a_part_without_what_it_needs_fails_synth_in_one_line(parts: Any, says: str) -> None:
    with pytest.raises(ConfigError) as raised:
        build_app(context={constants.CTX_PARTS: parts})
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_an_unknown_size_fails_synth() -> None:
    with pytest.raises(ConfigError, match=r"switchyard:size must be one of \['dev', 'production'\]"):
        build_app(context={constants.CTX_SIZE: "large"})


def _one(body: dict[str, Any], kind: str) -> dict[str, Any]:
    (props,) = [r["Properties"] for r in body["Resources"].values() if r["Type"] == kind]
    return props


def test_dev_is_the_smallest_of_each_service(variants: Callable[[str], tuple[Template, Path, Any]]) -> None:
    body = variants("all-dev")[0].to_json()
    broker, db = _one(body, "AWS::AmazonMQ::Broker"), _one(body, "AWS::RDS::DBInstance")
    assert (broker["HostInstanceType"], broker["DeploymentMode"], broker["EngineVersion"]) == (
        "mq.t3.micro", "SINGLE_INSTANCE", "3.13")
    assert (db["DBInstanceClass"], db["MultiAZ"], db["DeletionProtection"]) == ("db.t4g.micro", False, False)
    cache = _one(body, "AWS::ElastiCache::ReplicationGroup")
    assert (cache["CacheNodeType"], cache["NumCacheClusters"]) == ("cache.t4g.micro", 1)
    assert len([r for r in body["Resources"].values() if r["Type"] == "AWS::EC2::NatGateway"]) == 1
    service = _one(body, "AWS::ECS::Service")
    assert service["DesiredCount"] == 1
    assert service["CapacityProviderStrategy"] == [{"CapacityProvider": "FARGATE_SPOT", "Weight": 1}]


def test_production_is_what_the_docs_recommend(variants: Callable[[str], tuple[Template, Path, Any]]) -> None:
    body = variants("all-production")[0].to_json()
    assert _one(body, "AWS::AmazonMQ::Broker")["DeploymentMode"] == "CLUSTER_MULTI_AZ"
    db = _one(body, "AWS::RDS::DBInstance")
    assert db["MultiAZ"] is True and db["DeletionProtection"] is True
    kept = ("AWS::RDS::DBInstance", "AWS::ElastiCache::ReplicationGroup")
    assert [r["DeletionPolicy"] for r in body["Resources"].values() if r["Type"] in kept] == ["Snapshot"] * 2
    cache = _one(body, "AWS::ElastiCache::ReplicationGroup")
    assert cache["NumCacheClusters"] == 2 and cache["AutomaticFailoverEnabled"] is True
    assert len([r for r in body["Resources"].values() if r["Type"] == "AWS::EC2::NatGateway"]) == 2
    assert _one(body, "AWS::MSK::Cluster")["BrokerNodeGroupInfo"]["InstanceType"] == "kafka.m7g.large"


def test_an_explicit_key_wins_over_the_size() -> None:
    """The size gives each key's default: a key set on the command line (or in cdk.json) keeps its
    value, and a JSON object's other fields still come from the size."""
    scope = App(context={constants.CTX_SIZE: "dev", constants.CTX_NAT_GATEWAYS: "2",
                         constants.CTX_POSTGRES: '{"multiAz": true}',
                         constants.CTX_BROKER_INSTANCE_TYPE: "mq.m7g.large",
                         constants.CTX_BROKER_ENGINE_VERSION: "4.2"})
    config = DeploymentConfig.from_context(scope)
    assert config.nat_gateways == 2 and config.postgres.multi_az is True
    assert config.postgres.instance_type == "t4g.micro"  # the size's, beside the explicit field
    assert config.bus.workers == 1 and config.pools[0].capacity_provider == "FARGATE_SPOT"
    broker = BrokerSettings.from_context(scope)
    assert (broker.instance_type, broker.engine_version, broker.deployment_mode) == (
        "mq.m7g.large", "4.2", "SINGLE_INSTANCE")


@pytest.mark.parametrize("parts", [["rpc"], ["delay"], ["bus"]])
def test_the_localstack_target_follows_the_parts(parts: list[str], layer_dir: str,
                                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    """The LocalStack target (what a local deployment reads) holds the chosen parts' settings and
    alarms only: an RPC-only stack names no Postgres or Kafka, a delay-only one no broker or Redis."""
    local = {constants.CTX_TARGET: constants.TARGET_LOCALSTACK, constants.CTX_PARTS: parts}
    template, _, stack = synth(layer_dir, tmp_path_factory.mktemp("cdk.out.local-parts"), **local)
    found = [(what, owners) for what, owners in _things(template.to_json(), alarm_prefix(stack))
             if what.startswith(("parameter", "alarm"))]
    chosen_parts = frozenset(parts)
    assert [what for what, owners in found if owners is not None and not _allowed(owners, chosen_parts)] == []
    assert any(owners is not None for _, owners in found)  # the part's own settings and alarms are there


def test_the_bus_workers_on_spot_start_after_the_cluster_associates_it(
        variants: Callable[[str], tuple[Template, Path, Any]]) -> None:
    """ECS refuses a service whose strategy names a provider the cluster has not associated yet."""
    resources = variants("bus-dev")[0].to_json()["Resources"]
    kind = "AWS::ECS::ClusterCapacityProviderAssociations"
    (association,) = [k for k, r in resources.items() if r["Type"] == kind]
    (service,) = [r for r in resources.values() if r["Type"] == "AWS::ECS::Service"]
    assert association in service.get("DependsOn", [])
