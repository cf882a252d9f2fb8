"""Composition: every part builds its service one way, and nothing is read at import.

Each part's ``service.py`` has ``build_service(settings, ...)``, which reads no configuration; the
adapters read the settings and call it (the Lambda handlers through ``switchyard.aws.services`` on
their first invocation). Importing a handler module reads no ``SWITCHYARD_*`` variable, calls no
AWS API (so not SSM) and opens no connection: a cold start's init phase and the layer's import
check wait on nothing.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from switchyard.bus import service as bus_service
from switchyard.delay import service as delay_service
from switchyard.pending import service as pending_service
from switchyard.rpc import service as rpc_service
from tests.conftest import subprocess_env

ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS = sorted(p.stem for p in (ROOT / "functions").glob("*.py"))

# The one exception: the module-level Powertools logger and metrics of ``switchyard.core.observability``
# (Powertools' own pattern: they exist before the first invocation) read the function's own
# environment, which the stack sets on every function (stacks/functions.py), never SSM.
OBSERVABILITY_AT_IMPORT = ["SWITCHYARD_LOG_FORMAT", "SWITCHYARD_LOG_LEVEL", "SWITCHYARD_METRICS_NAMESPACE"]

# Run in a fresh interpreter: every read of a SWITCHYARD_ variable, every AWS API call and every
# connection made while the handler modules import is recorded (and refused).
_PROBE = r"""
import importlib.util, json, os, socket, sys

reads, calls, connects = [], [], []

class Watched(os._Environ):
    def __getitem__(self, key):
        if str(key).startswith("SWITCHYARD_"):
            reads.append(key)
            raise KeyError(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        if str(key).startswith("SWITCHYARD_"):
            reads.append(key)
        return super().__contains__(key)

env = os.environ
os.environ = Watched(env._data, env.encodekey, env.decodekey, env.encodevalue, env.decodevalue)

import botocore.client

def refuse_call(self, operation, params):
    calls.append(operation)
    raise RuntimeError(f"AWS API call at import: {operation}")

botocore.client.BaseClient._make_api_call = refuse_call
real_connect = socket.socket.connect

def refuse_connect(self, address):
    connects.append(repr(address))
    raise OSError(f"connection at import: {address!r}")

socket.socket.connect = refuse_connect
failed = {}
for name in sys.argv[1:]:
    path = os.path.join("functions", name + ".py")
    spec = importlib.util.spec_from_file_location("functions." + name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"reads": sorted(set(reads)), "calls": calls, "connects": connects, "failed": failed}))
"""


def test_importing_the_handlers_reads_no_setting_calls_no_aws_api_and_connects_nowhere() -> None:
    # A deployed function's environment: its settings would come from SSM, a read would fail.
    env = subprocess_env(SWITCHYARD_CONFIG_PATH="/switchyard/no-such-stack/config/",
                         SWITCHYARD_POOL="example", AWS_ENDPOINT_URL="http://127.0.0.1:9")
    done = subprocess.run([sys.executable, "-c", _PROBE, *FUNCTIONS], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"reads": OBSERVABILITY_AT_IMPORT, "calls": [], "connects": [], "failed": {}}
    assert len(FUNCTIONS) >= 14


def test_the_probe_sees_a_read_at_import(tmp_path: Path) -> None:
    """The check above can fail: a module that reads its pool at import is caught."""
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "reads.py").write_text("import os\nPOOL = os.environ.get('SWITCHYARD_POOL')\n")
    done = subprocess.run([sys.executable, "-c", _PROBE, "reads"], cwd=tmp_path,
                          env=subprocess_env(SWITCHYARD_POOL="example"),
                          capture_output=True, text=True, timeout=60, check=False)
    assert json.loads(done.stdout.strip().splitlines()[-1])["reads"] == ["SWITCHYARD_POOL"]


@pytest.mark.parametrize("module", [rpc_service, delay_service, bus_service, pending_service],
                         ids=lambda m: m.__name__)
def test_every_part_has_build_service_from_settings(module: object) -> None:
    build = module.build_service  # type: ignore[attr-defined]
    first = next(iter(inspect.signature(build).parameters.values()))
    assert first.name == "settings" and first.default is inspect.Parameter.empty
    assert not hasattr(module, "install") and not hasattr(module, "configure")


def _imports(path: Path) -> set[str]:
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def test_the_rpc_control_logic_sees_the_store_and_the_broker_through_ports() -> None:
    """The handlers and the reconciler import ``rpc.ports``, not the Redis store; the reconciler
    neither the topology (its adapter) nor pika's helpers."""
    control = ROOT / "switchyard" / "rpc" / "control"
    assert not {path.name for path in control.glob("*.py") if "switchyard.rpc.store" in _imports(path)}
    reconciler = _imports(control / "reconciler.py")
    assert not reconciler & {"switchyard.rpc.control.topology", "switchyard.rpc.amqp",
                             "switchyard.rpc.control.dead_lettering", "pika"}


_BUILD = r"""
import json, os

from switchyard.bus.service import build_service as build_bus
from switchyard.bus.settings import BusSettings
from switchyard.core.config import Connections
from switchyard.delay.service import build_service as build_delay
from switchyard.delay.settings import DelaySettings
from switchyard.pending.service import build_service as build_pending
from switchyard.pending.settings import PendingSettings
from switchyard.rpc.drivers import NoopDriver
from switchyard.rpc.service import build_relay, build_service as build_rpc
from switchyard.rpc.settings import ControlSettings, RpcSettings

# What an adapter reads first; from here on, every read is the part's own.
values = (Connections.from_env(), DelaySettings.from_env(), BusSettings.from_env(),
          PendingSettings.from_env(), ControlSettings.from_env(), RpcSettings.from_env())
connections, delay, bus, pending, control, rpc = values
reads = []

class Watched(os._Environ):
    def __getitem__(self, key):
        if str(key).startswith("SWITCHYARD_"):
            reads.append(key)
        return super().__getitem__(key)

env = os.environ
os.environ = Watched(env._data, env.encodekey, env.decodekey, env.encodevalue, env.decodevalue)
delay_service = build_delay(delay, connections)
services = [delay_service, build_bus(bus, connections), build_pending(pending),
            build_rpc(control, rpc, driver=NoopDriver())]
relay = build_relay(rpc, parked=delay_service.store)
print(json.dumps(sorted(set(reads))))
"""


def test_build_service_reads_no_setting_of_its_own() -> None:
    """The settings an adapter passed are all a part's ``build_service`` uses."""
    done = subprocess.run([sys.executable, "-c", _BUILD], cwd=ROOT,
                          env=subprocess_env(SWITCHYARD_POOL="example"),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_a_handler_service_is_built_once_unless_one_is_installed() -> None:
    from switchyard.aws.services import OnePerProcess

    built: list[object] = []
    holder = OnePerProcess(lambda: built.append(object()) or built[-1])
    assert not holder.built
    first = holder()
    assert holder() is first and len(built) == 1
    mine = object()
    holder.install(mine)
    assert holder() is mine and len(built) == 1
    holder.install(None)  # built again on the next call
    assert holder() is not first and len(built) == 2
