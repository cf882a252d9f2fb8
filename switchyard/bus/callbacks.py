"""Where a subscriber's callback may point (issue 23): the rules the API checks at subscribe time
and the worker checks again, on the address it is about to connect to, at every new connection.

Why both, and why at connect: a client chooses its callback, and the bus workers sit inside the
network (on Fargate they reach the ECS task metadata endpoint 169.254.170.2, the VPC's databases,
...). A check of the name at subscribe time proves nothing about what it resolves to later (DNS
rebinding), so the worker resolves the name once per connection, refuses every non-public address
among the answers, and connects to an address it checked (``callback_http``); the URL is parsed
by urllib3's ``parse_url``, the parser of the connection itself, so check and connect cannot see
two different hosts (``http://A:Q\\@B:P/`` is host B to ``urlsplit`` and A to urllib3).

Refused, unless the operator's allowlist (``SWITCHYARD_BUS_CALLBACK_ALLOW``) names them: loopback,
private (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7), link-local (169.254/16, fe80::/10),
unspecified, multicast, reserved and every other not globally routable range, IPv6 outside
2000::/3, and IPv4 addresses inside IPv6 (``::ffff:a.b.c.d``, ``::a.b.c.d``, NAT64
``64:ff9b::/96``, 6to4 ``2002::/16``) judged as the IPv4 address they carry.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from switchyard.bus.errors import CallbackError, CallbackRefusedError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Sequence[str]]  # (host, port) -> the addresses it resolves to

_PRINTABLE_ASCII = re.compile(r"[\x21-\x7e]*")
# Special-purpose ranges some Python versions call global (their tables changed across patch releases):
# carrier-grade NAT, IETF protocol assignments, benchmarking, NAT64 for local use.
_SPECIAL = tuple(ipaddress.ip_network(n) for n in ("100.64.0.0/10", "192.0.0.0/24", "198.18.0.0/15",
                                                  "64:ff9b:1::/48"))
_GLOBAL_V6 = ipaddress.IPv6Network("2000::/3")  # every other IPv6 range is local, reserved or special
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # well-known prefix: a public IPv4 address, translated
_COMPATIBLE_V6 = ipaddress.IPv6Network("::/96")  # deprecated IPv4-compatible form


def refusal(ip: IPAddress) -> str | None:
    """Why the bus may not connect to ``ip`` (None: a public address)."""
    if isinstance(ip, ipaddress.IPv6Address):
        carried = _carried_ipv4(ip)
        if carried is not None:
            reason = refusal(carried)
            return f"{reason} ({carried} inside {ip})" if reason else None
    for reason, hit in (("loopback", ip.is_loopback), ("unspecified", ip.is_unspecified),
                        ("link-local", ip.is_link_local), ("multicast", ip.is_multicast),
                        ("private", ip.is_private), ("reserved", ip.is_reserved),
                        ("special-purpose", any(ip in net for net in _SPECIAL))):
        if hit:
            return f"{reason} address {ip}"
    if not ip.is_global or (isinstance(ip, ipaddress.IPv6Address) and ip not in _GLOBAL_V6):
        return f"not globally routable address {ip}"
    return None


def _carried_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or (ip in _COMPATIBLE_V6 and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


@dataclass(frozen=True)
class AllowEntry:
    """One allowlist entry: a network (matched against the address connected to) or a host name
    (matched against the URL's host), on any port or on one."""

    network: IPNetwork | None = None
    host: str | None = None
    port: int | None = None

    def admits(self, host: str, port: int, ip: IPAddress) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.network is not None:
            return ip.version == self.network.version and ip in self.network
        return host == self.host


@dataclass(frozen=True)
class Allowlist:
    """Internal destinations an operator lets callbacks reach (``SWITCHYARD_BUS_CALLBACK_ALLOW``)."""

    entries: tuple[AllowEntry, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Allowlist:
        """Comma-separated ``host``, ``host:port``, ``address``, ``address:port`` (IPv6 in brackets
        when with a port) or ``network/prefix``; raises ValueError naming a bad entry."""
        entries = []
        for raw in filter(None, (part.strip() for part in text.split(","))):
            entries.append(_allow_entry(raw))
        return cls(tuple(entries))

    def admits(self, host: str, port: int, ip: IPAddress) -> bool:
        return any(entry.admits(host, port, ip) for entry in self.entries)


def _allow_entry(raw: str) -> AllowEntry:
    bare = raw[1:-1] if raw.startswith("[") and raw.endswith("]") else raw
    try:
        return AllowEntry(network=ipaddress.ip_network(bare, strict=False))
    except ValueError:
        pass
    try:
        url = parse_url("//" + raw)
    except LocationParseError as exc:
        raise ValueError(f"allowlist entry {raw!r} is not host[:port] or a network: {exc}") from None
    if not url.host or url.path or url.auth:
        raise ValueError(f"allowlist entry {raw!r} is not host[:port] or a network")
    host = normalized_host(url.host)
    try:
        return AllowEntry(network=ipaddress.ip_network(host), port=url.port)
    except ValueError:
        return AllowEntry(host=host, port=url.port)


def normalized_host(host: str) -> str:
    """Lower case, no IPv6 brackets, no trailing dot: how hosts are compared."""
    return host.strip("[]").rstrip(".").lower()


@dataclass(frozen=True)
class CallbackTarget:
    """A callback URL as urllib3 will connect to it."""

    scheme: str
    host: str  # normalized: lower case, no brackets, no trailing dot
    port: int
    request_uri: str

    @property
    def origin(self) -> tuple[str, str, int]:
        return self.scheme, self.host, self.port


def parse_callback(url: str, *, allow_http: bool) -> CallbackTarget:
    """The callback as the connection will see it, or CallbackRefusedError: https (http only to a
    loopback host, and only when ``allow_http``), a host, no query string, no backslash."""
    if not _PRINTABLE_ASCII.fullmatch(url):
        raise CallbackRefusedError("URL has spaces or characters outside printable ASCII")
    if "\\" in url:
        raise CallbackRefusedError("URL has a backslash (parsers disagree on where its host ends)")
    try:
        parts = parse_url(url)
    except LocationParseError as exc:
        raise CallbackRefusedError(f"URL is malformed: {exc}") from None
    if not parts.host:
        raise CallbackRefusedError("URL has no host")
    if parts.query is not None or "?" in url:
        raise CallbackRefusedError("URL has query string")
    host = normalized_host(parts.host)
    if parts.scheme == "http" and not (allow_http and _is_loopback_host(host)):
        raise CallbackRefusedError("URL is not HTTPS")
    if parts.scheme not in ("http", "https"):
        raise CallbackRefusedError("URL is not HTTPS")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return CallbackTarget(parts.scheme, host, port, parts.request_uri)


def _is_loopback_host(host: str) -> bool:
    ip = literal_address(host)
    return ip.is_loopback if ip is not None else _is_loopback_name(host)


def _is_loopback_name(host: str) -> bool:
    """RFC 6761: ``localhost`` and its subdomains are always loopback, whatever DNS says."""
    return host == "localhost" or host.endswith(".localhost")


def literal_address(host: str) -> IPAddress | None:
    """``host`` as an address if it is one in any form the resolver accepts (``127.1``,
    ``2130706433``, ``0x7f.1`` are 127.0.0.1 to inet_aton), else None (a name)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if re.fullmatch(r"[0-9a-fx.]+", host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def check_subscription(url: str, *, allow_http: bool, allowlist: Allowlist) -> CallbackTarget:
    """What the API checks when a client subscribes: the URL's form, and its host if it is an
    address (or a name that is always loopback). Names are resolved only at delivery, where it counts."""
    target = parse_callback(url, allow_http=allow_http)
    ip = literal_address(target.host)
    if ip is None and _is_loopback_name(target.host):
        ip = ipaddress.IPv4Address("127.0.0.1")
    if ip is not None and not allowlist.admits(target.host, target.port, ip):
        reason = refusal(ip)
        if reason:
            raise CallbackRefusedError(f"callback host {target.host} is internal: {reason}")
    return target


class BoundedLookups:
    """Name lookups the caller waits for at most ``timeout_s``.

    Why a thread: ``getaddrinfo`` cannot be interrupted (no socket to shut, no timeout argument),
    and a callback's DNS server that answers slowly or not at all held a delivery thread for the
    resolver's own retries (5 s per attempt and server), outside the delivery's deadline. Each
    lookup runs on a daemon thread; a lookup still running is shared by every caller asking for the
    same name, so a slow name costs one thread, not one per delivery. A literal address is looked
    up in place (no DNS query leaves the machine for it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[tuple[Resolver, str, int], Future[Sequence[str]]] = {}

    def resolve(self, resolver: Resolver, host: str, port: int, timeout_s: float) -> Sequence[str]:
        if literal_address(host) is not None:
            return resolver(host, port)
        key = (resolver, host, port)
        with self._lock:
            future = self._running.get(key)
            if future is None:
                future = self._running[key] = Future()
                threading.Thread(target=self._run, args=(key, future), name="bus-dns", daemon=True).start()
        try:
            return future.result(max(0.0, timeout_s))
        except FutureTimeout:
            raise CallbackError(f"cannot resolve {host} within {timeout_s:g} s") from None

    def _run(self, key: tuple[Resolver, str, int], future: Future[Sequence[str]]) -> None:
        resolver, host, port = key
        answers: Sequence[str] = ()
        error: BaseException | None = None
        try:
            answers = resolver(host, port)
        except BaseException as exc:  # handed to the waiters (a CallbackError, or what the resolver raised)
            error = exc
        with self._lock:  # done: the next lookup of this name asks afresh
            del self._running[key]
        if error is None:
            future.set_result(answers)
        else:
            future.set_exception(error)


LOOKUPS = BoundedLookups()
LOOKUP_TIMEOUT_S = 5.0  # when the caller gives none


def system_resolver(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to now, in the resolver's order."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise CallbackError(f"cannot resolve {host}: {exc}") from exc
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class AddressPolicy:
    """Resolves a callback host and returns the addresses the bus may connect to."""

    allowlist: Allowlist = Allowlist()
    resolver: Resolver = system_resolver

    def addresses(self, host: str, port: int, timeout_s: float = LOOKUP_TIMEOUT_S) -> list[str]:
        """Every address ``host`` resolves to (within ``timeout_s``), all checked;
        CallbackRefusedError if any is internal and not allowed (a name that answers with one
        internal address is not trusted with any)."""
        host = normalized_host(host)
        answers = LOOKUPS.resolve(self.resolver, host, port, timeout_s)
        if not answers:
            raise CallbackError(f"{host} resolves to no address")
        checked = []
        for answer in answers:
            ip = ipaddress.ip_address(answer.split("%", 1)[0])
            if not self.allowlist.admits(host, port, ip):
                reason = refusal(ip)
                if reason:
                    raise CallbackRefusedError(f"callback host {host} is internal: {reason}")
            checked.append(str(ip))
        return checked
