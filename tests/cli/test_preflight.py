"""A command whose service is down fails in about a second, naming the setting (issue 25, item 4)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from switchyard.cli.preflight import SERVICES, ServiceUnreachableError, addresses, require, unavailable
from switchyard.core.config import Connections
from tests.conftest import subprocess_env

CLOSED = "127.0.0.1:1"


def run(*args: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "switchyard", *args], capture_output=True, text=True,
                            env=subprocess_env(**env), timeout=30)
    return result, time.monotonic() - started


@pytest.mark.parametrize(("argv", "env", "variable", "label"), [
    (("pending", "status"), {"SWITCHYARD_REDIS_URL": f"redis://:hunter2@{CLOSED}/0"},
     "SWITCHYARD_REDIS_URL", "Redis"),
    (("delay", "send"), {"SWITCHYARD_KAFKA_BOOTSTRAP": CLOSED}, "SWITCHYARD_KAFKA_BOOTSTRAP", "Kafka"),
    (("bus", "status"), {"SWITCHYARD_REDIS_URL": f"redis://:hunter2@{CLOSED}/0"},
     "SWITCHYARD_REDIS_URL", "Redis"),
    (("delay", "status"), {"SWITCHYARD_POSTGRES_DSN": f"postgresql://postgres:hunter2@{CLOSED}/switchyard"},
     "SWITCHYARD_POSTGRES_DSN", "Postgres"),
    (("call", "--pool", "p", "--key", "k"), {"SWITCHYARD_AMQP_URL": f"amqp://guest:hunter2@{CLOSED}/%2F"},
     "SWITCHYARD_AMQP_URL", "RabbitMQ"),
])
def test_a_closed_service_fails_fast_in_one_line(argv, env, variable, label) -> None:
    result, elapsed = run(*argv, **env)
    assert result.returncode == 1
    assert result.stderr == (f"switchyard: error: cannot reach {label} at {CLOSED} ({variable}): connection "
                             f"refused; start {label} there, or set {variable} to where it runs "
                             "(in a Switchyard checkout: ./dev services)\n")
    assert elapsed < 3.0
    assert "hunter2" not in result.stderr


def test_addresses_print_host_and_port_only() -> None:
    redis, amqp, pg, kafka, mgmt = (SERVICES[n] for n in ("redis", "amqp", "postgres", "kafka", "management"))
    assert addresses(redis, "redis://:p@ss@cache.local/0") == [("cache.local", 6379)]
    assert addresses(redis, "rediss://user:{password}@cache:6380/0") == [("cache", 6380)]
    assert addresses(redis, "unix:///run/redis.sock") == []
    assert addresses(amqp, "amqps://u:{password}@mq.example.com/%2F") == [("mq.example.com", 5671)]
    assert addresses(amqp, "amqp://guest:guest@[::1]:5673/%2F") == [("::1", 5673)]
    assert addresses(pg, "postgresql://a:b@db1:5433,db2/x") == [("db1", 5433), ("db2", 5432)]
    assert addresses(pg, "host=db port=6543 dbname=x password=secret") == [("db", 6543)]
    assert addresses(pg, "postgresql:///switchyard?host=/var/run/postgresql") == []
    assert addresses(kafka, "b-1.msk:9098, b-2.msk:9098") == [("b-1.msk", 9098), ("b-2.msk", 9098)]
    assert addresses(mgmt, "https://guest:x@mq.example.com") == [("mq.example.com", 443)]


def test_require_passes_when_one_address_answers() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        require("kafka", connections=Connections(kafka_bootstrap=f"{CLOSED},127.0.0.1:{port}"))
        require("redis", connections=Connections(redis_url=f"redis://:pw@127.0.0.1:{port}/0"))
    closed_two = r"^cannot reach Kafka at 127\.0\.0\.1:1, 127\.0\.0\.1:2 \("
    with pytest.raises(ServiceUnreachableError, match=closed_two):
        require("kafka", connections=Connections(kafka_bootstrap=f"{CLOSED},127.0.0.1:2"))


def test_a_driver_connection_error_names_its_setting() -> None:
    import redis

    message = unavailable(redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:1."))
    assert message == ("Redis is unavailable (SWITCHYARD_REDIS_URL): Error 111 connecting to 127.0.0.1:1; "
                       "start Redis there, or set SWITCHYARD_REDIS_URL to where it runs (in a Switchyard "
                       "checkout: ./dev services)")
    assert unavailable(ValueError("x")) is None


def test_a_connection_the_broker_closed_is_not_called_unavailable() -> None:
    """A worker's consume racing its queue's creation ended in "RabbitMQ is unavailable ... start it
    with ./dev services" (CI's red run on 4.0) while the broker was up and had answered."""
    import pika.exceptions

    closed = pika.exceptions.ConnectionClosedByBroker(541, "INTERNAL_ERROR")
    closed_by = "RabbitMQ closed the connection (SWITCHYARD_AMQP_URL):"
    assert unavailable(closed) == f"{closed_by} 541 INTERNAL_ERROR; the broker's log says why"
    refused = pika.exceptions.ConnectionClosedByBroker(530, "NOT_ALLOWED - vhost v not found")
    assert unavailable(refused) == (f"{closed_by} 530 NOT_ALLOWED - vhost v not found; "
                                    "check the user, password and vhost in SWITCHYARD_AMQP_URL")


def test_usage_errors_are_one_line_with_exit_2() -> None:
    result, _ = run("pending", "call", "--endpoint", "e", "--timeout", "-3")
    assert result.returncode == 2
    assert result.stderr == ("switchyard: error: pending call: argument --timeout: must be a number above 0, "
                             "got '-3'; see switchyard pending call --help\n")
