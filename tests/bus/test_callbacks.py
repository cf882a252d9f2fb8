"""The callback rules alone (``switchyard.bus.callbacks``) and the client that applies them
(``callback_http``): every address form, the allowlist, the parser, DNS rebinding through an
injected resolver (never real DNS off the machine), and HTTPS to a checked address with the name
kept for SNI and Host. Connections go to 127.0.0.0/8 only."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from switchyard.bus.callback_http import CallbackClient
from switchyard.bus.callbacks import (
    AddressPolicy,
    Allowlist,
    CallbackError,
    CallbackRefusedError,
    CallbackTarget,
    check_subscription,
    parse_callback,
    refusal,
)
from switchyard.bus.settings import BusSettings
from switchyard.core.errors import ConfigError
from tests.bus.servers import TestServer, no_content_then_close
from tests.conftest import wait_for

REFUSED = [
    "127.0.0.1", "127.255.255.254", "::1", "0.0.0.0", "::", "10.0.0.1", "10.255.255.255", "172.16.0.1",
    "172.31.255.255", "192.168.0.1", "192.168.255.255", "100.64.0.1", "100.127.255.254", "169.254.169.254",
    "169.254.170.2", "169.254.0.1", "fe80::1", "fd00::1", "fd12:3456::1", "fc00::1", "fec0::1", "224.0.0.1",
    "239.255.255.250", "ff02::1", "ff0e::1", "240.0.0.1", "255.255.255.255", "192.0.0.8", "198.18.0.1",
    "192.0.2.1", "2001:db8::1", "100::1",
    # IPv4 inside IPv6: mapped, compatible, NAT64 (well-known and local-use), 6to4
    "::ffff:127.0.0.1", "::ffff:7f00:1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "::ffff:0.0.0.0",
    "::127.0.0.1", "::10.0.0.1", "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "64:ff9b::a00:1",
    "64:ff9b:1::a00:1", "2002:7f00:1::1", "2002:a9fe:a9fe::1", "2002:c0a8:101::1",
]
PUBLIC = ["8.8.8.8", "1.1.1.1", "172.32.0.1", "100.128.0.1", "2606:4700:4700::1111", "2a00:1450:4001::1",
          "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1"]


@pytest.mark.parametrize("address", REFUSED)
def test_every_internal_address_form_is_refused(address):
    assert refusal(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_pass(address):
    assert refusal(ipaddress.ip_address(address)) is None


class Resolver:
    """An injected resolver: answers per name, a list per call (rebinding), and counts calls."""

    def __init__(self, **answers: list[list[str]]) -> None:
        self.answers = {name.replace("_", "."): list(seq) for name, seq in answers.items()}
        self.calls: list[str] = []

    def __call__(self, host: str, _port: int) -> list[str]:
        self.calls.append(host)
        if host not in self.answers:  # an address: itself, as getaddrinfo answers
            return [str(ipaddress.ip_address(host))]
        seq = self.answers[host]
        return seq.pop(0) if len(seq) > 1 else seq[0]


def test_a_name_is_judged_by_every_address_it_resolves_to():
    policy = AddressPolicy(Allowlist(), Resolver(hooks_example=[["8.8.8.8"]], inside_example=[["127.0.0.1"]],
                                                  mixed_example=[["8.8.4.4", "10.1.2.3"]]))
    assert policy.addresses("hooks.example", 443) == ["8.8.8.8"]
    assert policy.addresses("HOOKS.example.", 443) == ["8.8.8.8"]  # case and trailing dot
    for name in ("inside.example", "mixed.example"):
        with pytest.raises(CallbackRefusedError, match="internal"):
            policy.addresses(name, 443)


def test_dns_rebinding_public_then_loopback_is_refused_at_the_second_resolution():
    policy = AddressPolicy(Allowlist(), Resolver(rebind_example=[["93.184.216.34"], ["127.0.0.1"]]))
    assert policy.addresses("rebind.example", 443) == ["93.184.216.34"]  # no connection made here
    with pytest.raises(CallbackRefusedError, match="loopback"):
        policy.addresses("rebind.example", 443)


@pytest.mark.parametrize("literal", ["127.1", "2130706433", "0x7f.0.0.1", "0x7f000001", "017700000001",
                                     "localhost", "[::1]", "[::ffff:127.0.0.1]", "0"])
def test_literal_forms_the_system_resolver_turns_into_loopback_are_refused(literal):
    """Resolved on this machine (inet_aton and /etc/hosts): no DNS query leaves it."""
    with pytest.raises(CallbackRefusedError):
        AddressPolicy().addresses(literal, 443)
    with pytest.raises(CallbackRefusedError):
        check_subscription(f"https://{literal}/cb", allow_http=False, allowlist=Allowlist())


def test_the_allowlist_admits_what_it_names_and_nothing_else():
    allow = Allowlist.parse("10.1.0.0/16, 127.0.0.1:8080, hooks.internal, [fd00::5]:443, ::1")
    resolver = Resolver(hooks_internal=[["10.9.9.9"]], other_internal=[["10.9.9.9"]])
    policy = AddressPolicy(allow, resolver)
    assert policy.addresses("10.1.2.3", 443) == ["10.1.2.3"]
    assert policy.addresses("127.0.0.1", 8080) == ["127.0.0.1"]
    assert policy.addresses("hooks.internal", 9000) == ["10.9.9.9"]  # the name is trusted, on any port
    assert policy.addresses("fd00::5", 443) == ["fd00::5"]
    assert policy.addresses("::1", 1) == ["::1"]
    for host, port in (("10.2.0.1", 443), ("127.0.0.1", 8081), ("127.0.0.2", 8080), ("other.internal", 9000),
                       ("fd00::5", 80), ("::ffff:127.0.0.1", 8080)):
        with pytest.raises(CallbackRefusedError):
            policy.addresses(host, port)


@pytest.mark.parametrize("bad", ["http://x/y", "a b", "10.0.0.0/33", "user@host", "[::1"])
def test_a_malformed_allowlist_fails_at_start_up(bad):
    with pytest.raises(ConfigError, match="SWITCHYARD_BUS_CALLBACK_ALLOW"):
        BusSettings(callback_allow=bad)


def test_the_parser_is_urllib3s_and_the_backslash_form_is_refused():
    with pytest.raises(CallbackRefusedError, match="backslash"):
        parse_callback("http://203.0.113.5:81\\@127.0.0.1:82/cb", allow_http=True)
    # userinfo: the host is what follows the last '@', for the check as for the connection
    target = parse_callback("https://user:pw@hooks.example:8443/a/b", allow_http=False)
    assert (target.scheme, target.host, target.port, target.request_uri) == ("https", "hooks.example", 8443,
                                                                            "/a/b")
    with pytest.raises(CallbackRefusedError, match="internal"):
        check_subscription("https://hooks.example@127.0.0.2/cb", allow_http=False, allowlist=Allowlist())
    with pytest.raises(CallbackRefusedError, match="HTTPS"):
        parse_callback("http://hooks.example/cb", allow_http=True)  # http only to loopback
    with pytest.raises(CallbackRefusedError, match="HTTPS"):
        parse_callback("http://127.0.0.1/cb", allow_http=False)
    assert parse_callback("http://127.0.0.1:9/cb", allow_http=True).port == 9


@pytest.fixture
def servers() -> Iterator[dict[str, TestServer]]:
    made = {"checked": TestServer("127.0.0.1", answer=no_content_then_close),
            "other": TestServer("127.0.0.2")}
    yield made
    for server in made.values():
        server.close()


def client(resolver: Resolver, allow: str = "127.0.0.1", **kw) -> CallbackClient:
    return CallbackClient(AddressPolicy(Allowlist.parse(allow), resolver), connect_timeout_s=2, deadline_s=5,
                          max_response_bytes=4096, **kw)


def test_the_connection_goes_to_the_address_checked_not_to_a_second_resolution(servers):
    """A name resolving first to an allowed address, then to an internal one: one resolution per
    connection, and the socket opened to what it returned. A check-then-connect client (resolve,
    check, let the HTTP library resolve again) would have posted to 127.0.0.2."""
    checked, other = servers["checked"], servers["other"]
    resolver = Resolver(rebind_test=[["127.0.0.1"], ["127.0.0.2"]])
    c = client(resolver)
    target = CallbackTarget("http", "rebind.test", checked.port, "/cb")  # http: a name, allowed here
    assert c.post(target, b"[]", "u") == 204
    assert resolver.calls == ["rebind.test"]
    assert checked.seen[0].headers["Host"] == f"rebind.test:{checked.port}"
    # the server closed that connection: the next one resolves again, gets 127.0.0.2, and refuses
    with pytest.raises(CallbackRefusedError, match=r"127\.0\.0\.2"):
        c.post(target, b"[]", "u")
    assert resolver.calls == ["rebind.test", "rebind.test"]
    assert other.seen == [] and len(checked.seen) == 1


def test_a_kept_alive_connection_is_reused_without_resolving_again():
    server = TestServer("127.0.0.1")
    try:
        resolver = Resolver(keep_test=[["127.0.0.1"]])
        c = client(resolver)
        target = CallbackTarget("http", "keep.test", server.port, "/cb")
        assert [c.post(target, b"[]", "u") for _ in range(3)] == [204, 204, 204]
        assert resolver.calls == ["keep.test"]
    finally:
        server.close()


def _tls_pair(name: str, tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a self-signed certificate for ``name`` and a client context trusting it."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    (tmp_path / "cert.pem").write_bytes(pem)
    (tmp_path / "key.pem").write_bytes(key_pem)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    client_ctx = ssl.create_default_context(cadata=pem.decode())
    return server, client_ctx


def test_https_to_the_checked_address_keeps_the_name_for_sni_host_and_certificate(tmp_path):
    server_ctx, client_ctx = _tls_pair("callback.test", tmp_path)
    sni: list[str | None] = []
    server_ctx.sni_callback = lambda _sock, name, _ctx: sni.append(name)
    server = TestServer("127.0.0.1", tls=server_ctx)
    try:
        resolver = Resolver(callback_test=[["127.0.0.1"]], wrong_test=[["127.0.0.1"]])
        c = client(resolver, ssl_context=client_ctx)
        target = parse_callback(f"https://callback.test:{server.port}/events", allow_http=False)
        assert c.post(target, b"[]", "u") == 204
        assert sni == ["callback.test"]
        assert server.seen[0].headers["Host"] == f"callback.test:{server.port}"
        # the same address under another name: the certificate does not match it
        wrong = parse_callback(f"https://wrong.test:{server.port}/events", allow_http=False)
        with pytest.raises(ssl.SSLCertVerificationError):
            c.post(wrong, b"[]", "u")
    finally:
        server.close()


def test_an_unresolvable_name_is_a_failed_delivery_not_a_crash():
    with pytest.raises(CallbackError):
        AddressPolicy(Allowlist(), lambda _h, _p: []).addresses("nothing.test", 443)


class SlowDns:
    """A resolver that hangs (a DNS server that never answers) until released, counting lookups."""

    def __init__(self, answer: str = "127.0.0.1") -> None:
        self.answer, self.calls, self.release = answer, 0, threading.Event()

    def __call__(self, host: str, _port: int) -> list[str]:
        self.calls += 1
        self.release.wait(30)
        return [self.answer]


def test_a_name_that_does_not_resolve_in_time_fails_the_delivery_within_its_deadline():
    """getaddrinfo cannot be interrupted: a callback's silent DNS server held a delivery thread for
    the resolver's own retries, outside the delivery's deadline (the watchdog has no socket to shut
    then). Now the delivery fails at its deadline; concurrent deliveries to that name share the one
    lookup still running, and once it answers the name works again."""
    dns = SlowDns()
    c = CallbackClient(AddressPolicy(Allowlist.parse("127.0.0.1"), dns), connect_timeout_s=2, deadline_s=0.5,
                       max_response_bytes=4096)
    server = TestServer("127.0.0.1")
    try:
        target = CallbackTarget("http", "slow-dns.test", server.port, "/cb")
        started = time.monotonic()
        with pytest.raises(CallbackError, match="within"):
            c.post(target, b"[]", "u")
        assert time.monotonic() - started < 1.5
        with pytest.raises(CallbackError, match=r"cannot resolve slow-dns\.test within 0\.2 s"):
            AddressPolicy(Allowlist.parse("127.0.0.1"), dns).addresses("slow-dns.test", server.port, 0.2)
        assert dns.calls == 1, "a lookup still running is shared, not started again"
        dns.release.set()
        # the hung lookup ends; the next delivery resolves afresh
        wait_for(lambda: c.post(target, b"[]", "u") == 204, timeout=5, interval=0.05, ignoring=CallbackError,
                 what="a delivery after the hung lookup")
        assert len(server.seen) == 1 and dns.calls <= 2  # (the released lookup, or one after it)
    finally:
        dns.release.set()
        server.close()
