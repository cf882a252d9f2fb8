"""`switchyard local`'s flags reach the control plane as values, not through the environment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from switchyard.cli.local import control_settings
from switchyard.rpc.settings import Delays


def test_flags_win_over_the_environment_which_stays_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWITCHYARD_RPC_POOL", raising=False)
    monkeypatch.setenv("SWITCHYARD_RPC_UNBIND_DELAY_S", "7")
    monkeypatch.setenv("SWITCHYARD_RPC_STOP_DELAY_S", "9")
    before = dict(os.environ)
    control = control_settings("flagged", unbind_delay=1.5)
    assert (control.pool, control.delays.unbind_s, control.delays.stop_s) == ("flagged", 1.5, 9.0)
    control = control_settings("flagged", stop_delay=2.0)
    assert (control.delays.unbind_s, control.delays.stop_s) == (7.0, 2.0)
    assert dict(os.environ) == before


def test_without_flags_the_defaults_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SWITCHYARD_RPC_POOL", "SWITCHYARD_RPC_UNBIND_DELAY_S", "SWITCHYARD_RPC_STOP_DELAY_S",
                 "SWITCHYARD_RPC_TOMBSTONE_TTL_S"):
        monkeypatch.delenv(name, raising=False)
    assert control_settings("plain").delays == Delays()


def test_local_workers_run_the_demo_handler_unless_one_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """Production has no default handler (the driver refuses to start); ``switchyard local`` keeps one."""
    from switchyard.local.rpc_runtime import LocalControlPlane
    from switchyard.rpc.drivers import SubprocessDriver
    from switchyard.rpc.settings import DEMO_HANDLER, ControlSettings

    for name in ("SWITCHYARD_RPC_DRIVER", "SWITCHYARD_RPC_WORKER_COMMAND", "SWITCHYARD_RPC_WORKER_HANDLER"):
        monkeypatch.delenv(name, raising=False)

    def handler() -> str:
        runtime = LocalControlPlane(ControlSettings("local_handler", Delays()))
        try:
            assert isinstance(runtime.driver, SubprocessDriver)
            return runtime.driver.command[-1]
        finally:
            runtime.plane.close()

    assert handler() == DEMO_HANDLER
    monkeypatch.setenv("SWITCHYARD_RPC_WORKER_HANDLER", "tests.rpc.handlers:whoami")
    assert handler() == "tests.rpc.handlers:whoami"


def test_invoke_gives_every_control_plane_function_the_local_plane() -> None:
    """``switchyard invoke`` installs the local plane (demo handler default) for exactly these."""
    from switchyard.cli.local import CONTROL_PLANE_FUNCTIONS
    from switchyard.local.functions import HANDLERS, load_function

    using = {name for name in HANDLERS if "control_plane()" in Path(load_function(name).__file__).read_text()}
    assert using == CONTROL_PLANE_FUNCTIONS
