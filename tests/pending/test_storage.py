"""Stream storage: a local directory and S3 (moto's server on 127.0.0.1:5000, which ./dev starts;
LocalStack arrives with issue 9)."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator

import boto3
import pytest

from switchyard.core.errors import ConfigError
from switchyard.pending.streams import (
    LocalDirectoryStore,
    S3StreamStore,
    StreamError,
    StreamRef,
    StreamStore,
    store_from_uri,
)
from tests.conftest import unique

MOTO = os.environ.get("AWS_ENDPOINT_URL") or "http://127.0.0.1:5000"


@pytest.fixture
def s3_store() -> Iterator[S3StreamStore]:
    client = boto3.client("s3", endpoint_url=MOTO, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
    bucket = unique("streams").replace("_", "-")
    client.create_bucket(Bucket=bucket)
    yield S3StreamStore(bucket, "pending/", client=client)
    for item in client.list_objects_v2(Bucket=bucket).get("Contents", []):
        client.delete_object(Bucket=bucket, Key=item["Key"])
    client.delete_bucket(Bucket=bucket)


@pytest.fixture(params=["directory", "s3"])
def store(request: pytest.FixtureRequest, tmp_path) -> StreamStore:
    if request.param == "directory":
        return LocalDirectoryStore(tmp_path / "streams")
    return request.getfixturevalue("s3_store")


def test_round_trip_bytes_and_files(store: StreamStore) -> None:
    payload = os.urandom(6 * 1024 * 1024 + 17)  # over boto3's multipart threshold
    ref = store.put("big.bin", payload)
    assert (ref.name, ref.size) == ("big.bin", len(payload))
    assert store.read(ref) == payload
    file_ref = store.put("small.txt", io.BytesIO(b"hello"))
    assert store.read(file_ref) == b"hello"
    assert StreamRef.from_json(file_ref.to_json()) == file_ref
    store.delete(ref)
    store.delete(ref)  # deleting twice is fine
    with pytest.raises(StreamError):
        store.read(ref)


def test_a_changed_stream_is_detected(store: StreamStore) -> None:
    ref = store.put("x", b"original")
    forged = StreamRef(ref.id, ref.name, ref.size, "0" * 64, ref.location)
    with pytest.raises(StreamError, match="does not match"):
        store.read(forged)


def test_malformed_references_and_uris() -> None:
    with pytest.raises(StreamError, match="malformed"):
        StreamRef.from_json({"id": "x"})
    with pytest.raises(StreamError, match="bad stream id"):
        LocalDirectoryStore("/tmp").read(StreamRef("../etc", "x", 1, "0", "file://x"))
    assert store_from_uri("") is None
    assert isinstance(store_from_uri("s3://bucket/prefix/", MOTO), S3StreamStore)
    with pytest.raises(ConfigError):
        store_from_uri("ftp://host/x")
    with pytest.raises(ConfigError):
        store_from_uri("s3:///nobucket")
