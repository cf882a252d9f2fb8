"""Who is calling the bus API: HTTP Basic, the username an API token (the password is ignored).
Root is the operator's key (``SWITCHYARD_BUS_ROOT_KEY``); a client is a registered token."""

from __future__ import annotations

import base64
import binascii
import functools
import hmac

from switchyard.bus.errors import UnauthorizedError
from switchyard.bus.ports import BusStorePort

Caller = tuple[str, str]  # ("root", key) or ("client", token)
ANYONE = UnauthorizedError(("root", "client"))


@functools.lru_cache(maxsize=1024)
def basic_username(header: str | None) -> str | None:
    """The username of a Basic ``Authorization`` header, else None (cached: a publisher sends the
    same header with every event; the result depends on the header alone)."""
    scheme, _, encoded = (header or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        username, sep, _password = decoded.partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return username if sep and username else None


def header_username(headers: dict[str, str] | None) -> str | None:
    """The Basic username of a proxy event's headers (either spelling of ``Authorization``)."""
    headers = headers or {}
    return basic_username(headers.get("Authorization") or headers.get("authorization"))


class Credentials:
    """The credentials of one bus: its root key, and its store's tokens (looked up per request, so
    a revoked token stops working at once)."""

    def __init__(self, store: BusStorePort) -> None:
        self.store = store

    def is_root(self, username: str) -> bool:
        root_key = self.store.settings.root_key
        return bool(root_key) and hmac.compare_digest(username.encode(), root_key.encode())

    def who(self, username: str | None) -> Caller | None:
        """("root", key) or ("client", token) for a Basic username, else None."""
        if username is None:
            return None
        if self.is_root(username):
            return "root", username
        if self.store.token_exists(username):
            return "client", username
        return None
