"""``spark package`` and ``spark submit`` configured from the deployed ``localstack`` target:
``--stack SwitchyardLocal`` names the pipeline bucket (its ``PipelineBucket`` output, created by
CDK on LocalStack), EMR Serverless calls go to moto (LocalStack's community edition has none),
as ``./dev localstack`` sets them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import boto3

from scripts.localstack_deploy import Deployment, client
from stacks.constants import EMR_RELEASE
from tests.conftest import ROOT, subprocess_env, unique
from tests.localstack.conftest import localstack_deployment  # noqa: F401 (the session fixture)

MOTO = "http://127.0.0.1:5000"
ROLE_ARN = "arn:aws:iam::123456789012:role/switchyard-pipeline-job"  # moto's account


def switchyard(deployment: Deployment, *args: str) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(AWS_ENDPOINT_URL=deployment.endpoint, AWS_ENDPOINT_URL_EMR_SERVERLESS=MOTO,
                         SWITCHYARD_LOG_LEVEL="ERROR")
    for name in ("SWITCHYARD_PIPELINE_BUCKET", "SWITCHYARD_EMR_LOG_URI", "SWITCHYARD_EMR_APPLICATION_ID",
                 "SWITCHYARD_EMR_JOB_ROLE_ARN"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "switchyard", "--stack", deployment.stack_name, *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_package_and_submit_use_the_deployed_pipeline_bucket(
        localstack_deployment: Deployment, tmp_path: Path) -> None:  # noqa: F811
    bucket = localstack_deployment.outputs["PipelineBucket"]
    entry, archive = tmp_path / "publish_requests.py", tmp_path / "env.tar.gz"
    entry.write_text("print('job')\n")
    archive.write_bytes(b"not unpacked by moto")
    done = switchyard(localstack_deployment, "spark", "package", "--archive", str(archive),
                      "--entry-point", str(entry))
    assert done.returncode == 0, done.stderr
    s3 = client("s3", localstack_deployment.endpoint)
    manifest = json.loads(s3.get_object(Bucket=bucket, Key="switchyard/spark/latest.json")["Body"].read())
    assert manifest["archive"] == f"s3://{bucket}/switchyard/spark/env/env.tar.gz"
    key = manifest["entryPoint"].removeprefix(f"s3://{bucket}/")
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == entry.read_bytes()

    emr = boto3.client("emr-serverless", endpoint_url=MOTO)
    app = emr.create_application(name=unique("switchyard"), releaseLabel=EMR_RELEASE, type="SPARK")
    done = switchyard(localstack_deployment, "spark", "submit", "--application-id", app["applicationId"],
                      "--role-arn", ROLE_ARN, "--wait", "--poll-interval", "0.1", "--", "--pool", "core")
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.split("submitted job run ")[1].split()[0]
    run = emr.get_job_run(applicationId=app["applicationId"], jobRunId=run_id)["jobRun"]
    assert run["jobDriver"]["sparkSubmit"]["entryPoint"] == manifest["entryPoint"]
    assert run["jobDriver"]["sparkSubmit"]["entryPointArguments"] == ["--pool", "core"]
    # the deployed settings go to the driver and executors as stored: placeholders, never the password
    params = run["jobDriver"]["sparkSubmit"]["sparkSubmitParameters"].split()
    amqp = [p for p in params if p.startswith("spark.executorEnv.SWITCHYARD_AMQP_URL=")]
    assert len(amqp) == 1 and "{password}" in amqp[0], params
    assert any(p.startswith("spark.emr-serverless.driverEnv.SWITCHYARD_AMQP_SECRET_ARN=arn:") for p in params)
    assert "guest:guest" not in " ".join(params)
    logs = run["configurationOverrides"]["monitoringConfiguration"]["s3MonitoringConfiguration"]["logUri"]
    assert logs == f"s3://{bucket}/switchyard/spark/logs/"
