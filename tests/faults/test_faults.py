"""The fault suite's short form, run by the test command: nothing sent may be lost.

``./dev faults`` runs the same scenarios bigger, with the fuzz run, and prints the whole account.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from tests.conftest import wait_for
from tests.faults import delay
from tests.faults.account import Account, table
from tests.faults.scenarios import DELAY_SIZES, SCENARIOS, Scenario

CI_SCENARIOS = [s for s in SCENARIOS if s.in_ci]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("scenario", CI_SCENARIOS, ids=[s.name for s in CI_SCENARIOS])
def test_nothing_sent_is_lost(scenario: Scenario, tmp_path: Path) -> None:
    account = scenario.run("short", tmp_path)
    print("\n" + table([account]))
    assert account.sent > 0 and account.faults > 0, account
    assert account.lost == 0, f"{account}; logs in {tmp_path}"
    assert account.once + account.duplicated == account.sent, account
    assert account.bad_lost == 0 and account.restarted == 0, f"{account}; logs in {tmp_path}"


def test_the_account_sees_a_loss(tmp_path: Path) -> None:
    """The harness can fail: rows deleted from the store behind the scheduler's back are lost."""

    def delete_rows(rig: delay.DelayRig, traffic: delay.DelayTraffic) -> int:
        traffic.produced_all.wait()
        wait_for(lambda: rig.waiting() > 0, timeout=120, what="stored messages")
        with psycopg.connect(rig.connections.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DELETE FROM {rig.name}.delayed_messages "
                         "WHERE deadline > now() + interval '1 second'")
        return 1

    # A deleted row never comes, however long the account waits: not the scenarios' 30 s for late ones.
    size = replace(DELAY_SIZES["short"], settle=10.0)
    account = delay.run_delay("sabotage", delete_rows, size, tmp_path)
    assert account.sent == size.messages
    assert 0 < account.lost < size.messages, account


def test_account_table() -> None:
    account = Account.settle("s", ["a", "b", "c", "d"], {"a": 1, "b": 3, "c": 0}, 1.25, faults=2)
    assert (account.sent, account.once, account.duplicated, account.lost) == (4, 1, 1, 2)
    assert not account.ok
    lines = table([account]).splitlines()
    assert lines[0].split() == ["scenario", "sent", "once", "duplicated", "lost", "faults", "time", "(s)",
                                "recovery", "(s)", "bad", "bad", "lost", "restarted", "note"]
    assert lines[2].split() == ["s", "4", "1", "1", "2", "2", "1.2", "-", "0", "0", "0"]
    assert lines[-1].split()[:5] == ["TOTAL", "4", "1", "1", "2"]
    recovered = Account.settle("r", ["a"], {"a": 1}, 2.0, faults=1, recovery=3.25)
    assert table([account, recovered]).splitlines()[3].split()[-4] == "3.2"
    assert table([account, recovered]).splitlines()[-1].split()[-4] == "3.2"  # the slowest
    strangers = Account.settle("m", ["a"], {"a": 1}, 1.0, faults=5)
    strangers = replace(strangers, bad=5, bad_lost=1, restarted=2)
    assert not strangers.ok
    assert table([strangers]).splitlines()[2].split()[-3:] == ["5", "1", "2"]
