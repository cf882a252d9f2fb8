"""``switchyard spark package`` / ``submit`` / ``wait`` against moto's server (S3, EMR Serverless,
CloudFormation and SSM on 127.0.0.1:5000, started by ./dev; tests/conftest.py refuses any endpoint
that is not loopback).

The packaging tests install from a local wheel directory (``--no-index --find-links``), so they
exercise pip's cross-platform selection without the network: a manylinux wheel is taken, a
macOS-only one is refused.

What moto's EMR Serverless does NOT reproduce (so these tests cannot check it): a job run is
SUCCESS the moment StartJobRun returns (no SUBMITTED/SCHEDULED/RUNNING, nothing runs, no logs are
written), entry points and archives are never read from S3, and the role is not assumed (only its
account is compared with moto's).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import boto3
import pytest

from stacks.constants import EMR_RELEASE
from switchyard.cli import main
from switchyard.core.deployed_config import CONFIG_PATH_ENV
from switchyard.spark.emr import (
    APPLICATION_ID_ENV,
    BUCKET_ENV,
    JOB_ROLE_ARN_ENV,
    LOG_URI_ENV,
    STACK_OUTPUTS,
    InvalidJobInputError,
    JobSpec,
    bucket_location,
)
from switchyard.spark.package import PACKAGE_DIR, PLATFORMS, PYTHON_VERSION, PackagingError, build_environment
from tests.conftest import ROOT, unique

MOTO = "http://127.0.0.1:5000"
ROLE_ARN = "arn:aws:iam::123456789012:role/switchyard-pipeline-job"  # moto's account


def make_wheel(directory: Path, name: str, tag: str) -> Path:
    """A minimal wheel whose module ``name`` records its own name."""
    info, purelib = f"{name}-1.0.dist-info", str(tag == "py3-none-any").lower()
    files = {f"{name}/__init__.py": f"NAME = {name!r}\n".encode(),
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             f"{info}/WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: {purelib}\nTag: {tag}\n".encode()}

    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{path},sha256={digest(data)},{len(data)}\n" for path, data in files.items())
    record += f"{info}/RECORD,,\n"
    wheel = directory / f"{name}-1.0-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{info}/RECORD", record)
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("wheels")
    make_wheel(directory, "sy_pure", "py3-none-any")
    make_wheel(directory, "sy_native", "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64")
    make_wheel(directory, "sy_macos", "cp311-cp311-macosx_11_0_arm64")
    return directory


def requirements(tmp_path: Path, *names: str) -> Path:
    path = tmp_path / "requirements.txt"
    path.write_text("".join(f"{n}==1.0\n" for n in names))
    return path


def offline(wheels: Path) -> list[str]:
    return ["--no-index", f"--find-links={wheels}"]


@pytest.fixture(scope="module")
def package_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A snapshot of the switchyard package: other work may edit the tree while these tests run."""
    snapshot = tmp_path_factory.mktemp("source") / "switchyard"
    shutil.copytree(PACKAGE_DIR, snapshot, ignore=shutil.ignore_patterns("__pycache__"))
    return snapshot


def build(directory: Path, wheels: Path, package_dir: Path, *names: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return build_environment(directory / "dist", requirements=[requirements(directory, *names)],
                             constraints=None, pip_options=offline(wheels), package_dir=package_dir)


@pytest.fixture(scope="module")
def archive(wheels: Path, package_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("build"), wheels, package_dir, "sy_pure", "sy_native")


def test_environment_holds_dependencies_for_emr_and_the_core_package_behind_a_launcher(
        archive: Path, tmp_path: Path) -> None:
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
        tar.extractall(tmp_path / "environment", filter="data")
    site = f"lib/python{PYTHON_VERSION}/site-packages"
    for name in ("bin/python", f"{site}/sy_pure/__init__.py", f"{site}/sy_native/__init__.py",
                 f"{site}/switchyard/spark/emr.py", f"{site}/switchyard/delay/sql/queries.sql"):
        assert name in members, name
    assert members["bin/python"].mode & 0o111
    assert not [n for n in members if "__pycache__" in n or n.startswith(("/", ".."))]
    assert {m.mtime for m in members.values()} == {0}
    assert not [n for n in members if n.split("/")[-1].startswith("pyspark")]

    # The launcher runs python3.11 with the archive's packages first, wherever it was unpacked.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        ["./environment/bin/python", "-c",
         "import sy_pure, sy_native, switchyard.spark.emr as m; print(sy_native.NAME, m.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    name, path = done.stdout.split()
    assert name == "sy_native" and Path(path).is_relative_to(tmp_path / "environment")

    # Without the interpreter the launcher says what to do instead of failing obscurely.
    done = subprocess.run(["./environment/bin/python", "-c", "pass"], cwd=tmp_path, capture_output=True,
                          text=True, env={**env, "SWITCHYARD_EMR_PYTHON": "python-missing-here"}, timeout=60)
    assert done.returncode == 127 and "emr-image.Dockerfile" in done.stderr


def test_same_inputs_give_the_same_archive(archive: Path, wheels: Path, package_dir: Path,
                                          tmp_path: Path) -> None:
    again = build(tmp_path, wheels, package_dir, "sy_pure", "sy_native")
    assert again.name == archive.name and again.read_bytes() == archive.read_bytes()
    (package_dir / "spark" / "emr.py").touch()  # times do not count, content does
    assert build(tmp_path / "touched", wheels, package_dir, "sy_pure", "sy_native").name == archive.name
    other = build(tmp_path / "other", wheels, package_dir, "sy_pure")
    assert other.name != archive.name


def test_a_dependency_without_a_wheel_for_emr_is_refused(wheels: Path, tmp_path: Path) -> None:
    with pytest.raises(PackagingError, match="manylinux_2_34_x86_64") as info:
        build_environment(tmp_path, requirements=[requirements(tmp_path, "sy_macos")], constraints=None,
                          pip_options=offline(wheels))
    assert "sy_macos" in str(info.value)
    assert not list(tmp_path.glob("**/*.tar.gz"))
    assert PLATFORMS[0] == "manylinux_2_34_x86_64"  # Amazon Linux 2023's glibc, what EMR 7.x runs


def test_custom_image_matches_the_deployed_release_and_python() -> None:
    dockerfile = (ROOT / "scripts" / "emr-image.Dockerfile").read_text()
    assert f"FROM public.ecr.aws/emr-serverless/spark/{EMR_RELEASE}:latest" in dockerfile
    assert f"python{PYTHON_VERSION}" in dockerfile


# -- against moto ---------------------------------------------------------------------------------

@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    for name in (APPLICATION_ID_ENV, JOB_ROLE_ARN_ENV, BUCKET_ENV, LOG_URI_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", MOTO)
    monkeypatch.setenv("AWS_ENDPOINT_URL_EMR_SERVERLESS", MOTO)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", MOTO)
    emr, s3 = boto3.client("emr-serverless"), boto3.client("s3")
    bucket = unique("sy-pipeline").replace("_", "-")
    s3.create_bucket(Bucket=bucket)
    app = emr.create_application(name=unique("switchyard"), releaseLabel=EMR_RELEASE, type="SPARK")
    return {"emr": emr, "s3": s3, "bucket": bucket, "app": app["applicationId"]}


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def read(aws: dict, key: str) -> bytes:
    return aws["s3"].get_object(Bucket=aws["bucket"], Key=key)["Body"].read()


def test_package_then_submit_and_wait_sends_the_entry_point_args_and_environment(
        aws: dict, wheels: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entry = tmp_path / "publish_requests.py"
    entry.write_text("print('job')\n")
    bucket = f"s3://{aws['bucket']}"
    code, out, err = cli(capsys, "spark", "package", "--bucket", bucket, "--entry-point", str(entry),
                         "--output", str(tmp_path / "dist"), "--constraints", "",
                         "--requirements", str(requirements(tmp_path, "sy_pure", "sy_native")),
                         *(f"--pip-option={option}" for option in offline(wheels)))
    assert code == 0, err
    [archive] = (tmp_path / "dist").glob("switchyard-env-py311-*.tar.gz")
    assert f"built {archive}" in out
    manifest = json.loads(read(aws, "switchyard/spark/latest.json"))
    assert f"--archive {manifest['archive']}" in out and f"--entry-point {manifest['entryPoint']}" in out
    assert manifest["archive"] == f"{bucket}/switchyard/spark/env/{archive.name}"
    assert read(aws, manifest["archive"].split("/", 3)[3]) == archive.read_bytes()

    job_args = ["--input", f"{bucket}/in/rows.parquet", "--output", f"{bucket}/out", "--pool", "core"]
    code, out, err = cli(capsys, "spark", "submit", "--application-id", aws["app"], "--role-arn", ROLE_ARN,
                         "--bucket", bucket, "--wait", "--poll-interval", "0.1",
                         "--env", "SWITCHYARD_RPC_POOL=core", "--", *job_args)
    assert code == 0, err
    run_id = out.split("submitted job run ")[1].split()[0]
    assert f"job run {run_id}: SUCCESS" in out
    logs = f"{bucket}/switchyard/spark/logs/applications/{aws['app']}/jobs/{run_id}/SPARK_DRIVER/"
    assert f"driver logs: {logs}" in out

    run = aws["emr"].get_job_run(applicationId=aws["app"], jobRunId=run_id)["jobRun"]
    submit = run["jobDriver"]["sparkSubmit"]
    assert submit["entryPoint"] == manifest["entryPoint"]
    assert submit["entryPointArguments"] == job_args
    params = submit["sparkSubmitParameters"].split()
    assert f"spark.archives={manifest['archive']}#environment" in params
    for conf in ("spark.emr-serverless.driverEnv.PYSPARK_DRIVER_PYTHON",
                 "spark.emr-serverless.driverEnv.PYSPARK_PYTHON", "spark.executorEnv.PYSPARK_PYTHON"):
        assert f"{conf}=./environment/bin/python" in params
    assert "spark.emr-serverless.driverEnv.SWITCHYARD_RPC_POOL=core" in params
    assert "spark.executorEnv.SWITCHYARD_RPC_POOL=core" in params
    assert run["executionRole"] == ROLE_ARN
    monitoring = run["configurationOverrides"]["monitoringConfiguration"]
    assert monitoring["s3MonitoringConfiguration"]["logUri"] == f"{bucket}/switchyard/spark/logs/"


def test_a_run_that_does_not_succeed_exits_1_and_says_where_to_look(
        aws: dict, capsys: pytest.CaptureFixture[str]) -> None:
    bucket = f"s3://{aws['bucket']}"
    code, out, err = cli(capsys, "spark", "submit", "--application-id", aws["app"], "--role-arn", ROLE_ARN,
                         "--entry-point", f"{bucket}/jobs/publish_requests.py",
                         "--archive", f"{bucket}/env.tar.gz", "--logs", f"{bucket}/logs")
    assert code == 0, err
    run_id = out.split("submitted job run ")[1].split()[0]
    aws["emr"].cancel_job_run(applicationId=aws["app"], jobRunId=run_id)
    code, out, err = cli(capsys, "spark", "wait", "--application-id", aws["app"], "--job-run-id", run_id,
                         "--poll-interval", "0.1")
    assert code == 1
    assert f"job run {run_id}: CANCELLED" in out
    assert "ended CANCELLED" in err
    assert f"{bucket}/logs/applications/{aws['app']}/jobs/{run_id}/SPARK_DRIVER/stderr.gz" in err


def test_defaults_come_from_the_deployed_stack_outputs(
        aws: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    stack = unique("SyPipeline").replace("_", "-")
    # One setting the job reads, and the Redis ones it does not: its role reads only the broker's
    # secret, so a Redis URL with placeholders in its environment would fail it on EMR (issue 22).
    deployed = {"SWITCHYARD_DELAY_INPUT_TOPIC": "sy-pipeline-input", "SWITCHYARD_RPC_CALL_TIMEOUT_S": "120",
                "SWITCHYARD_REDIS_URL": "rediss://:{password}@redis.internal:6379/0",
                "SWITCHYARD_REDIS_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:1:secret:redis-AbCdEf"}
    monkeypatch.setenv(CONFIG_PATH_ENV, "")  # restored after the CLI sets it
    for name in deployed:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    template = {
        "Resources": {f"Config{i}": {"Type": "AWS::SSM::Parameter", "Properties": {
            "Name": f"/switchyard/{stack}/config/{name}", "Type": "String", "Value": value}}
            for i, (name, value) in enumerate(deployed.items())},
        "Outputs": {
            STACK_OUTPUTS["application_id"]: {"Value": aws["app"]},
            STACK_OUTPUTS["role_arn"]: {"Value": ROLE_ARN},
            STACK_OUTPUTS["bucket"]: {"Value": aws["bucket"]},
        },
    }
    boto3.client("cloudformation").create_stack(StackName=stack, TemplateBody=json.dumps(template))
    manifest = {"entryPoint": f"s3://{aws['bucket']}/j/publish_requests.py",
                "archive": f"s3://{aws['bucket']}/e.tar.gz"}
    aws["s3"].put_object(Bucket=aws["bucket"], Key="switchyard/spark/latest.json",
                         Body=json.dumps(manifest).encode())

    code, out, err = cli(capsys, "--stack", stack, "spark", "submit", "--wait", "--poll-interval", "0.1")
    assert code == 0, err
    run_id = out.split("submitted job run ")[1].split()[0]
    run = aws["emr"].get_job_run(applicationId=aws["app"], jobRunId=run_id)["jobRun"]
    assert run["jobDriver"]["sparkSubmit"]["entryPoint"] == manifest["entryPoint"]
    # the deployed settings the job reads reach the driver and the executors; the others do not
    params = run["jobDriver"]["sparkSubmit"]["sparkSubmitParameters"].split()
    for where in ("spark.emr-serverless.driverEnv", "spark.executorEnv"):
        assert f"{where}.SWITCHYARD_DELAY_INPUT_TOPIC=sy-pipeline-input" in params
        assert f"{where}.SWITCHYARD_RPC_CALL_TIMEOUT_S=120" in params
    assert [p for p in params if "REDIS" in p] == []
    assert run["executionRole"] == ROLE_ARN


BUCKET = "s3://sy-bucket"
GOOD = {"application_id": "00fabc123", "role_arn": ROLE_ARN, "entry_point": f"{BUCKET}/jobs/publish.py",
        "archive": f"{BUCKET}/env/env.tar.gz", "log_uri": f"{BUCKET}/logs/"}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("application_id", "App-1", "--application-id"),
    ("role_arn", "arn:aws:iam::123:user/me", "--role-arn"),
    ("entry_point", "/home/me/publish.py", "--entry-point must be an s3://"),
    ("entry_point", f"{BUCKET}/jobs/", "--entry-point must name an object"),
    ("entry_point", f"{BUCKET}/jobs/publish.jar", "Python file"),
    ("archive", "s3://Bad_Bucket/env.tar.gz", "--archive must be an s3://"),
    ("archive", f"{BUCKET}/env.whl", ".tar.gz, .tgz or .zip"),
    ("log_uri", "https://example.com/logs", "--logs"),
    ("env", (("lower", "x"),), "not a variable name"),
    ("env", (("SWITCHYARD_X", "a b"),), "without spaces"),
])
def test_a_malformed_submission_names_what_is_wrong(field: str, value: object, message: str) -> None:
    with pytest.raises(InvalidJobInputError, match=message):
        JobSpec(**{**GOOD, field: value})


def test_bucket_locations_default_their_prefix() -> None:
    assert bucket_location("sy-bucket") == ("sy-bucket", "switchyard/spark")
    assert bucket_location("s3://sy-bucket/") == ("sy-bucket", "switchyard/spark")
    assert bucket_location("s3://sy-bucket/team/jobs/") == ("sy-bucket", "team/jobs")
    with pytest.raises(InvalidJobInputError, match="--bucket must be"):
        bucket_location("s3://UPPER")


def test_bad_flags_fail_before_anything_is_submitted(aws: dict, capsys: pytest.CaptureFixture[str]) -> None:
    bucket = f"s3://{aws['bucket']}"
    cases = [
        (["--role-arn", ROLE_ARN, "--bucket", bucket],
         "no --entry-point/--archive given and no package manifest"),
        (["--role-arn", ROLE_ARN, "--entry-point", f"{bucket}/p.py", "--archive", f"{bucket}/e.tar.gz"],
         "--logs (or SWITCHYARD_EMR_LOG_URI, or --bucket) is required"),
        (["--bucket", bucket, "--entry-point", f"{bucket}/p.py", "--archive", f"{bucket}/e.tar.gz"],
         "--role-arn (or SWITCHYARD_EMR_JOB_ROLE_ARN, or --stack) is required"),
        (["--role-arn", ROLE_ARN, "--bucket", "s3://no..dots", "--entry-point", f"{bucket}/p.py"],
         "--bucket must be"),
        (["--role-arn", ROLE_ARN, "--bucket", f"{bucket}/broken"], "is not a JSON object"),
        (["--role-arn", ROLE_ARN, "--bucket", f"{bucket}/partial"], "--archive must be an s3://"),
        (["--role-arn", ROLE_ARN, "--entry-point", f"{bucket}/p.py", "--archive", f"{bucket}/e.tar.gz",
          "--logs", f"{bucket}/logs", "--env", "SWITCHYARD_RPC_POOL"], "--env takes NAME=VALUE"),
    ]
    aws["s3"].put_object(Bucket=aws["bucket"], Key="broken/latest.json", Body=b"[]")
    aws["s3"].put_object(Bucket=aws["bucket"], Key="partial/latest.json",
                         Body=json.dumps({"entryPoint": f"{bucket}/p.py"}).encode())
    for flags, message in cases:
        code, _, err = cli(capsys, "spark", "submit", "--application-id", aws["app"], *flags)
        assert code == 1 and message in err, (flags, err)
    # moto answers ListJobRuns for an application without runs with ResourceNotFound
    with pytest.raises(aws["emr"].exceptions.ResourceNotFoundException):
        aws["emr"].list_job_runs(applicationId=aws["app"])
    with pytest.raises(SystemExit) as exit_info:
        main(["spark", "wait", "--application-id", aws["app"], "--job-run-id", "x", "--poll-interval", "0"])
    assert exit_info.value.code == 2
    assert "must be > 0" in capsys.readouterr().err
    code, _, err = cli(capsys, "spark", "package", "--no-upload", "--archive", "/nonexistent.tar.gz")
    assert code == 1 and "--archive /nonexistent.tar.gz does not exist" in err
