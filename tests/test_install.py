"""The package as an application gets it: the built wheel, installed with its declared dependencies
into a fresh venv, runs the CLI and the README's client and worker ("A client and a worker in your own code").

Nothing from this checkout is importable there: the child processes run from tmp_path without the
repository's PYTHONPATH, so a dependency missing from pyproject.toml fails here, not in someone's app.
Resolution goes to the index pip is configured with, capped by constraints.txt (the pinned versions).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import venv
from pathlib import Path

import pytest

from tests.conftest import ROOT, unique, wait_for

pytestmark = pytest.mark.slow


def readme_example() -> dict[str, str]:
    """The README's worker and client ("A client and a worker in your own code"), as written there:
    the Python blocks that start with ``# worker.py`` and ``# client.py``."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## A client and a worker in your own code", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    files = {block.split(None, 2)[1].rstrip(":"): block for block in blocks if block.startswith("# ")}
    assert set(files) == {"worker.py", "client.py"}, f"the README's example blocks: {sorted(files)}"
    return files


def build_wheel(dist: Path, work: Path) -> Path:
    """Build from a copy of what the wheel is made of, so no build/ or egg-info lands in the checkout."""
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "switchyard", src / "switchyard", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-input", "-q",
                    "--no-deps", "-w", str(dist), str(src)], check=True, timeout=300)
    (wheel,) = dist.glob("switchyard-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh venv with the wheel and its dependencies; the environment its processes run with."""
    work = tmp_path_factory.mktemp("install")
    wheel = build_wheel(work / "dist", work)
    env_dir = work / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # Nothing of the checkout may be importable: with PYTHONPATH on it (a test before this one may
    # have set it), pip finds `switchyard` "already satisfied" and installs no wheel at all.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join([str(env_dir / "bin"), env.get("PATH", "")])
    subprocess.run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q",
                    str(wheel), "-c", str(ROOT / "constraints.txt")], check=True, timeout=600, env=env)
    assert (env_dir / "bin" / "switchyard").exists(), "the wheel's console script was not installed"
    env.setdefault("SWITCHYARD_LOG_LEVEL", "WARNING")
    return env_dir, env


def run(args: list[str], env: dict[str, str], cwd: Path, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=120, **kw)


def test_the_cli_and_the_public_modules_work_from_the_wheel(installed, tmp_path: Path) -> None:
    env_dir, env = installed
    result = run([str(env_dir / "bin" / "switchyard"), "--help"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "pool" in result.stdout
    probe = ("import pathlib, switchyard, switchyard.rpc.client, switchyard.rpc.worker; "
             "print(switchyard.__file__); "
             "print((pathlib.Path(switchyard.__file__).parent / 'py.typed').is_file()); "
             "print(all((pathlib.Path(switchyard.__file__).parent / 'local' / f).is_file() "
             "for f in ('console.html', 'console.js')))")
    result = run([str(env_dir / "bin" / "python"), "-c", probe], env, tmp_path)
    assert result.returncode == 0, result.stderr
    location, typed, console = result.stdout.split()
    assert Path(location).is_relative_to(env_dir), f"imported from {location}, not the venv"
    assert typed == "True", "py.typed is not in the wheel"
    assert console == "True", "the status console's page is not in the wheel"


def test_the_readme_client_and_worker_run_from_the_wheel(installed, tmp_path: Path) -> None:
    env_dir, env = installed
    switchyard = str(env_dir / "bin" / "switchyard")
    app = tmp_path / "app"
    app.mkdir()
    pool, key = unique("install"), "infra=42"
    example = readme_example()
    client = example["client.py"]
    assert client.count('RpcClient("core"') == 1, "the client names its pool once, as 'core'"
    (app / "worker.py").write_text(example["worker.py"])
    (app / "client.py").write_text(client.replace('RpcClient("core"', f"RpcClient({pool!r}"))
    result = run([switchyard, "pool", "init", "--pool", pool], env, app)
    assert result.returncode == 0, result.stderr
    worker = None
    try:
        result = run([switchyard, "pool", "bind", "--pool", pool, "--key", key], env, app)
        assert result.returncode == 0, result.stderr
        worker_env = dict(env, PYTHONPATH=str(app), WORKER_POOL=pool, WORKER_KEY=key)
        worker = subprocess.Popen([switchyard, "worker", "--handler", "worker:handler"],
                                  env=worker_env, cwd=app, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
        started = time.monotonic()
        result = run([str(env_dir / "bin" / "python"), "client.py"], env, app)
        assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
        assert result.stdout.splitlines() == ["ok b'infra=42:payload'", "['ok']"], result.stdout
        assert time.monotonic() - started < 60
        result = run([switchyard, "status", "--pool", pool, "--json"], env, app)
        assert result.returncode == 0, result.stderr
        (figures,) = json.loads(result.stdout)["rpc"]["pools"]
        assert [g["key"] for g in figures["groups"]] == [key]
        # No control plane runs here: status says so, and where the worker's reports wait.
        reports = wait_for(lambda: json.loads(run([switchyard, "pool", "status", "-p", pool, "--json"], env,
                                                  app).stdout)["activity_waiting"], timeout=30, interval=1.0,
                           what="the worker's activity reports in the activity queue")
        result = run([switchyard, "status", "-p", pool], env, app)
        assert f"{key!r}" in result.stdout and "untracked" in result.stdout, result.stdout
        assert "no control plane is running" in result.stdout and "worker reports wait" in result.stdout
        assert reports >= 1
    finally:
        if worker is not None:
            worker.terminate()
            try:
                out, _ = worker.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                out, _ = worker.communicate()
            assert worker.returncode == 0, out
            assert "switchyard worker " in out and f"pool {pool!r}, key {key!r}, handler worker:handler, " \
                   "broker amqp://" in out, out  # its one start line
        # The worker's own activity reports are telemetry, not data: no --force needed.
        result = run([switchyard, "pool", "delete", "--pool", pool], env, app)
        assert result.returncode == 0, result.stderr


def started(args: list[str], env: dict[str, str], cwd: Path, banner: str) -> subprocess.Popen[str]:
    """A daemon of the wheel, once it printed the line that says it runs (stdout and stderr merged);
    a start that never comes kills it, and the test fails on its output."""
    proc = subprocess.Popen(args, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    guard = threading.Timer(60, proc.kill)
    guard.start()
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if banner in line:
                return proc
        raise AssertionError(f"{args[1:3]} exited {proc.wait()} before saying {banner!r}:\n{''.join(seen)}")
    finally:
        guard.cancel()


def stopped(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """SIGINT (Ctrl-C), then its exit code and what it printed since it started."""
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return proc.returncode, out


def test_the_local_runtime_runs_from_the_wheel(installed, tmp_path: Path) -> None:
    """The control plane, the delay runner, a handler invoked on its packaged sample event, the demo
    and the trace it follows: the handlers' code is in the package, not only in a checkout."""
    from switchyard.core.config import Connections
    from switchyard.delay.store import PostgresDelayStore

    env_dir, env = installed
    switchyard = str(env_dir / "bin" / "switchyard")
    pool = unique("install")
    result = run([switchyard, "pool", "init", "--pool", pool], env, tmp_path)
    assert result.returncode == 0, result.stderr
    try:
        result = run([switchyard, "invoke", "rpc_reconcile"],
                     dict(env, SWITCHYARD_RPC_POOL=pool, SWITCHYARD_RPC_DRIVER="noop"), tmp_path)
        assert result.returncode == 0, result.stderr
        assert isinstance(json.loads(result.stdout), dict), result.stdout
        local = started([switchyard, "local", "--pool", pool, "--status-every", "0.5"], env, tmp_path,
                        f"control plane of pool {pool!r} running")
        code, out = stopped(local)
        assert code == 0 and "stopped: workers terminated" in out, out
    finally:
        run([switchyard, "pool", "delete", "--pool", pool, "--force"], env, tmp_path)

    schema = unique("install").replace("-", "_")
    delay_env = dict(env, SWITCHYARD_DELAY_SCHEMA=schema, SWITCHYARD_DELAY_INPUT_TOPIC=f"{schema}-in",
                     SWITCHYARD_DELAY_OUTPUT_TOPIC=f"{schema}-out", SWITCHYARD_DELAY_CONSUMER_GROUP=schema)
    try:
        runner = started([switchyard, "delay", "run"], delay_env, tmp_path,
                         "switchyard delay: running enqueue, fire, sweep, scheduled")
        code, out = stopped(runner)
        assert code == 0 and "Traceback" not in out, out
    finally:
        with PostgresDelayStore(Connections.from_env().postgres_dsn, schema) as dropping:
            dropping.drop_schema()

    result = run([switchyard, "demo", "--seconds", "1", "--keys", "1", "--unbind-delay", "1",
                  "--stop-delay", "1"], env, tmp_path)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    (trace_id,) = re.findall(r"switchyard trace ([0-9a-f]{32})", result.stdout)
    result = run([switchyard, "trace", trace_id], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "rpc: handled" in result.stdout and "rpc: orphan forwarded" in result.stdout, result.stdout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run([switchyard, "trace", trace_id], env, elsewhere)  # where nothing ran: says where to look
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert f"there is no trace log at {elsewhere}" in result.stderr and "--log PATH" in result.stderr
