"""Data streams outside Redis: requests and responses carry ``StreamRef``s, never the bytes.

Halibut's IStoreDataStreamsForDistributedQueues, as a small interface with two implementations:
a local directory (one node, or nodes sharing a disk) and S3 (any number of nodes). A reference
records size and SHA-256, so a reader detects a stream that was changed or cut short.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from switchyard.core.errors import ConfigError
from switchyard.pending.errors import StreamError
from switchyard.pending.settings import PENDING

CHUNK = 1024 * 1024


@dataclass(frozen=True)
class StreamRef:
    """Where one stream lives and what it must read back as."""

    id: str
    name: str
    size: int
    sha256: str
    location: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Any) -> StreamRef:
        """A reference from a message; StreamError (not KeyError) when it is malformed."""
        try:
            return cls(id=str(raw["id"]), name=str(raw["name"]), size=int(raw["size"]),
                       sha256=str(raw["sha256"]), location=str(raw["location"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise StreamError(f"malformed stream reference {raw!r}: {exc}") from exc


class _Hashing:
    """A reader that hashes and counts what passes through it (so a stream is read once)."""

    def __init__(self, source: BinaryIO) -> None:
        self._source, self.size, self._hash = source, 0, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self._source.read(n)
        self.size += len(data)
        self._hash.update(data)
        return data

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()


def _as_file(data: bytes | BinaryIO) -> BinaryIO:
    import io

    return io.BytesIO(data) if isinstance(data, bytes | bytearray | memoryview) else data


class StreamStore(ABC):
    """Store, read and delete streams by reference."""

    @abstractmethod
    def put(self, name: str, data: bytes | BinaryIO) -> StreamRef:
        """Store ``data`` (bytes or a binary file, read once) and return its reference."""

    @abstractmethod
    def _read_raw(self, ref: StreamRef) -> bytes: ...

    @abstractmethod
    def delete(self, ref: StreamRef) -> None:
        """Remove a stream; removing one that is gone is not an error."""

    def read(self, ref: StreamRef) -> bytes:
        """The stream's bytes, checked against the reference's size and SHA-256."""
        data = self._read_raw(ref)
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
            raise StreamError(f"stream {ref.id} ({ref.name}) does not match its reference "
                              f"({len(data)} bytes read, {ref.size} expected)")
        return data


class LocalDirectoryStore(StreamStore):
    """Streams as files under one directory (written to a temporary name, then renamed)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, ref_id: str) -> Path:
        if not ref_id.isalnum():
            raise StreamError(f"bad stream id {ref_id!r}")
        return self.root / ref_id

    def put(self, name: str, data: bytes | BinaryIO) -> StreamRef:
        ref_id = uuid.uuid4().hex
        reader = _Hashing(_as_file(data))
        with tempfile.NamedTemporaryFile(dir=self.root, prefix=".tmp-", delete=False) as tmp:
            shutil.copyfileobj(reader, tmp, CHUNK)
        os.replace(tmp.name, self._path(ref_id))
        return StreamRef(ref_id, name, reader.size, reader.sha256, f"file://{self._path(ref_id)}")

    def _read_raw(self, ref: StreamRef) -> bytes:
        try:
            return self._path(ref.id).read_bytes()
        except FileNotFoundError as exc:
            raise StreamError(f"stream {ref.id} ({ref.name}) is not in {self.root}") from exc

    def delete(self, ref: StreamRef) -> None:
        self._path(ref.id).unlink(missing_ok=True)


class S3StreamStore(StreamStore):
    """Streams as objects ``s3://bucket/prefix<id>`` (multipart upload for large ones, by boto3)."""

    def __init__(self, bucket: str, prefix: str = "", client: Any = None,
                 endpoint_url: str | None = None) -> None:
        import boto3

        self.bucket, self.prefix = bucket, prefix
        self.client = client or boto3.client("s3", endpoint_url=endpoint_url)

    def _key(self, ref_id: str) -> str:
        return f"{self.prefix}{ref_id}"

    def put(self, name: str, data: bytes | BinaryIO) -> StreamRef:
        from botocore.exceptions import BotoCoreError, ClientError

        ref_id = uuid.uuid4().hex
        reader = _Hashing(_as_file(data))
        try:
            self.client.upload_fileobj(reader, self.bucket, self._key(ref_id))
        except (BotoCoreError, ClientError) as exc:
            raise StreamError(f"could not store stream {name!r} in s3://{self.bucket}: {exc}") from exc
        return StreamRef(ref_id, name, reader.size, reader.sha256, f"s3://{self.bucket}/{self._key(ref_id)}")

    def _read_raw(self, ref: StreamRef) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(ref.id))["Body"].read()
        except (BotoCoreError, ClientError) as exc:
            raise StreamError(f"could not read stream {ref.id} ({ref.name}) "
                              f"from s3://{self.bucket}: {exc}") from exc

    def delete(self, ref: StreamRef) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(ref.id))


def store_from_uri(uri: str, endpoint_url: str | None = None) -> StreamStore | None:
    """``SWITCHYARD_PENDING_STORE``: "" (no streams), ``s3://bucket/prefix`` or a directory path."""
    if not uri:
        return None
    if uri.startswith("s3://"):
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        if not bucket:
            raise ConfigError(f"{PENDING['store'].name} {uri!r} names no bucket")
        return S3StreamStore(bucket, prefix, endpoint_url=endpoint_url)
    if "://" in uri:
        raise ConfigError(f"{PENDING['store'].name} must be s3://bucket/prefix or a directory, got {uri!r}")
    return LocalDirectoryStore(uri)
