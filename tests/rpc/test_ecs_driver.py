"""The ECS worker group driver against moto's ECS server (127.0.0.1:5000, started by ./dev) and Redis.

Each test makes its own cluster and pool, so concurrent runs never share tasks.

What moto's ECS does NOT reproduce (so these tests cannot check it; the driver is written for ECS):
- tasks are RUNNING the moment RunTask returns: no PROVISIONING/PENDING, no image pull, no
  placement failure (RunTask's ``failures`` list is always empty), and no task ever crashes;
- StopTask marks the task STOPPED at once: no SIGTERM, no ``stopTimeout``, no SIGKILL, so the
  two-stage stop is ECS's behaviour, not observable here;
- RunTask ignores ``clientToken`` (no idempotent retries) and ``capacityProviderStrategy`` weights;
- ListTasks applies ``desiredStatus`` only when given and returns STOPPED tasks otherwise (ECS
  defaults to RUNNING), which is why the driver also filters ``desiredStatus`` itself;
- no throttling, no eventual consistency between RunTask and ListTasks, no ``createdAt`` on tasks
  (scale-down order falls back to ListTasks order), no tag count or tag value validation;
- Fargate tasks need ``memory`` on every container and ``securityGroups`` in the network
  configuration (ECS accepts task-level memory alone); the subnet must exist in moto's EC2, in a
  VPC with DNS hostnames enabled (else RunTask answers HTTP 500).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
import redis

from switchyard.core.config import Connections
from switchyard.core.errors import ConfigError
from switchyard.core.redis_client import connect_redis
from switchyard.rpc.control.reconciler import Reconciler
from switchyard.rpc.drivers import DriverError, DriverSettings, WorkerGroup, driver_from_env
from switchyard.rpc.drivers.ecs import (
    DEFAULT_CAPACITY_PROVIDER,
    TAG_KEY,
    TAG_SPARE,
    EcsDriver,
    EcsSettings,
    ecs_client,
    key_from_tags,
    key_tags,
)
from switchyard.rpc.settings import Delays
from switchyard.rpc.spares import SpareRegistry
from switchyard.rpc.store import PoolState, WorkerGroupLock
from tests.conftest import unique
from tests.rpc.conftest import flush_pool_state
from tests.rpc.fakes import FakeQueues

MOTO = "http://127.0.0.1:5000"
AWKWARD_KEYS = ["infra=42", "", "ключ/🙂 with spaces", "x" * 3000, "a%2Fb\x00c"]


@pytest.fixture(scope="module")
def network() -> tuple[str, str]:
    """A subnet and a security group in moto's EC2 (its RunTask checks that the subnet exists)."""
    ec2 = boto3.client("ec2", endpoint_url=MOTO)
    vpc = ec2.create_vpc(CidrBlock="10.99.0.0/16")["Vpc"]["VpcId"]
    # moto's awsvpc RunTask fails (HTTP 500) in a VPC without DNS hostnames; ECS does not care.
    ec2.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.99.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName=unique("sy_ecs"), Description="test", VpcId=vpc)["GroupId"]
    return subnet, group


@pytest.fixture
def cluster() -> Iterator[str]:
    name = unique("sy_ecs")
    client = ecs_client(MOTO)
    client.create_cluster(clusterName=name)
    yield name
    arns = client.list_tasks(cluster=name, desiredStatus="RUNNING")["taskArns"]
    for arn in arns:
        client.stop_task(cluster=name, task=arn)
    client.delete_cluster(cluster=name)


@pytest.fixture
def pool() -> str:
    return register_pool(unique("ecspool"))


def register_pool(pool: str) -> str:
    """``pool``, its worker task definition registered in moto's ECS (as the deployment does)."""
    ecs_client(MOTO).register_task_definition(
        family=f"switchyard-worker-{pool}",
        requiresCompatibilities=["FARGATE"],
        networkMode="awsvpc",
        cpu="256",
        memory="512",
        containerDefinitions=[{"name": "worker", "image": "switchyard:test", "memory": 512,
                               "essential": True, "stopTimeout": 120}],
    )
    return pool


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(Connections().redis_url)
    yield client
    client.close()


def make_driver(cluster: str, redis_client: redis.Redis, network: tuple[str, str], max_tasks: int = 0,
                **kwargs: Any) -> EcsDriver:
    subnet, group = network
    settings = EcsSettings(cluster=cluster, subnets=(subnet,), security_groups=(group,), max_tasks=max_tasks)
    return EcsDriver(settings, lock=WorkerGroupLock(redis_client), client=ecs_client(MOTO), **kwargs)


def running_tasks(cluster: str, group: WorkerGroup) -> list[dict[str, Any]]:
    client = ecs_client(MOTO)
    arns = client.list_tasks(cluster=cluster, startedBy=group.group_id, desiredStatus="RUNNING")["taskArns"]
    if not arns:
        return []
    return client.describe_tasks(cluster=cluster, tasks=arns, include=["TAGS"])["tasks"]


def test_start_is_idempotent_and_tags_the_pool_and_key(cluster: str, pool: str,
                                                       redis_client: redis.Redis,
        network: tuple[str, str]) -> None:
    driver = make_driver(cluster, redis_client, network, min_workers=2, max_workers=3)
    group = WorkerGroup(pool, "infra=42")
    driver.start(group)
    driver.start(group)
    tasks = running_tasks(cluster, group)
    assert len(tasks) == 2 == driver.worker_count(group)
    for task in tasks:
        assert task["startedBy"] == group.group_id
        assert task["taskDefinitionArn"].rsplit("/", 1)[-1].startswith(f"switchyard-worker-{pool}:")
        assert key_from_tags(task["tags"]) == "infra=42"
        (override,) = task["overrides"]["containerOverrides"]
        env = {e["name"]: e["value"] for e in override["environment"]}
        assert env["WORKER_KEY"] == "infra=42"
        assert env["WORKER_POOL"] == pool
        assert env["WORKER_REQUESTS_QUEUE"] == group.requests_queue
    worker_ids = {e["value"] for t in tasks for e in t["overrides"]["containerOverrides"][0]["environment"]
                  if e["name"] == "WORKER_ID"}
    assert len(worker_ids) == 2  # each worker its own id


def test_list_running_reads_every_key_back_and_ignores_stopped_groups(cluster: str, pool: str,
                                                                      redis_client: redis.Redis,
        network: tuple[str, str]) -> None:
    driver = make_driver(cluster, redis_client, network)
    for key in AWKWARD_KEYS:
        driver.start(WorkerGroup(pool, key))
    assert driver.list_running(pool) == set(AWKWARD_KEYS)
    driver.stop(WorkerGroup(pool, AWKWARD_KEYS[0]))
    driver.stop(WorkerGroup(pool, AWKWARD_KEYS[0]))  # idempotent
    assert driver.list_running(pool) == set(AWKWARD_KEYS[1:])
    assert driver.worker_count(WorkerGroup(pool, AWKWARD_KEYS[0])) == 0
    assert driver.list_running(unique("otherpool")) == set()


def test_scale_follows_the_backlog_between_min_and_max(cluster: str, pool: str,
                                                       redis_client: redis.Redis,
        network: tuple[str, str]) -> None:
    driver = make_driver(cluster, redis_client, network, min_workers=1, max_workers=4, target_backlog=10)
    group = WorkerGroup(pool, "k")
    driver.start(group)
    first = {t["taskArn"] for t in running_tasks(cluster, group)}
    for backlog, wanted in [(25, 3), (1000, 4), (31, 4), (0, 1), (0, 1)]:
        assert driver.scale(group, backlog) == wanted
        assert driver.worker_count(group) == wanted
    # Scaling down keeps the oldest task (ECS order here: moto has no createdAt).
    assert {t["taskArn"] for t in running_tasks(cluster, group)} == first


def test_scale_answers_from_the_pass_listing_and_calls_ecs_only_to_change_a_size(
        cluster: str, pool: str, redis_client: redis.Redis, network: tuple[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    driver = make_driver(cluster, redis_client, network, min_workers=1, max_workers=4, target_backlog=10)
    groups = [WorkerGroup(pool, key) for key in ("a", "b", "c")]
    for group in groups:
        driver.start(group)
    assert driver.list_running(pool) == {"a", "b", "c"}
    calls: list[str] = []
    real_call = driver._call

    def counted(operation: str, **kwargs: Any) -> Any:
        calls.append(operation)
        return real_call(operation, **kwargs)

    monkeypatch.setattr(driver, "_call", counted)
    assert [driver.scale(group, 0) for group in groups] == [1, 1, 1]
    assert calls == []  # every group already has the one worker it wants: no ECS call at all
    assert driver.scale(groups[0], 25) == 3
    assert "run_task" in calls and driver.worker_count(groups[0]) == 3


def test_concurrent_starts_never_start_a_group_twice(cluster: str, pool: str,
                                                     redis_client: redis.Redis,
        network: tuple[str, str]) -> None:
    """Eight callers (each its own client, as separate Lambda environments) start one group at once."""
    group = WorkerGroup(pool, "hot")
    drivers = [make_driver(cluster, redis_client, network, min_workers=2, max_workers=2) for _ in range(8)]
    barrier = threading.Barrier(len(drivers))
    errors: list[BaseException] = []

    def start(driver: EcsDriver) -> None:
        barrier.wait()
        try:
            driver.start(group)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(d,)) for d in drivers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len(running_tasks(cluster, group)) == 2


def test_a_held_lock_makes_a_clear_driver_error(cluster: str, pool: str, redis_client: redis.Redis,
        network: tuple[str, str]) -> None:
    group = WorkerGroup(pool, "locked")
    slow = WorkerGroupLock(redis_client, ttl_s=5, wait_s=0.2)
    driver = EcsDriver(EcsSettings(cluster=cluster, subnets=(network[0],), security_groups=(network[1],)),
                       lock=slow, client=ecs_client(MOTO))
    with slow(group), pytest.raises(DriverError, match="locked by another caller"):
        driver.start(group)
    driver.start(group)  # released: goes through
    assert driver.worker_count(group) == 1


def test_ecs_failures_are_driver_errors_not_crashes(pool: str, redis_client: redis.Redis,
        network: tuple[str, str]) -> None:
    driver = make_driver(unique("no_such_cluster"), redis_client, network)
    group = WorkerGroup(pool, "k")
    for call in (lambda: driver.start(group), lambda: driver.stop(group),
                 lambda: driver.list_running(pool), lambda: driver.scale(group, 5)):
        with pytest.raises(DriverError, match=r"ECS \w+ failed"):
            call()


def test_unknown_task_definition_is_a_driver_error(cluster: str, redis_client: redis.Redis,
        network: tuple[str, str]) -> None:
    driver = make_driver(cluster, redis_client, network)
    with pytest.raises(DriverError, match="run_task failed"):
        driver.start(WorkerGroup(unique("nodef"), "k"))


def test_client_uses_the_standard_retry_mode() -> None:
    client = ecs_client(MOTO)
    assert client.meta.config.retries["mode"] == "standard"
    assert client.meta.config.retries["total_max_attempts"] >= 3


def test_key_tags_round_trip_and_refuse_keys_ecs_cannot_hold() -> None:
    for key in AWKWARD_KEYS:
        tags = key_tags(key)
        assert all(len(t["value"]) <= 256 for t in tags)
        assert all(set(t["value"]) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=")
                   for t in tags)
        assert key_from_tags(list(reversed(tags))) == key
    assert key_from_tags([{"key": f"{TAG_KEY}:1", "value": "eA=="}]) is None  # chunk 0 missing
    assert key_from_tags([]) is None
    with pytest.raises(DriverError, match="too long"):
        key_tags("x" * 20_000)


def test_driver_from_env_builds_the_ecs_driver(monkeypatch: pytest.MonkeyPatch, cluster: str, pool: str,
                                               network: tuple[str, str]) -> None:
    monkeypatch.setenv("SWITCHYARD_RPC_DRIVER", "ecs")
    monkeypatch.setenv("AWS_ENDPOINT_URL", MOTO)
    monkeypatch.setenv("SWITCHYARD_RPC_ECS_CLUSTER", cluster)
    monkeypatch.setenv("SWITCHYARD_RPC_ECS_SUBNETS", f"{network[0]}, {network[0]}")
    monkeypatch.setenv("SWITCHYARD_RPC_ECS_SECURITY_GROUPS", network[1])
    monkeypatch.setenv("SWITCHYARD_RPC_MAX_WORKERS", "2")
    driver = driver_from_env()
    assert isinstance(driver, EcsDriver)
    assert driver.settings.subnets == (network[0], network[0])
    assert driver.max_workers == 2
    driver.start(WorkerGroup(pool, "env"))
    assert driver.list_running(pool) == {"env"}
    monkeypatch.delenv("SWITCHYARD_RPC_ECS_SUBNETS")
    with pytest.raises(ConfigError, match="SWITCHYARD_RPC_ECS_SUBNETS"):
        driver_from_env(DriverSettings.from_env())


def test_the_capacity_provider_comes_from_the_environment_and_must_be_fargates(
        monkeypatch: pytest.MonkeyPatch, network: tuple[str, str]) -> None:
    monkeypatch.setenv("SWITCHYARD_RPC_DRIVER", "ecs")
    monkeypatch.setenv("AWS_ENDPOINT_URL", MOTO)
    monkeypatch.setenv("SWITCHYARD_RPC_ECS_CLUSTER", "any")
    monkeypatch.setenv("SWITCHYARD_RPC_ECS_SUBNETS", network[0])
    monkeypatch.setenv("SWITCHYARD_RPC_ECS_SECURITY_GROUPS", network[1])
    driver = driver_from_env()
    assert isinstance(driver, EcsDriver) and driver.settings.capacity_provider == DEFAULT_CAPACITY_PROVIDER
    monkeypatch.setenv("SWITCHYARD_RPC_ECS_CAPACITY_PROVIDER", "FARGATE_SPOT")
    driver = driver_from_env()
    assert isinstance(driver, EcsDriver) and driver.settings.capacity_provider == "FARGATE_SPOT"
    monkeypatch.setenv("SWITCHYARD_RPC_ECS_CAPACITY_PROVIDER", "EC2")
    with pytest.raises(ConfigError, match="PROVIDER must be one of FARGATE, FARGATE_SPOT, got 'EC2'"):
        driver_from_env()


def test_moto_is_the_ecs_under_test() -> None:
    """Guard: these tests must never reach a real account."""
    assert boto3.client("ecs", endpoint_url=MOTO, region_name="us-east-1").meta.endpoint_url == MOTO


# -- warm spares (issue 40) ----------------------------------------------------------------------
@pytest.fixture
def spares(pool: str) -> Iterator[SpareRegistry]:
    """The pool's spare registry on the tests' Redis (a cluster with SWITCHYARD_REDIS_CLUSTER=1)."""
    client = connect_redis(Connections.from_env())
    yield SpareRegistry(client, pool)
    flush_pool_state(client, pool)
    client.close()


def spare_tasks(cluster: str, pool: str) -> list[dict[str, Any]]:
    client = ecs_client(MOTO)
    arns = client.list_tasks(cluster=cluster, startedBy=f"{pool}-spares", desiredStatus="RUNNING")["taskArns"]
    if not arns:
        return []
    return client.describe_tasks(cluster=cluster, tasks=arns, include=["TAGS"])["tasks"]


def task_env(task: dict[str, Any]) -> dict[str, str]:
    (override,) = task["overrides"]["containerOverrides"]
    return {e["name"]: e["value"] for e in override["environment"]}


def register_all(cluster: str, pool: str, spares: SpareRegistry) -> list[str]:
    """What each spare task's worker does once ready (moto runs no container): register."""
    worker_ids = [task_env(task)["WORKER_ID"] for task in spare_tasks(cluster, pool)]
    for worker_id in worker_ids:
        spares.register(worker_id)
    return worker_ids


def one_pass(driver: EcsDriver, pool: str, *active: str) -> int:
    """One real reconciler pass over a pool whose ``active`` keys were just seen (queues faked: no
    broker); the spares it started."""
    state = PoolState(connect_redis(Connections.from_env()), pool)
    state.mark_initialized()
    if active:
        state.touch(active)
    outcome = Reconciler(state, FakeQueues(pool), driver, Delays()).run_pass()  # type: ignore[arg-type]
    assert outcome.driver_errors == 0
    return outcome.spares_started


def test_a_reconciler_pass_tops_spares_up_and_the_next_pass_launches_nothing(
        cluster: str, pool: str, redis_client: redis.Redis, network: tuple[str, str],
        spares: SpareRegistry) -> None:
    driver = make_driver(cluster, redis_client, network, min_spares=2, spares=spares)
    assert one_pass(driver, pool) == 2
    assert one_pass(driver, pool) == 0  # started, not registered yet: counted all the same
    tasks = spare_tasks(cluster, pool)
    assert len(tasks) == 2
    for task in tasks:
        env = task_env(task)
        assert env["WORKER_SPARE"] == "1" and env["WORKER_POOL"] == pool and "WORKER_KEY" not in env
        assert {t["key"]: t["value"] for t in task["tags"]}[TAG_SPARE] == env["WORKER_ID"]
        assert key_from_tags(task["tags"]) is None
    register_all(cluster, pool, spares)
    assert one_pass(driver, pool) == 0  # registered now: still the same two
    assert driver.list_running(pool) == set()  # spares are no group


def test_a_start_claims_a_registered_spare_and_runs_no_task(
        cluster: str, pool: str, redis_client: redis.Redis, network: tuple[str, str],
        spares: SpareRegistry) -> None:
    driver = make_driver(cluster, redis_client, network, min_spares=1, spares=spares)
    driver.keep_spares(pool)
    (worker_id,) = register_all(cluster, pool, spares)
    group = WorkerGroup(pool, "ключ/🙂 adopted")
    driver.start(group)
    assert running_tasks(cluster, group) == []  # no RunTask for the group
    assert spares.wait(worker_id, 0.5) == group.key  # the spare was handed the key
    (adopted,) = [t for t in spare_tasks(cluster, pool) if key_from_tags(t["tags"]) == group.key]
    assert task_env(adopted)["WORKER_ID"] == worker_id
    assert driver.list_running(pool) == {group.key}
    assert driver.worker_count(group) == 1
    driver.start(group)  # idempotent: the adopted task is the group's
    assert running_tasks(cluster, group) == [] and driver.worker_count(group) == 1
    assert one_pass(driver, pool, group.key) == 1  # the claimed spare replaced, the group kept
    assert len(spare_tasks(cluster, pool)) == 2
    driver.stop(group)
    assert driver.worker_count(group) == 0 and driver.list_running(pool) == set()


def test_with_no_spare_ready_a_start_runs_a_task_as_without_spares(
        cluster: str, pool: str, redis_client: redis.Redis, network: tuple[str, str],
        spares: SpareRegistry) -> None:
    driver = make_driver(cluster, redis_client, network, min_spares=1, spares=spares)
    driver.keep_spares(pool)  # started, never registered: not claimable
    group = WorkerGroup(pool, "k")
    driver.start(group)
    assert len(running_tasks(cluster, group)) == 1
    (spare,) = spare_tasks(cluster, pool)
    assert key_from_tags(spare["tags"]) is None  # still waiting for a key


def test_the_pool_task_limit_caps_spares(cluster: str, pool: str, redis_client: redis.Redis,
                                         network: tuple[str, str], spares: SpareRegistry) -> None:
    driver = make_driver(cluster, redis_client, network, max_tasks=3, min_workers=2, max_workers=2,
                         min_spares=3, spares=spares)
    driver.start(WorkerGroup(pool, "k"))  # two tasks
    assert driver.keep_spares(pool) == 1
    assert driver.keep_spares(pool) == 0
    assert len(spare_tasks(cluster, pool)) == 1


def test_a_registered_spare_whose_task_stopped_is_forgotten_and_replaced(
        cluster: str, pool: str, redis_client: redis.Redis, network: tuple[str, str],
        spares: SpareRegistry) -> None:
    driver = make_driver(cluster, redis_client, network, min_spares=1, spares=spares)
    driver.keep_spares(pool)
    (worker_id,) = register_all(cluster, pool, spares)
    (task,) = spare_tasks(cluster, pool)
    ecs_client(MOTO).stop_task(cluster=cluster, task=task["taskArn"])  # a Spot interruption
    assert driver.keep_spares(pool) == 1
    assert worker_id not in spares.waiting()
    group = WorkerGroup(pool, "k")
    driver.start(group)  # the new spare is not ready: a task, never the dead spare
    assert len(running_tasks(cluster, group)) == 1
    assert spares.wait(worker_id, 0.1) is None
