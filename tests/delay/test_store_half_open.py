"""The Postgres adapter through a connection that goes silent without closing (half-open): the
operation fails within its deadline and the next one works on a new connection. Before the store's
watchdog, the read blocked for good (the fault suite's "delay: Postgres half-open" lost every
message due after the cut: the fire loop never came back)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from switchyard.core.config import Connections
from switchyard.delay.errors import StoreUnavailableError
from switchyard.delay.settings import DelaySettings
from switchyard.delay.store import PostgresDelayStore
from tests.delay.conftest import in_ms, message
from tests.pending.tcp_proxy import CuttableProxy

TIMEOUT_S = 1.0


@pytest.fixture
def proxied_store(settings: DelaySettings, connections: Connections,
                  store: PostgresDelayStore) -> Iterator[tuple[CuttableProxy, PostgresDelayStore]]:
    """A store of the test's (migrated) schema whose connections cross a proxy."""
    proxy = CuttableProxy(urlsplit(connections.postgres_dsn).port or 5432)
    proxied = PostgresDelayStore(proxy.through(connections.postgres_dsn), settings.schema,
                                 "switchyard-delay-half-open", timeout_s=TIMEOUT_S)
    yield proxy, proxied
    proxied.close()
    proxy.close()


def test_an_operation_on_a_half_open_connection_fails_within_its_deadline_then_the_store_recovers(
        proxied_store: tuple[CuttableProxy, PostgresDelayStore]) -> None:
    proxy, store = proxied_store
    assert store.insert([message("before", in_ms(60_000))]) == {"before"}
    proxy.hang(0.5)  # the connection is silent for good; new ones answer after 0.5 s
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError):
        store.insert([message("during", in_ms(60_000))])
    assert time.monotonic() - started < TIMEOUT_S + 2
    assert store.insert([message("after", in_ms(60_000))]) == {"after"}
    assert sum(store.counts()) >= 2


def test_a_wait_for_notifications_is_not_cut_short_by_the_deadline(
        proxied_store: tuple[CuttableProxy, PostgresDelayStore]) -> None:
    """Listening waits on purpose: its deadline is the wait plus the operation's."""
    _, store = proxied_store
    assert store.wait_enqueued(0.1) == 0.0  # LISTEN
    started = time.monotonic()
    assert store.wait_enqueued(2 * TIMEOUT_S) is None
    assert time.monotonic() - started >= 2 * TIMEOUT_S - 0.1
    assert store.wait_enqueued(0.1) is None  # the same connection, still listening
