"""Per-role broker users in the template: each process reads only its own role's secret.

The Amazon MQ admin secret is the pools custom resource's alone (it makes the users); every other
function, the ECS workers, the event source mappings, the EMR job and the deployed configuration
name the secret of their own role (switchyard/rpc/control/access.py). The users' broker permissions are
checked on a real RabbitMQ in tests/rpc/test_broker_users.py.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from stacks import constants
from stacks.broker import BrokerSettings
from switchyard.rpc.control.access import BrokerRole, BrokerUser, deployment_users
from switchyard.rpc.protocol import DEAD_LETTER_PROBE_VHOST
from tests.stacks.conftest import synth

Resources = dict[str, dict[str, Any]]
POOL_FUNCTION_ROLES = {"rpc_orphans": BrokerRole.ORPHANS, "rpc_dead_letters": BrokerRole.DEAD_LETTERS,
                       "rpc_activity": BrokerRole.ACTIVITY, "rpc_reconcile": BrokerRole.RECONCILE}


def _of_kind(resources: Resources, kind: str) -> Resources:
    return {k: v for k, v in resources.items() if v["Type"] == kind}


def _refs(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        if "Ref" in value:
            yield value["Ref"]
        for item in value.values():
            yield from _refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _refs(item)


def _secret(resources: Resources, logical: str) -> str | None:
    """The secret a reference names (an attachment stands for its secret), or None."""
    kind = resources.get(logical, {}).get("Type")
    if kind == "AWS::SecretsManager::SecretTargetAttachment":
        return resources[logical]["Properties"]["SecretId"]["Ref"]
    return logical if kind == "AWS::SecretsManager::Secret" else None


def _secrets_in(resources: Resources, value: Any) -> set[str]:
    return {s for r in _refs(value) if (s := _secret(resources, r)) is not None}


def _named(resources: Resources, value: Any) -> set[str]:
    """The secrets an ARN pattern (``...:secret:{prefix}*``, joined around pseudo parameters) names."""
    parts = value.get("Fn::Join", ["", []])[1] if isinstance(value, dict) else [value]
    tail = parts[-1] if parts and isinstance(parts[-1], str) else ""
    if ":secret:" not in tail:
        return set()
    pattern = tail.rsplit(":secret:", 1)[1]
    return {logical for logical, secret in _of_kind(resources, "AWS::SecretsManager::Secret").items()
            if fnmatch.fnmatchcase(secret["Properties"].get("Name", ""), pattern)}


def _role_reads(resources: Resources, role: str) -> set[str]:
    """The secrets the role may GetSecretValue (its inline policies), by reference or name pattern."""
    found: set[str] = set()
    for policy in _of_kind(resources, "AWS::IAM::Policy").values():
        if role not in _refs(policy["Properties"]["Roles"]):
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if "secretsmanager:GetSecretValue" in actions:
                found |= _secrets_in(resources, statement["Resource"])
                listed = statement["Resource"]
                for value in listed if isinstance(listed, list) else [listed]:
                    found |= _named(resources, value)
    return found


@pytest.fixture(scope="module")
def admin(resources: Resources) -> str:
    (broker,) = _of_kind(resources, "AWS::AmazonMQ::Broker").values()
    (secret,) = _secrets_in(resources, broker["Properties"]["Users"])
    return secret


@pytest.fixture(scope="module")
def user_secrets(resources: Resources) -> dict[BrokerUser, str]:
    """The pools custom resource's ``Users``: each role's user and its secret."""
    (pools,) = _of_kind(resources, "Custom::SwitchyardPools").values()
    users = pools["Properties"].get("Users")
    assert users, "the pools custom resource makes no broker users: every process uses the admin"
    return {BrokerUser(BrokerRole(u["Role"]), u["Pool"] or None, u.get("Application") or None):
            u["SecretArn"]["Ref"] for u in users}


def _pools(resources: Resources) -> list[str]:
    (pools,) = _of_kind(resources, "Custom::SwitchyardPools").values()
    return pools["Properties"]["Pools"]


def _functions(resources: Resources) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """``(module, role logical id, environment)`` of each Lambda function."""
    for fn in _of_kind(resources, "AWS::Lambda::Function").values():
        props = fn["Properties"]
        yield (props["Handler"].rsplit(".", 1)[0], props["Role"]["Fn::GetAtt"][0],
               props.get("Environment", {}).get("Variables", {}))


def test_each_role_has_a_user_with_a_secret_of_its_own(resources: Resources, admin: str,
                                                         user_secrets: dict[BrokerUser, str]) -> None:
    assert set(user_secrets) == set(deployment_users(_pools(resources)))
    assert len(set(user_secrets.values())) == len(user_secrets)
    assert admin not in user_secrets.values()
    for user, secret in user_secrets.items():
        template = resources[secret]["Properties"]["GenerateSecretString"]["SecretStringTemplate"]
        assert json.loads(template) == {"username": user.username}


def test_no_process_but_the_pools_resource_reads_the_admin_secret(resources: Resources, admin: str) -> None:
    readers = {r for r in _of_kind(resources, "AWS::IAM::Role") if admin in _role_reads(resources, r)}
    pools_roles = {role for module, role, _ in _functions(resources) if module == "deploy_pools"}
    assert readers == pools_roles, f"roles that may read the broker admin secret: {sorted(readers)}"
    for task in _of_kind(resources, "AWS::ECS::TaskDefinition").values():
        assert admin not in _secrets_in(resources, task["Properties"]["ContainerDefinitions"])
    for name, parameter in _of_kind(resources, "AWS::SSM::Parameter").items():
        assert admin not in _secrets_in(resources, parameter["Properties"]["Value"]), name


def test_the_pools_resource_reads_the_admin_and_every_user_secret(
        resources: Resources, admin: str, user_secrets: dict[BrokerUser, str]) -> None:
    (role,) = {role for module, role, _ in _functions(resources) if module == "deploy_pools"}
    env = next(env for module, _, env in _functions(resources) if module == "deploy_pools")
    assert _secrets_in(resources, env["SWITCHYARD_AMQP_SECRET_ARN"]) == {admin}
    assert _role_reads(resources, role) == {admin, *user_secrets.values()}


def test_each_pool_function_reads_its_own_role_secret(resources: Resources,
                                                       user_secrets: dict[BrokerUser, str]) -> None:
    broker_secrets = set(user_secrets.values())
    mapped = {m["Properties"]["FunctionName"]["Ref"] for m in
              _of_kind(resources, "AWS::Lambda::EventSourceMapping").values()
              if "Queues" in m["Properties"]}
    roles_with_mapping = {resources[fn]["Properties"]["Role"]["Fn::GetAtt"][0] for fn in mapped}
    seen = 0
    for module, role, env in _functions(resources):
        if module not in POOL_FUNCTION_ROLES:
            continue
        seen += 1
        pool = env["SWITCHYARD_RPC_POOL"]
        own = user_secrets[BrokerUser(POOL_FUNCTION_ROLES[module], pool)]
        assert _secrets_in(resources, env["SWITCHYARD_AMQP_SECRET_ARN"]) == {own}, module
        # A function with an event source mapping also lets its pollers read the mappings' secret; the
        # reconciler runs the dead-lettering probe as the probe's user (the one policymaker).
        expected = {own} | ({user_secrets[BrokerUser(BrokerRole.MAPPINGS, pool)]}
                            if role in roles_with_mapping else set())
        if module == "rpc_reconcile":
            probe = user_secrets[BrokerUser(BrokerRole.PROBE)]
            assert _secrets_in(resources, env["SWITCHYARD_RPC_DEAD_LETTER_PROBE_SECRET_ARN"]) == {probe}
            assert env["SWITCHYARD_RPC_DEAD_LETTER_PROBE_VHOST"] == DEAD_LETTER_PROBE_VHOST
            expected.add(probe)
        assert _role_reads(resources, role) & broker_secrets == expected, (module, pool)
    assert seen == 4 * len(_pools(resources))


def test_event_source_mappings_log_in_as_the_mappings_user(resources: Resources,
                                                            user_secrets: dict[BrokerUser, str]) -> None:
    mappings = [m["Properties"] for m in _of_kind(resources, "AWS::Lambda::EventSourceMapping").values()
                if "Queues" in m["Properties"]]
    assert mappings
    for props in mappings:
        (queue,) = props["Queues"]
        pool = queue.rsplit("-", 1)[0]
        (auth,) = [c for c in props["SourceAccessConfigurations"] if c["Type"] == "BASIC_AUTH"]
        assert _secrets_in(resources, auth["URI"]) == {user_secrets[BrokerUser(BrokerRole.MAPPINGS, pool)]}


def test_workers_get_their_pool_worker_secret_only(resources: Resources,
                                                    user_secrets: dict[BrokerUser, str]) -> None:
    broker_secrets = set(user_secrets.values())
    tasks = [t for t in _of_kind(resources, "AWS::ECS::TaskDefinition").values()
             if any(e["Name"] == "WORKER_POOL" for c in t["Properties"]["ContainerDefinitions"]
                    for e in c.get("Environment", []))]
    assert tasks
    for task in tasks:
        (container,) = task["Properties"]["ContainerDefinitions"]
        pool = next(e["Value"] for e in container["Environment"] if e["Name"] == "WORKER_POOL")
        own = user_secrets[BrokerUser(BrokerRole.WORKERS, pool)]
        injected = {s["Name"]: s["ValueFrom"] for s in container["Secrets"]}
        for name in ("SWITCHYARD_AMQP_USERNAME", "SWITCHYARD_AMQP_PASSWORD"):
            assert _secrets_in(resources, injected[name]) == {own}, (pool, name)
        execution = task["Properties"]["ExecutionRoleArn"]["Fn::GetAtt"][0]
        task_role = task["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0]
        assert _role_reads(resources, execution) & broker_secrets == {own}
        assert not _role_reads(resources, task_role) & broker_secrets


def test_the_emr_job_and_the_deployed_configuration_name_the_clients_secret(
        resources: Resources, user_secrets: dict[BrokerUser, str]) -> None:
    clients = user_secrets[BrokerUser(BrokerRole.CLIENTS)]
    (job_role,) = [k for k, v in _of_kind(resources, "AWS::IAM::Role").items()
                   if "emr-serverless" in json.dumps(v["Properties"]["AssumeRolePolicyDocument"])]
    assert _role_reads(resources, job_role) == {clients}
    (parameter,) = [p["Properties"]["Value"] for p in _of_kind(resources, "AWS::SSM::Parameter").values()
                    if "/SWITCHYARD_AMQP_SECRET_ARN" in json.dumps(p["Properties"]["Name"])]
    assert _secrets_in(resources, parameter) == {clients}


def test_each_application_named_gets_a_clients_user_of_its_own(
        layer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """``switchyard:brokerApplications``: a secret and a user each, limited to its own reply queues."""
    template, _, _ = synth(layer_dir, tmp_path_factory.mktemp("cdk.out.apps"),
                           **{constants.CTX_BROKER_APPLICATIONS: "billing,etl"})
    resources = template.to_json()["Resources"]
    (pools,) = _of_kind(resources, "Custom::SwitchyardPools").values()
    apps = {u["Application"]: u["SecretArn"]["Ref"] for u in pools["Properties"]["Users"] if u["Application"]}
    assert set(apps) == {"billing", "etl"}
    for application, secret in apps.items():
        template_json = resources[secret]["Properties"]["GenerateSecretString"]["SecretStringTemplate"]
        assert json.loads(template_json) == {"username": f"switchyard-clients-{application}"}
    with pytest.raises(ValueError, match="invalid application name"):
        BrokerSettings(applications=("no-dashes",))
