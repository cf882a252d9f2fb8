"""The pika internals ``switchyard.rpc.amqp`` uses (``pika_internals.INTERNALS``) are all in the
installed pika, with the parameters listed, and pika is the version pinned everywhere: an upgrade
fails here, naming each name that moved, rather than as an RPC test's timeout."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from switchyard.rpc.amqp import amqp_urls, connection_parameters
from switchyard.rpc.pika_internals import INTERNALS, PIKA_VERSION
from switchyard.rpc.settings import RpcSettings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def roots() -> Iterator[dict[str, Any]]:
    """A plain pika connection and channel (not ``amqp.connect``'s, whose transport is patched)."""
    url = amqp_urls(RpcSettings.from_env().connections.amqp_url)[0]
    connection = pika.BlockingConnection(connection_parameters(url, "switchyard-pika-internals-test"))
    try:
        yield {"connection": connection, "channel": connection.channel()}
    finally:
        connection.close()


def resolve(path: str, roots: dict[str, Any]) -> Any:
    """The object at ``path``: from a root's name, or the longest importable module prefix."""
    names = path.split(".")
    if names[0] in roots:
        found, rest = roots[names[0]], names[1:]
    else:
        cut = next(i for i in range(len(names), 0, -1) if _importable(".".join(names[:i])))
        found, rest = importlib.import_module(".".join(names[:cut])), names[cut:]
    for name in rest:
        found = getattr(found, name)  # AttributeError: the name is gone
    return found


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def parameters(function: Any) -> str:
    """``name`` or ``name=default`` per parameter, without annotations (and without ``self``)."""
    shown = [name if param.default is inspect.Parameter.empty else f"{name}={param.default!r}"
             for name, param in inspect.signature(function).parameters.items()]
    return ", ".join(shown[1:] if shown[:1] == ["self"] else shown)


def test_every_internal_is_there_with_its_parameters(roots: dict[str, Any]) -> None:
    moved = []
    for internal in INTERNALS:
        try:
            found = resolve(internal.path, roots)
        except AttributeError as exc:
            moved.append(f"{internal.path} ({internal.use}): missing ({exc})")
            continue
        if internal.parameters is not None and parameters(found) != internal.parameters:
            moved.append(f"{internal.path} ({internal.use}): parameters ({parameters(found)}), "
                         f"expected ({internal.parameters})")
    assert not moved, f"pika {pika.__version__} moved what switchyard.rpc.amqp uses:\n" + "\n".join(moved)


def test_the_check_fails_for_a_missing_name_and_a_changed_signature(roots: dict[str, Any]) -> None:
    with pytest.raises(AttributeError):
        resolve("channel._impl.basic_publish_later", roots)
    assert parameters(resolve("channel._impl.basic_ack", roots)) != "delivery_tag=0"


def test_the_lost_connection_error_and_the_transport_are_the_ones_known(roots: dict[str, Any]) -> None:
    from pika.adapters.utils.io_services_utils import _AsyncPlaintextTransport

    assert "error" in resolve("connection._OnClosedArgs._fields", roots)
    assert type(resolve("connection._impl._transport", roots)) is _AsyncPlaintextTransport
    assert resolve("pika.spec.props", roots)[pika.spec.BasicProperties.INDEX] is not None


def test_pika_is_the_version_pinned_everywhere() -> None:
    assert pika.__version__ == PIKA_VERSION
    for name in ("pyproject.toml", "requirements.txt", "constraints.txt"):
        pins = re.findall(r"""^\s*"?pika\s*([=<>!~][^"#,\s]*(?:,[^"#\s]*)?)""", (ROOT / name).read_text(),
                          re.MULTILINE)
        assert pins == [f"=={PIKA_VERSION}"], f"{name}: pika {pins}, expected =={PIKA_VERSION}"
