"""The job's store: where its rows come from (``--input``) and go (``--output``), when that is S3.

Spark reads and writes local paths itself, and on EMR Serverless ``s3://`` too (EMRFS); this module
is the one that talks to S3 directly. Spark's pip package has no S3 filesystem (hadoop-aws is not in
it), so a local master stages ``s3://`` paths through a local directory: the input objects are
downloaded with boto3 (``AWS_ENDPOINT_URL``: LocalStack or moto locally) before the job, and the
output directory is uploaded after it. Meant for the sizes a laptop run handles. boto3's errors
leave here as ``StoreError`` (from the original).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from switchyard.spark.emr import parse_s3_uri
from switchyard.spark.errors import StoreError

S3_SCHEMES = ("s3://", "s3a://")


def is_s3(path: str) -> bool:
    """Whether ``path`` is in S3 (a local master stages it; EMR's Spark reads it itself)."""
    return path.startswith(S3_SCHEMES)


def _bucket_key(uri: str, what: str) -> tuple[str, str]:
    return parse_s3_uri("s3://" + uri.split("://", 1)[1], what)


@contextmanager
def _s3_errors(action: str) -> Iterator[None]:
    """boto3's errors (a missing object or bucket, refused access, no endpoint) as StoreError."""
    from boto3.exceptions import Boto3Error  # S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (Boto3Error, BotoCoreError, ClientError) as exc:
        raise StoreError(f"{action} failed: {exc}") from exc


def _s3() -> Any:
    import boto3

    return boto3.client("s3")


def _objects(s3: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [item["Key"] for item in page.get("Contents", [])]
    return keys


def download(uri: str, into: Path, what: str = "--input", *, prefix_only: bool = False) -> Path | None:
    """The object ``uri`` names, or every object under it as a prefix, copied under ``into``.

    ``prefix_only``: only a prefix, and None when nothing is under it (an output not written yet).
    """
    bucket, key = _bucket_key(uri, what)
    with _s3_errors(f"reading {uri} ({what})"):
        return _download(_s3(), bucket, key, Path(into), prefix_only)


def _download(s3: Any, bucket: str, key: str, into: Path, prefix_only: bool) -> Path | None:
    into.mkdir(parents=True, exist_ok=True)
    prefix = key.rstrip("/") + "/" if key else ""
    keys = [k for k in _objects(s3, bucket, prefix) if not k.endswith("/")]
    if not keys and prefix_only:
        return None
    if not keys:  # not a prefix: one object (a missing one fails here, with its name)
        target = into / Path(key).name
        s3.download_file(bucket, key, str(target))
        return target
    for name in keys:
        target = into / name[len(prefix):]
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, name, str(target))
    return into


def upload(local: Path, uri: str, replace: tuple[str, ...] = ()) -> int:
    """Copy the files under ``local`` to the prefix ``uri``; first delete the objects under the
    sub-prefixes named in ``replace`` (an overwrite). Returns the number of files uploaded."""
    bucket, key = _bucket_key(uri, "--output")
    with _s3_errors(f"writing {uri} (--output)"):
        return _upload(_s3(), Path(local), bucket, key.rstrip("/") + "/" if key else "", replace)


def _upload(s3: Any, local: Path, bucket: str, prefix: str, replace: tuple[str, ...]) -> int:
    for sub in replace:
        stale = _objects(s3, bucket, f"{prefix}{sub}/")
        for start in range(0, len(stale), 1000):
            batch = [{"Key": k} for k in stale[start:start + 1000]]
            s3.delete_objects(Bucket=bucket, Delete={"Objects": batch})
    files = [f for f in local.rglob("*") if f.is_file() and not f.name.endswith(".crc")]
    for path in files:
        s3.upload_file(str(path), bucket, prefix + path.relative_to(local).as_posix())
    return len(files)


def workdir() -> tempfile.TemporaryDirectory:
    """Where a local run stages its S3 input and output (removed when the run ends)."""
    return tempfile.TemporaryDirectory(prefix="switchyard-spark-")
