"""The command line as a user meets it: help everywhere, handlers invoked with the sample events."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from switchyard.cli import build_parser
from switchyard.core.redis_client import connect_redis
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.settings import RpcSettings
from switchyard.rpc.store import PoolState
from tests.conftest import subprocess_env, unique, wait_for


def _subcommands(parser, prefix=()):
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _subcommands(sub, (*prefix, name))


def test_every_subcommand_has_help(capsys) -> None:
    commands = list(_subcommands(build_parser()))
    assert {("pool", "init"), ("call",), ("worker",), ("local",), ("invoke",), ("demo",),
            ("delay", "run")} <= set(commands)
    for command in commands:
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args([*command, "--help"])
        assert exit_info.value.code == 0
        assert "usage: switchyard" in capsys.readouterr().out


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "switchyard", *args], capture_output=True, text=True,
                          env=subprocess_env(**env), timeout=120)


def test_invoke_runs_a_handler_on_a_sample_event() -> None:
    pool = unique("cli")
    settings = RpcSettings.from_env()
    with PoolTopology(pool, settings) as topology:
        topology.declare()
    try:
        result = run("invoke", "rpc_dead_letters", "--event", "events/rmq_dead_letter.json",
                     SWITCHYARD_RPC_POOL=pool)
        assert result.returncode == 0, result.stderr
        outcome = json.loads(result.stdout)
        assert outcome["dead_letters"] == 1 and outcome["responses"] == 1
        result = run("invoke", "rpc_reconcile", "--event", "events/eventbridge_schedule.json",
                     SWITCHYARD_RPC_POOL=pool, SWITCHYARD_RPC_DRIVER="noop")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["skipped"] == 0
    finally:
        with PoolTopology(pool, settings) as topology:
            topology.delete(force=True)
        PoolState(connect_redis(settings.connections), pool).clear()


def test_errors_say_what_to_do() -> None:
    result = run("invoke", "no_such_function", "--event", "events/rmq_orphan.json")
    assert result.returncode == 1
    assert "available:" in result.stderr and "rpc_orphans" in result.stderr
    result = run("call", "--pool", unique("never"), "--key", "k")
    assert result.returncode == 1
    assert "switchyard pool init" in result.stderr
    result = run("pool", "init", "--pool", "bad-name")
    assert result.returncode == 1 and "invalid pool name" in result.stderr


def test_local_control_plane_serves_calls_from_the_command_line(tmp_path) -> None:
    """`switchyard local` starts groups on demand; `switchyard call` gets the answer and its trace,
    which `switchyard trace` follows through the hops the local runtime logged; SIGTERM ends it."""
    import signal

    pool = unique("cli")
    settings = RpcSettings.from_env()
    log = {"SWITCHYARD_TRACE_LOG": str(tmp_path / "trace.jsonl")}
    local = subprocess.Popen(
        [sys.executable, "-m", "switchyard", "local", "--pool", pool, "--status-every", "0.5"],
        env=subprocess_env(SWITCHYARD_RPC_WORKER_HANDLER="switchyard.rpc.examples:echo", **log),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def declared() -> bool:  # `local` declares the pool; `call` refuses an uninitialized one
            assert local.poll() is None, local.stderr.read()
            with PoolTopology(pool, settings) as topology:
                return topology.exists()

        wait_for(declared, timeout=60, interval=0.2, what="`switchyard local` to declare the pool")
        result = run("call", "--pool", pool, "--key", "a key", "--body", "hi there", "--json",
                     "--timeout", "30", **log)
        assert result.returncode == 0, result.stderr
        answer = json.loads(result.stdout)
        assert answer["status"] == "ok" and answer["body"] == "hi there"
        traced = run("trace", answer["trace_id"], "--json", **log)
        assert traced.returncode == 0, traced.stderr
        hops = [(h["part"], h["event"]) for h in json.loads(traced.stdout)["hops"]]
        assert hops == [("rpc", "publish"), ("rpc", "orphan forwarded"), ("rpc", "group started"),
                        ("rpc", "handled")], hops
        local.send_signal(signal.SIGTERM)
        out, err = local.communicate(timeout=60)
        assert local.returncode == 0, err
        assert "'a key': active, workers running" in out  # the status line showed the group and its workers
        assert "stopped: workers terminated" in out
    finally:
        if local.poll() is None:
            local.kill()
        with PoolTopology(pool, settings) as topology:
            topology.delete(force=True)
        PoolState(connect_redis(settings.connections), pool).clear()


def test_delay_run_whose_role_dies_says_so_and_exits_non_zero(monkeypatch, capfd) -> None:
    """A role's loop that ends (here: its handler cannot be loaded) stops the runner with exit 1 and
    a line naming it; it used to keep running, saying it ran all of them."""
    import signal as signals

    from switchyard.cli import main
    from switchyard.core.config import Connections
    from switchyard.delay.store import PostgresDelayStore
    from switchyard.local import delay_runtime

    schema = unique("died")
    monkeypatch.setenv("SWITCHYARD_DELAY_SCHEMA", schema)
    monkeypatch.setitem(delay_runtime.FUNCTIONS, "sweep", "no_such_handler")
    handlers = {s: signals.getsignal(s) for s in (signals.SIGINT, signals.SIGTERM)}
    try:
        code = main(["delay", "run", "--roles", "sweep"])
    finally:
        for sig, handler in handlers.items():
            signals.signal(sig, handler)
        with PostgresDelayStore(Connections.from_env().postgres_dsn, schema) as dropping:
            dropping.drop_schema()
    err = capfd.readouterr().err
    assert code == 1, err
    assert "switchyard delay: error: the sweep loop ended" in err, err


def test_a_pool_no_one_declared_is_the_same_one_line_error_in_status_and_pool_status() -> None:
    pool = unique("nosuch")
    for command in (("status", "-p", pool), ("pool", "status", "-p", pool),
                    ("status", "--pool", pool, "--json")):
        result = run(*command)
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        assert result.stdout == "" and result.stderr.count("\n") == 1, (command, result.stderr)
        assert f"pool {pool!r} is not initialized" in result.stderr
        assert "switchyard pool init" in result.stderr


def test_status_with_the_broker_down_fails_and_shows_no_pool() -> None:
    """The broker on a closed port: the RPC part is unreachable (not a list of healthy pools), exit 1."""
    result = run("status", "-b", "amqp://guest:guest@127.0.0.1:1/%2F")
    assert result.returncode == 1, result.stdout
    assert "RPC pools\n  unreachable: cannot reach RabbitMQ at 127.0.0.1:1" in result.stdout, result.stdout
    assert "the RPC pools could not be read" in result.stderr and result.stderr.count("\n") == 1


def test_a_call_nothing_can_answer_fails_at_once_and_a_scheduled_one_says_where_it_waits() -> None:
    """A key with no queue in a pool with no control plane: a one-line error at once, not a 30 s
    timeout. ``--at`` with no delay runner: queued to Kafka, and a warning that no runner reads it."""
    pool = unique("cli")
    with PoolTopology(pool, RpcSettings.from_env()) as topology:
        topology.declare()
    try:
        result = run("call", "-p", pool, "-k", "nobody", "--timeout", "20")
        assert result.returncode == 1, result.stdout
        assert "no group serves key 'nobody'" in result.stderr, result.stderr
        assert "no control plane is running" in result.stderr and result.stderr.count("\n") == 1
        with PoolTopology(pool, RpcSettings.from_env()) as topology:
            topology.ensure_request_queue("bound")
        result = run("call", "-p", pool, "-k", "bound", "--timeout", "1")  # waits: a worker may come
        assert result.returncode == 1, result.stdout
        assert "no response for key 'bound' within 1s: 0 worker(s) on the key's queue, and no control " \
               "plane is running" in result.stderr, result.stderr
        topic = unique("cli-in")
        result = run("call", "-p", pool, "-k", "later", "--at", "+5s", SWITCHYARD_DELAY_INPUT_TOPIC=topic,
                     SWITCHYARD_DELAY_CONSUMER_GROUP=unique("cli-group"))
        assert result.returncode == 0, result.stderr
        assert f"queued to Kafka topic {topic}" in result.stdout, result.stdout
        assert f"warning: no delay runner reads {topic}" in result.stderr, result.stderr
    finally:
        with PoolTopology(pool, RpcSettings.from_env()) as topology:
            topology.delete(force=True)


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_shell_completion_completes_commands_subcommands_and_flags(shell: str) -> None:
    result = run("completion", shell)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("autoload -U +X bashcompinit") == (shell == "zsh")
    if shell == "zsh":
        return  # the same script after bash's completion support (zsh is not on every machine)
    probe = ('_complete() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _switchyard; '
             'echo "${COMPREPLY[*]}"; }\n'
             "_complete switchyard pool st\n_complete switchyard call -\n_complete switchyard del\n")
    done = subprocess.run(["bash", "-c", result.stdout + probe], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    pool, call, top = done.stdout.splitlines()
    assert pool == "status"
    assert {"-p", "-k", "--pool", "--key", "--at", "-b", "--broker-url", "--json"} <= set(call.split())
    assert top == "delay"


def test_a_docs_page_is_linked_by_the_documentation_url_when_the_metadata_has_one(monkeypatch) -> None:
    from email.message import Message

    from switchyard.core import docs

    found = Message()
    found["Project-URL"] = "Source, https://example.test/src"
    found["Project-URL"] = "Documentation, https://example.test/docs/"
    monkeypatch.setattr(docs.metadata, "metadata", lambda _name: found)
    docs.docs_base.cache_clear()
    try:
        assert docs.docs_link("configuration.md") == "https://example.test/docs/configuration.md"
        monkeypatch.setattr(docs.metadata, "metadata", lambda _name: Message())
        docs.docs_base.cache_clear()
        assert docs.docs_link("configuration.md") == "docs/configuration.md in Switchyard's source"
    finally:
        docs.docs_base.cache_clear()
