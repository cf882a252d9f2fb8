"""Slowloris against the local HTTP gateway: how long a new client waits while 1,000 connections drip
a request head, before and after shedding at the connection limit, in one run.

"Before" is ``switchyard/local/http_gateway.py`` as of ``--before`` (a git revision), loaded from
git; "after" is this checkout's. Each serves a one-line handler with ``threads=32`` (``switchyard bus
serve``'s default, so waitress's connection limit is 1,000) and the default head timeout (10 s).
An attacker process (this file with ``--attack``) opens ``--connections`` connections on
127.0.0.1, sends each an incomplete head, then one more header byte per connection every second,
and reopens any the server closes, as slowloris does; it ends when this process closes its stdin,
or after 180 s whatever happens. Then ``--clients`` new clients, one after the other, each on a
fresh connection, time their request's answer (at most 30 s each).

    .venv/bin/python bench/slowloris_bench.py                 # about a minute
    .venv/bin/python bench/slowloris_bench.py --connections 300 --clients 5
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from switchyard.local import http_gateway  # noqa: E402

HEAD = b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Drip: "
ATTACK_MAX_S = 180.0
CLIENT_TIMEOUT_S = 30.0


def ok(_event: dict[str, Any], _context: Any) -> dict[str, Any]:
    return {"statusCode": 200, "body": "ok"}


def attack(port: int, connections: int) -> None:
    """The attacker's process: keep ``connections`` heads dripping until stdin closes; a connection
    the server closes is opened again at once."""
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    deadline = time.monotonic() + ATTACK_MAX_S
    watch = selectors.DefaultSelector()
    opened = 0

    def open_one() -> None:
        nonlocal opened
        while not stop.is_set():
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                sock.sendall(HEAD)
            except OSError:
                continue
            watch.register(sock, selectors.EVENT_READ)
            opened += 1
            return

    for _ in range(connections):
        open_one()
    print("ready", flush=True)
    next_drip = time.monotonic() + 1.0
    while not stop.is_set() and time.monotonic() < deadline:
        for key, _ in watch.select(max(0.0, next_drip - time.monotonic())):
            watch.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]  # closed by the server (EOF or reset)
            open_one()
        if time.monotonic() >= next_drip:
            for key in list(watch.get_map().values()):
                with contextlib.suppress(OSError):
                    key.fileobj.send(b"a")  # type: ignore[union-attr]
            next_drip += 1.0
    print(f"attacker: opened {opened} connection(s), {opened - connections} of them again", flush=True)


def before_module(revision: str) -> ModuleType:
    """``http_gateway`` as of ``revision``, loaded from git under another name."""
    source = subprocess.run(["git", "show", f"{revision}:switchyard/local/http_gateway.py"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "http_gateway_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("http_gateway_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def new_client(url: str) -> float:
    """Seconds until a fresh connection's request is answered (inf: not within CLIENT_TIMEOUT_S)."""
    started = time.monotonic()
    try:
        reply = requests.get(url, headers={"Connection": "close"}, timeout=CLIENT_TIMEOUT_S)
    except requests.RequestException:
        return float("inf")
    return time.monotonic() - started if reply.status_code == 200 else float("inf")


def measure(name: str, module: ModuleType, connections: int, clients: int) -> list[float]:
    with module.HttpGateway(ok, threads=32) as gateway:
        alone = new_client(f"{gateway.url}/fresh")
        command = [sys.executable, __file__, "--attack", str(gateway.port), str(connections)]
        attacker = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert attacker.stdout is not None and attacker.stdin is not None
        try:
            assert attacker.stdout.readline().strip() == "ready"
            server = gateway._server
            room = min(connections, server.adj.connection_limit - 2)  # its listener and wake-up pipe count
            ready_by = time.monotonic() + 20
            while len(server.active_channels) < room and time.monotonic() < ready_by:
                time.sleep(0.05)  # the server accepting what the kernel queued for it
            held = len(server.active_channels)
            waits = [new_client(f"{gateway.url}/fresh") for _ in range(clients)]
        finally:
            attacker.stdin.close()
            print(f"  {attacker.stdout.read().strip()}")
            attacker.wait(10)
        print(f"{name}: alone {alone * 1000:.1f} ms; with {connections} dripping heads ({held} connections "
              f"open, limit {server.adj.connection_limit}): a new client answered in "
              + ", ".join(f"{w:.3f} s" if w != float("inf") else f">{CLIENT_TIMEOUT_S:g} s" for w in waits)
              + f"; heads cut {server.heads_cut}, shed {getattr(server, 'shed', 0)}")
        return waits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=1000, help="dripping connections")
    parser.add_argument("--clients", type=int, default=3, help="new clients timed, one after the other")
    parser.add_argument("--before", default="c4c7040", help="git revision of the code before the change")
    parser.add_argument("--attack", nargs=2, type=int, metavar=("PORT", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.attack:
        attack(*args.attack)
        return 0
    measure(f"before ({args.before})", before_module(args.before), args.connections, args.clients)
    measure("after", http_gateway, args.connections, args.clients)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
