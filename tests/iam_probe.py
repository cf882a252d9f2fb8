"""One process of the deployment, run as on AWS, with every AWS request it makes recorded.

``python -m tests.iam_probe SPEC_JSON OUT_JSON``: a fresh interpreter (a cold start: no cache,
no client, no singleton from an earlier probe) whose environment the caller set to exactly what the
role's process gets. It installs the recorder first, then runs ``SPEC["kind"]``:

- ``lambda``: imports ``functions/<module>`` and calls ``<handler>(event, context)``, as Lambda does;
- ``call``: calls a function ``package.module:name`` with ``SPEC["args"]``: a process that is not a
  Lambda handler (a worker's start-up, the EMR job's settings, the ECS agent's calls).

It writes ``{"requests": [...], "error": str | null, "result": ...}`` to ``OUT_JSON``: the
test judges the requests, and a failure of the operation itself (an AccessDenied included) is
reported, not hidden.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from tests.iam_policy import recording

ROOT = Path(__file__).resolve().parent.parent


def run(spec: dict[str, Any]) -> Any:
    if spec["kind"] == "lambda":
        from switchyard.local.lambda_context import FakeLambdaContext

        sys.path.insert(0, str(ROOT / "functions"))
        module = importlib.import_module(spec["module"])
        context = FakeLambdaContext(spec["module"], spec.get("timeout_ms", 3000))
        return getattr(module, spec["handler"])(spec["event"], context)
    module_name, _, name = spec["target"].partition(":")
    return getattr(importlib.import_module(module_name), name)(*spec.get("args", ()))


def main(spec_path: str, out_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    requests: list[dict[str, Any]] = []
    error, result = None, None
    with recording(requests):
        try:
            result = run(spec)
        except BaseException:  # reported to the test, which fails on it
            error = traceback.format_exc(limit=8)
    Path(out_path).write_text(json.dumps({"requests": requests, "error": error, "result": result},
                                         default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))


# -- processes that are not Lambda handlers (``call`` targets) ----------------------------------------
def rpc_worker() -> str:
    """A pool worker's start-up (``switchyard worker``): its settings, then its broker connection."""
    from switchyard.rpc.amqp import connect
    from switchyard.rpc.settings import RpcSettings

    connect(RpcSettings.from_env().connections.amqp_url, "switchyard-iam-probe").close()
    return "connected"


def bus_worker() -> str:
    """An event bus worker's start-up (``switchyard bus worker``): its store on Redis."""
    from switchyard.bus.service import build_service  # what `switchyard bus worker` builds first
    from switchyard.bus.settings import BusSettings
    from switchyard.core.config import Connections

    return str(build_service(BusSettings.from_env(), Connections.from_env()).store.redis.ping())


def emr_job(input_uri: str, output_uri: str) -> list[str]:
    """The publish job's settings as ``publish`` reads them, its check of the pools on the broker,
    and its staging: the input downloaded from S3, the results uploaded over the last ones."""
    import tempfile
    from pathlib import Path

    from switchyard.spark import store
    from switchyard.spark.job import _unknown_pools
    from switchyard.spark.settings import SparkSettings

    settings = SparkSettings.from_env()
    read = [settings.kafka_bootstrap, settings.delay_topic]
    unknown = sorted(_unknown_pools([os.environ["IAM_PROBE_POOL"]], settings.rpc))
    with tempfile.TemporaryDirectory() as tmp:
        store.download(input_uri, Path(tmp, "input"))
        (Path(tmp, "output", "results")).mkdir(parents=True)
        Path(tmp, "output", "results", "part-0.json").write_text("{}\n")
        store.upload(Path(tmp, "output"), output_uri, ("results",))
    return [*read, *unknown]


def ecs_agent(secrets: list[str], log_group: str, stream: str, repository: str) -> str:
    """What the ECS agent does with a task's execution role before the container starts: pull the
    image from ECR, fetch each ``secrets`` ARN, open the awslogs stream and write to it."""
    import boto3
    from botocore.exceptions import ClientError

    ecr = boto3.client("ecr")
    ecr.get_authorization_token()
    for call in (ecr.batch_get_image, ecr.get_download_url_for_layer):
        try:
            kwargs = {"imageIds": [{"imageTag": "latest"}]} if call == ecr.batch_get_image else \
                {"layerDigest": "sha256:" + "0" * 64}
            call(repositoryName=repository, **kwargs)
        except ClientError:
            pass  # moto has no image there: the request (what IAM judges) was made all the same
    sm = boto3.client("secretsmanager")
    for arn in secrets:
        sm.get_secret_value(SecretId=arn)
    logs = boto3.client("logs")
    logs.create_log_stream(logGroupName=log_group, logStreamName=stream)
    logs.put_log_events(logGroupName=log_group, logStreamName=stream,
                        logEvents=[{"timestamp": 0, "message": "started"}])
    return "started"
