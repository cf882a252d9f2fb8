"""The slot table alone: sequence checks, reuse, exhaustion."""

from __future__ import annotations

import threading
import time

import pytest

from switchyard.rpc.client.slots import SlotTable


def test_a_late_completion_for_a_reused_slot_is_refused() -> None:
    table: SlotTable[str] = SlotTable(1)
    slot_a, seq_a = table.acquire("A", wait=0)
    assert table.complete(slot_a, seq_a) == "A"  # A freed (timed out)
    slot_b, seq_b = table.acquire("B", wait=0)
    assert slot_b == slot_a and seq_b != seq_a
    assert table.complete(slot_a, seq_a) is None  # A's late response
    assert table.complete(slot_b, seq_b) == "B"


def test_completion_out_of_range_or_twice_is_ignored() -> None:
    table: SlotTable[str] = SlotTable(2)
    slot, seq = table.acquire("A", wait=0)
    assert table.complete(5, seq) is None
    assert table.complete(-1, seq) is None
    assert table.complete(slot, seq) == "A"
    assert table.complete(slot, seq) is None
    assert table.in_use() == 0


def test_exhausted_table_times_out_then_serves_when_a_slot_frees() -> None:
    table: SlotTable[str] = SlotTable(1)
    slot, seq = table.acquire("A", wait=0)
    assert table.acquire("B", wait=0.05) is None
    threading.Timer(0.1, table.complete, (slot, seq)).start()
    started = time.monotonic()
    got = table.acquire("C", wait=5)
    assert got is not None and got[0] == slot
    assert time.monotonic() - started < 4


def test_drain_returns_every_waiter_and_frees_all() -> None:
    table: SlotTable[str] = SlotTable(3)
    for name in "abc":
        table.acquire(name, wait=0)
    assert sorted(table.drain()) == ["a", "b", "c"]
    assert table.in_use() == 0


def test_size_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SlotTable(0)


def test_holds_tells_whether_a_call_still_occupies_its_slot() -> None:
    table: SlotTable[str] = SlotTable(2)
    slot, seq = table.acquire("A", wait=0)
    assert table.holds(slot, seq)
    table.complete(slot, seq)
    assert not table.holds(slot, seq)
