"""Package the publish job for EMR Serverless (``switchyard spark package``).

The archive is the job's Python environment: ``lib/python3.11/site-packages`` holding the core
package and its pinned runtime dependencies (``requirements.txt`` + ``constraints.txt``; never
pyspark, which EMR provides), installed by pip for EMR's Linux rather than this machine's
(``--platform`` manylinux tags up to glibc 2.34, Amazon Linux 2023's; ``--python-version 3.11``;
``--only-binary=:all:``), and ``bin/python``, a launcher that runs the image's ``python3.11``
with those packages first on its path. EMR 7.x images ship Python 3.9 only, so the application
runs a custom image that adds ``python3.11`` (``scripts/emr-image.Dockerfile``; docs/deployment.md). Building
the interpreter into the archive instead would need an Amazon Linux build host (Docker); this way
nothing here depends on one, and the archive is the same bytes for the same inputs.

The archive and the entry point are uploaded under content-addressed names (a running job never
sees its files replaced), and ``<prefix>/latest.json`` names them for ``spark submit --bucket``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import switchyard
from switchyard.spark.emr import (
    MANIFEST_NAME,
    STACK_OUTPUTS,
    bucket_location,
    resolve,
    stack_outputs,
)
from switchyard.spark.errors import InvalidJobInputError, PackagingError
from switchyard.spark.settings import BUCKET_ENV, EMR_PYTHON, EmrSettings

PYTHON_VERSION = "3.11"  # the project's (requires-python >= 3.11); the custom image installs the same
# Wheels pip may pick: Amazon Linux 2023 (EMR 7.x) has glibc 2.34, x86_64 (the application's default).
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64")
PYTHON_ENV = EMR_PYTHON.name  # read by the launcher on EMR: the interpreter to run

PACKAGE_DIR = Path(switchyard.__file__).resolve().parent  # what the archive ships as `switchyard`
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ENTRY_POINT = ROOT / "jobs" / "publish_requests.py"
DEFAULT_REQUIREMENTS = ROOT / "requirements.txt"
DEFAULT_CONSTRAINTS = ROOT / "constraints.txt"

LAUNCHER = f"""#!/bin/sh
# Python of this packaged environment (switchyard spark package): the image's python{PYTHON_VERSION}
# (${PYTHON_ENV} overrides) with the archive's site-packages ahead of whatever PYTHONPATH Spark set.
env_dir=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
py=${{{PYTHON_ENV}:-python{PYTHON_VERSION}}}
if ! command -v "$py" >/dev/null 2>&1; then
    echo "switchyard environment: $py not found; run the application on the image built from" \\
         "scripts/emr-image.Dockerfile (docs/deployment.md: Submit the pipeline to EMR Serverless)" >&2
    exit 127
fi
PYTHONPATH="$env_dir/lib/python{PYTHON_VERSION}/site-packages${{PYTHONPATH:+:$PYTHONPATH}}" exec "$py" "$@"
"""


def site_packages(env_dir: Path) -> Path:
    return env_dir / "lib" / f"python{PYTHON_VERSION}" / "site-packages"


def pip_install_command(target: Path, requirements: Sequence[Path], constraints: Path | None,
                        pip_options: Sequence[str] = ()) -> list[str]:
    """pip, installing for EMR's platform and Python rather than this machine's."""
    command = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q",
               "--target", str(target), "--implementation", "cp", "--python-version", PYTHON_VERSION,
               "--only-binary=:all:"]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    for req in requirements:
        command += ["-r", str(req)]
    if constraints:
        command += ["-c", str(constraints)]
    return [*command, *pip_options]


def _reproducible(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    if "__pycache__" in info.name.split("/") or info.name.endswith(".pyc"):
        return None
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def write_archive(env_dir: Path, output: Path) -> None:
    """tar.gz of ``env_dir``'s contents at the archive's root (Spark unpacks it as ``./environment``),
    in sorted order without times or owners, so the same inputs give the same bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(env_dir.rglob("*")):
            if path.is_dir() and not path.is_symlink():
                continue
            tar.add(path, arcname=path.relative_to(env_dir).as_posix(), recursive=False, filter=_reproducible)
    with output.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write(buffer.getvalue())


def build_environment(
    output_dir: Path,
    *,
    requirements: Sequence[Path] = (DEFAULT_REQUIREMENTS,),
    constraints: Path | None = DEFAULT_CONSTRAINTS,
    pip_options: Sequence[str] = (),
    package_dir: Path = PACKAGE_DIR,
) -> Path:
    """Build the environment archive in ``output_dir``; returns its path (named after its content)."""
    for path in (*requirements, *([constraints] if constraints else [])):
        if not path.is_file():
            raise PackagingError(f"requirements file {path} does not exist")
    output_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output_dir, prefix=".env-") as tmp:
        env_dir = Path(tmp)
        target = site_packages(env_dir)
        target.mkdir(parents=True)
        if requirements:
            command = pip_install_command(target, requirements, constraints, pip_options)
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                raise PackagingError(
                    f"pip could not install the requirements for CPython {PYTHON_VERSION} on "
                    f"{', '.join(PLATFORMS)} (a dependency without such a binary wheel cannot run on EMR "
                    f"as built here):\n{done.stderr.strip() or done.stdout.strip()}")
        if any(target.glob("pyspark*")):
            raise PackagingError("pyspark ended up in the environment; EMR provides its own, keep it out "
                                 "of the requirements given to `spark package`")
        shutil.copytree(package_dir, target / "switchyard",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        launcher = env_dir / "bin" / "python"
        launcher.parent.mkdir()
        launcher.write_text(LAUNCHER)
        launcher.chmod(0o755)
        staged = env_dir.with_suffix(".tar.gz")
        write_archive(env_dir, staged)
    digest = _sha256(staged)[:12]
    archive = output_dir / f"switchyard-env-py{PYTHON_VERSION.replace('.', '')}-{digest}.tar.gz"
    os.replace(staged, archive)
    return archive


def _sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()


def upload(s3: Any, bucket: str, archive: Path, entry_point: Path) -> dict[str, str]:
    """Upload the archive and the entry point under ``bucket`` and record them in its manifest."""
    from botocore.exceptions import BotoCoreError, ClientError

    if not entry_point.is_file():
        raise PackagingError(f"entry point {entry_point} does not exist")
    name, prefix = bucket_location(bucket)
    keys = {
        "archive": f"{prefix}/env/{archive.name}",
        "entryPoint": f"{prefix}/jobs/{_sha256(entry_point)[:12]}/{entry_point.name}",
    }
    manifest = {kind: f"s3://{name}/{key}" for kind, key in keys.items()}
    manifest["pythonVersion"] = PYTHON_VERSION
    try:
        s3.upload_file(str(archive), name, keys["archive"])
        s3.upload_file(str(entry_point), name, keys["entryPoint"])
        s3.put_object(Bucket=name, Key=f"{prefix}/{MANIFEST_NAME}", ContentType="application/json",
                      Body=json.dumps(manifest, indent=2).encode())
    except (BotoCoreError, ClientError) as exc:
        raise PackagingError(f"upload to s3://{name}/{prefix}/ failed: {exc}") from exc
    return manifest


def cmd_package(args: argparse.Namespace) -> int:
    outputs = stack_outputs(args.stack) if getattr(args, "stack", None) else {}
    bucket = resolve(args.bucket, EmrSettings.from_env().bucket, outputs, STACK_OUTPUTS["bucket"])
    if not bucket and not args.no_upload:
        raise InvalidJobInputError(f"--bucket (or {BUCKET_ENV}, or --stack) is required to upload; "
                                   "--no-upload only builds")
    if bucket:
        bucket_location(bucket)  # a bad bucket fails before the build, not after it
    started = time.monotonic()
    if args.archive:
        archive = Path(args.archive)
        if not archive.is_file():
            raise InvalidJobInputError(f"--archive {archive} does not exist")
    else:
        requirements = [Path(r) for r in args.requirements or [DEFAULT_REQUIREMENTS]]
        archive = build_environment(Path(args.output), requirements=requirements,
                                    constraints=Path(args.constraints) if args.constraints else None,
                                    pip_options=args.pip_option)
        print(f"built {archive} ({archive.stat().st_size / 1e6:.1f} MB, {time.monotonic() - started:.0f} s)")
    if args.no_upload:
        return 0
    import boto3

    # Uploading without a bucket was refused above.
    manifest = upload(boto3.client("s3"), cast(str, bucket), archive, Path(args.entry_point))
    print(f"uploaded; submit with these (or just --bucket {bucket}, which reads them from {MANIFEST_NAME}):")
    print(f"  --entry-point {manifest['entryPoint']}")
    print(f"  --archive {manifest['archive']}")
    return 0


def add_package_parser(spark_subparsers: argparse._SubParsersAction) -> None:
    """``package`` under the ``switchyard spark`` group."""
    package = spark_subparsers.add_parser(
        "package",
        help="build the job's Python environment for EMR Serverless and upload it with the entry point")
    package.add_argument("--bucket", help=f"s3://BUCKET[/prefix] to upload to (default: {BUCKET_ENV}, or the "
                                          "--stack output PipelineBucket; prefix default switchyard/spark)")
    package.add_argument("--output", default="dist/spark",
                         help="where the archive is built (default dist/spark)")
    package.add_argument("--requirements", action="append", default=None, metavar="FILE",
                         help="pip requirements of the environment (repeatable; default requirements.txt)")
    package.add_argument("--constraints", default=str(DEFAULT_CONSTRAINTS),
                         help="pip constraints (default constraints.txt; '' for none)")
    package.add_argument("--pip-option", action="append", default=[], metavar="OPT",
                         help="extra pip install option, e.g. --pip-option=--no-index (repeatable)")
    package.add_argument("--entry-point", default=str(DEFAULT_ENTRY_POINT), help="the job's entry point file")
    package.add_argument("--archive", help="upload this prebuilt archive instead of building one")
    package.add_argument("--no-upload", action="store_true", help="only build the archive")
    package.set_defaults(func=cmd_package)
