"""The bus's errors: its own, under ``SwitchyardError``, with Redis's wrapped ``from`` the driver's."""

from __future__ import annotations

import pytest
import redis

from switchyard.bus import errors
from switchyard.bus.store import BusStore
from switchyard.core.errors import SwitchyardError
from tests.bus.conftest import connect_redis_url, fast_settings, free_port


def test_every_bus_error_is_a_switchyard_error() -> None:
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, Exception)]
    assert errors.BusError in classes and all(issubclass(c, errors.BusError) for c in classes
                                                 if c is not SwitchyardError)


def test_an_unreachable_redis_is_storage_unavailable_from_the_driver_error() -> None:
    dead = BusStore(connect_redis_url(f"redis://127.0.0.1:{free_port()}/0"), fast_settings("nowhere"))
    with pytest.raises(errors.StoreUnavailableError) as caught:
        dead.tokens()
    assert isinstance(caught.value.__cause__, redis.ConnectionError)


def test_a_refused_command_is_a_storage_error(store) -> None:
    store.redis.set(store.tokens_key, "not a hash")
    with pytest.raises(errors.StoreError) as caught:
        store.tokens()
    assert not isinstance(caught.value, errors.StoreUnavailableError)
    assert isinstance(caught.value.__cause__, redis.ResponseError)
