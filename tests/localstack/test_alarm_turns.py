"""Alarm scenarios on one stack take turns; on two stacks they do not wait for each other."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from switchyard.cli.alarms import taking_turns
from switchyard.core.deployed_config import ALARM_PREFIX_ENV
from tests.conftest import unique, wait_for

CLOUDWATCH = SimpleNamespace(meta=SimpleNamespace(endpoint_url="http://127.0.0.1:4566"))


def test_a_second_run_on_the_stack_waits_for_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALARM_PREFIX_ENV, unique("Stack") + "-")
    said: list[str] = []
    order: list[str] = []

    def second() -> None:
        with taking_turns(CLOUDWATCH, said.append):
            order.append("second ran")

    with taking_turns(CLOUDWATCH, said.append):
        thread = threading.Thread(target=second)
        thread.start()
        wait_for(lambda: said, timeout=5, what="the second run to wait")
        order.append("first done")
    thread.join(5)
    assert order == ["first done", "second ran"]
    assert said[0].startswith("waiting for the alarm scenario running on this stack")


def test_runs_on_two_stacks_do_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    monkeypatch.setenv(ALARM_PREFIX_ENV, unique("Stack") + "-")
    with taking_turns(CLOUDWATCH, said.append):
        monkeypatch.setenv(ALARM_PREFIX_ENV, unique("Other") + "-")
        with taking_turns(CLOUDWATCH, said.append):
            pass
    assert said == []
