"""Certificate authorities shipped with the package, so that every host (the Lambda layer, the worker
image, an operator's laptop) verifies servers against the same files, with no download at run time.

``RDS_CA_BUNDLE``: the Amazon RDS root CAs of every Region (scripts/rds_ca_bundle.py writes it), which
the delay store gives libpq as ``sslrootcert`` when its DSN asks for ``verify-ca``/``verify-full``.
"""

from __future__ import annotations

from pathlib import Path

RDS_CA_BUNDLE = Path(__file__).resolve().with_name("rds-global-bundle.pem")
