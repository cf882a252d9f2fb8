"""Settings from the environment: defaults, overrides, and errors that name the variable."""

from __future__ import annotations

import subprocess
import sys

import pytest

from switchyard.core.config import REDIS_TIMEOUT, Connections, service_urls
from switchyard.core.errors import ConfigError
from switchyard.rpc.settings import PoolPolicy
from tests.conftest import subprocess_env


def test_defaults_point_at_the_local_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SWITCHYARD_AMQP_URL", "SWITCHYARD_REDIS_URL", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    conn = Connections.from_env()
    assert conn.amqp_url == "amqp://guest:guest@127.0.0.1:5672/%2F"
    assert conn.redis_url.startswith("redis://127.0.0.1:6379")
    assert conn.aws_endpoint_url is None


def test_numbers_are_parsed_and_bad_ones_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from switchyard.rpc.settings import CLIENT_CONCURRENCY

    monkeypatch.setenv("SWITCHYARD_RPC_CLIENT_CONCURRENCY", "12")
    monkeypatch.setenv("SWITCHYARD_REDIS_TIMEOUT_S", "12")
    assert CLIENT_CONCURRENCY.read() == 12 and REDIS_TIMEOUT.read() == 12.0
    monkeypatch.delenv("SWITCHYARD_REDIS_TIMEOUT_S")
    assert REDIS_TIMEOUT.read() == 5.0
    monkeypatch.setenv("SWITCHYARD_RPC_CLIENT_CONCURRENCY", "twelve")
    with pytest.raises(ConfigError, match="SWITCHYARD_RPC_CLIENT_CONCURRENCY must be an integer"):
        CLIENT_CONCURRENCY.read()


def test_pool_policy_refuses_nonsense(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHYARD_RPC_QUEUE_TYPE", "stream")
    with pytest.raises(ConfigError, match="SWITCHYARD_RPC_QUEUE_TYPE must be one of quorum, classic"):
        PoolPolicy.from_env()
    monkeypatch.setenv("SWITCHYARD_RPC_QUEUE_TYPE", "classic")
    monkeypatch.setenv("SWITCHYARD_RPC_DELIVERY_LIMIT", "0")
    with pytest.raises(ConfigError, match="delivery limit"):
        PoolPolicy.from_env()


def test_settings_classes_read_their_variables_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bus and delay settings go through one reader: typed by the default, errors name the variable."""
    from switchyard.bus.settings import BusSettings
    from switchyard.delay.settings import DelaySettings

    monkeypatch.setenv("SWITCHYARD_BUS_NAME", "orders")
    monkeypatch.setenv("SWITCHYARD_BUS_REDIS_MAX_MEM_BYTES", "500000000")
    monkeypatch.setenv("SWITCHYARD_BUS_CONNECT_TIMEOUT_MS", "1500")
    monkeypatch.setenv("SWITCHYARD_DELAY_BATCH_WINDOW_MS", "40")
    monkeypatch.delenv("SWITCHYARD_DELAY_SCHEMA", raising=False)
    bus, delay = BusSettings.from_env(), DelaySettings.from_env()
    assert (bus.name, bus.max_mem, bus.connect_timeout_s, bus.heal_rate) == ("orders", 500_000_000, 1.5, 1)
    assert delay.batch_window_ms == 40 and delay.schema == DelaySettings().schema
    monkeypatch.setenv("SWITCHYARD_BUS_WORKER_THREADS", "many")
    with pytest.raises(ConfigError, match="SWITCHYARD_BUS_WORKER_THREADS must be an integer"):
        BusSettings.from_env()


@pytest.mark.parametrize(("asked", "level", "warned"), [("bogus", "WARNING", True), ("debug", "DEBUG", False),
                                                        (" Error ", "ERROR", False)])
def test_a_log_level_typo_falls_back_with_a_warning_instead_of_stopping_every_process(
        asked: str, level: str, warned: bool) -> None:
    """The logger is built at import: an unknown SWITCHYARD_LOG_LEVEL raised there (Powertools'
    ValueError), so every command, worker and Lambda init failed with a traceback."""
    run = subprocess.run([sys.executable, "-c", "import logging; from switchyard.core.observability import "
                          "logger; print(logging.getLevelName(logger.log_level))"],
                         env=subprocess_env(SWITCHYARD_LOG_LEVEL=asked), capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == level, run.stderr[-2000:]
    assert ("is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL; using WARNING" in run.stderr) is warned


MALFORMED_URLS = [
    # (variable, value, command, what the one line says)
    ("SWITCHYARD_AMQP_URL", "amqp://u:secret-pw@[::1/%2F", ("call", "--pool", "p", "--key", "k"),
     "SWITCHYARD_AMQP_URL cannot be read as a URL (Invalid IPv6 URL)"),
    ("SWITCHYARD_AMQP_URL", "amqp://u:secret-pw@127.0.0.1:abc/", ("pool", "status", "--pool", "p"),
     "SWITCHYARD_AMQP_URL cannot be read as a URL (Port could not be cast to integer value as 'abc')"),
    ("SWITCHYARD_AMQP_URL", "http://u:secret-pw@127.0.0.1:5672/", ("call", "--pool", "p", "--key", "k"),
     "SWITCHYARD_AMQP_URL must begin with amqp:// or amqps://, got http://"),
    ("SWITCHYARD_MANAGEMENT_URL", "http://u:secret-pw@[::1", ("pool", "status", "--pool", "p"),
     "SWITCHYARD_MANAGEMENT_URL cannot be read as a URL (Invalid IPv6 URL)"),
    ("SWITCHYARD_REDIS_URL", "redis://u:secret-pw@127.0.0.1:99999/0", ("pending", "status"),
     "SWITCHYARD_REDIS_URL cannot be read as a URL (Port out of range 0-65535)"),
    ("SWITCHYARD_REDIS_URL", "127.0.0.1:6379", ("bus", "status"),
     "SWITCHYARD_REDIS_URL must begin with redis:// or rediss:// or unix://"),
    ("SWITCHYARD_POSTGRES_DSN", "postgresql://u:secret-pw@[::1/x", ("delay", "status"),
     "SWITCHYARD_POSTGRES_DSN cannot be read as a URL (Invalid IPv6 URL)"),
]


@pytest.mark.parametrize(("variable", "value", "argv", "says"), MALFORMED_URLS,
                         ids=[f"{m[0]}={m[1].replace('secret-pw', 'pw')}" for m in MALFORMED_URLS])
def test_a_malformed_service_url_is_one_line_naming_its_variable(
        variable: str, value: str, argv: tuple[str, ...], says: str) -> None:
    """Each client library failed on these in its own way from deep inside (pika, redis-py, urllib:
    ValueError, IndexError), which the CLI printed as "unexpected ... report it"."""
    run = subprocess.run([sys.executable, "-m", "switchyard", *argv], env=subprocess_env(**{variable: value}),
                         capture_output=True, text=True, timeout=60)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1, run.stderr[-2000:]
    assert lines[0].startswith(f"switchyard: error: {says}"), lines
    assert "unexpected" not in lines[0] and "secret-pw" not in run.stderr + run.stdout


def test_urls_are_checked_when_read_and_the_conninfo_form_is_left_to_psycopg() -> None:
    conn = Connections(amqp_url="amqp://u:secret-pw@h:5672:x/%2F",  # type: ignore[arg-type]
                       postgres_dsn="host=db port=6543 dbname=x password=secret-pw")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="SWITCHYARD_AMQP_URL cannot be read as a URL") as caught:
        conn.amqp_url  # noqa: B018 (reading is what checks)
    assert "secret-pw" not in str(caught.value)
    assert conn.postgres_dsn == "host=db port=6543 dbname=x password=secret-pw"


def test_a_cluster_is_named_by_a_list_of_node_urls_each_checked() -> None:
    nodes = "amqp://u:pw@n1:5680/%2F, amqp://u:pw@n2:5681/%2F"
    assert Connections(amqp_url=nodes).amqp_url == nodes  # type: ignore[arg-type]
    assert service_urls(nodes) == ["amqp://u:pw@n1:5680/%2F", "amqp://u:pw@n2:5681/%2F"]
    with pytest.raises(ConfigError, match="SWITCHYARD_MANAGEMENT_URL must begin with http:// or https://"):
        Connections(management_url="http://n1:15680,amqp://n2:5681").management_url  # type: ignore[arg-type]  # noqa: B018
    with pytest.raises(ConfigError, match="SWITCHYARD_REDIS_URL cannot be read as a URL"):
        Connections(redis_url="redis://n1:7100,redis://n2:7101").redis_url  # type: ignore[arg-type]  # noqa: B018


def test_a_deployed_template_passes_the_preflight_and_is_checked_once_filled() -> None:
    """The stacks' Postgres URL is a template down to its host and port (stacks/data.py); the
    preflight reads templates (no secret fetched), so it leaves such an address to the client (it
    tried to connect to "{host}:{port}" before); a URL is checked once its secret filled it."""
    from switchyard.cli.preflight import require

    template = "postgresql://{username}:{password}@{host}:{port}/{dbname}?sslmode=verify-full"
    pg = Connections(postgres_dsn=template)  # type: ignore[arg-type]
    require("postgres", connections=pg)
    injected = {"SWITCHYARD_AMQP_USERNAME": "u", "SWITCHYARD_AMQP_PASSWORD": "secret-pw"}
    filled = Connections(amqp_url="amqps://{username}:{password}@[::1/%2F",  # type: ignore[arg-type]
                         secret_sources=injected)
    with pytest.raises(ConfigError, match="SWITCHYARD_AMQP_URL cannot be read as a URL") as caught:
        filled.amqp_url  # noqa: B018 (reading is what fills and checks)
    assert "secret-pw" not in str(caught.value)


PASSWORDS_WITH_AT = {  # variable -> (URL with a password holding @, what config prints)
    "SWITCHYARD_AMQP_URL": ("amqp://svc:p@ss-tail1@mq.internal:5671/%2F", "amqp://svc:***@mq.internal:5671/%2F"),
    "SWITCHYARD_REDIS_URL": ("redis://:@tail2@cache:6379/0", "redis://:***@cache:6379/0"),
    "SWITCHYARD_MANAGEMENT_URL": ("http://admin:a@b@tail3@mq:15672", "http://admin:***@mq:15672"),
    "SWITCHYARD_POSTGRES_DSN": ("postgresql://me@corp:pw@tail4@db:5432/x", "postgresql://me@corp:***@db:5432/x"),
}


def test_config_never_prints_the_tail_of_a_password_that_holds_an_at_sign() -> None:
    """The userinfo ends at the netloc's last ``@`` (as urllib and the drivers read it): the
    redaction stopped at the first, and ``switchyard config`` printed ``svc:***@ss-tail1@mq...``."""
    env = {variable: url for variable, (url, _) in PASSWORDS_WITH_AT.items()}
    for argv in (["config"], ["config", "--json"]):
        run = subprocess.run([sys.executable, "-m", "switchyard", *argv], env=subprocess_env(**env),
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr[-2000:]
        for shown in (shown for _, shown in PASSWORDS_WITH_AT.values()):
            assert shown in run.stdout, run.stdout
        assert "tail" not in run.stdout + run.stderr


def test_the_log_redacts_the_whole_userinfo_up_to_the_last_at_sign() -> None:
    from switchyard.core.observability import redact

    for url, _ in PASSWORDS_WITH_AT.values():
        assert "tail" not in redact(f"cannot connect to {url}: refused"), url
    assert redact("amqp://svc:p@ss@mq/%2F and http://host/path@x") == \
        "amqp://<redacted>@mq/%2F and http://host/path@x"
