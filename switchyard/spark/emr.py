"""Submit the pipeline's job to EMR Serverless (``switchyard spark submit`` / ``spark wait``).

The job runs the entry point uploaded by ``switchyard spark package`` with the packaged Python
environment (``spark.archives`` unpacked as ``./environment`` on the driver and every executor,
``PYSPARK_PYTHON`` pointing into it: EMR Serverless's documented way to ship dependencies). Its
logs go to an S3 monitoring location, whose driver logs ``wait`` names when a run ends badly.

Defaults, most specific first: the flags, the ``SWITCHYARD_EMR_*`` / ``SWITCHYARD_PIPELINE_BUCKET``
variables, then the outputs of the stack named by ``switchyard --stack NAME`` (the AWS target's
``PipelineApplicationId``, ``PipelineJobRoleArn``, ``PipelineBucket``). The entry point and the
archive default to what the last ``package`` run recorded in the bucket's manifest. boto3 calls
go to ``AWS_ENDPOINT_URL_EMR_SERVERLESS`` / ``AWS_ENDPOINT_URL`` when set (moto in the tests).

The job reads its settings from ``SWITCHYARD_*`` variables like every Switchyard process; on EMR
they are set on the driver and the executors by ``--env NAME=VALUE`` and, with ``--stack``, from
the stack's deployed configuration (SSM parameters: no secrets, only ``{password}`` placeholders and
secret ARNs), so the job role needs no SSM access. Only the settings the job reads are copied
(``job_settings``): its role may read the broker's secret alone, and a URL of another service would
have the job read that service's secret.
"""

from __future__ import annotations

import argparse
import json
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from switchyard.core.aws_secrets import SECRET_URLS, source_variables
from switchyard.core.config import AMQP_URL, KAFKA_AUTH, KAFKA_BOOTSTRAP
from switchyard.spark.errors import EmrJobError, InvalidJobInputError
from switchyard.spark.settings import (
    APPLICATION_ID_ENV,
    BUCKET_ENV,
    JOB_ROLE_ARN_ENV,
    LOG_URI_ENV,
    EmrSettings,
)

# The stack outputs (stacks/switchyard_stack.py) that hold the defaults above.
STACK_OUTPUTS = {
    "application_id": "PipelineApplicationId",
    "role_arn": "PipelineJobRoleArn",
    "bucket": "PipelineBucket",
}

# Where `package` puts things under the bucket, and the manifest naming the latest upload.
DEFAULT_PREFIX = "switchyard/spark"
MANIFEST_NAME = "latest.json"
LOGS_SUFFIX = "logs/"

# The archive is unpacked under this name in each container's working directory.
ENVIRONMENT_ALIAS = "environment"
ENVIRONMENT_PYTHON = f"./{ENVIRONMENT_ALIAS}/bin/python"

FINAL_STATES = frozenset({"SUCCESS", "FAILED", "CANCELLED"})
SUCCESS = "SUCCESS"

_S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(?P<key>.*))?$")
_ID = re.compile(r"^[0-9a-z]{1,64}$")  # EMR Serverless application and job run ids
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_ROLE_ARN = re.compile(r"^arn:aws[a-zA-Z-]*:iam::\d{12}:role/(?:[\x21-\x7e]+/)?[\w+=,.@-]{1,64}$")


def parse_s3_uri(uri: str, what: str, *, need_key: bool = False) -> tuple[str, str]:
    """``(bucket, key)`` of ``s3://bucket/key``; a clear error naming ``what`` otherwise."""
    match = _S3_URI.match(uri or "")
    if not match or ".." in match["bucket"]:
        raise InvalidJobInputError(f"{what} must be an s3://BUCKET/KEY URI with a valid bucket name, "
                                   f"got {uri!r}")
    key = match["key"] or ""
    if need_key and (not key or key.endswith("/")):
        raise InvalidJobInputError(f"{what} must name an object (s3://BUCKET/KEY), got {uri!r}")
    return match["bucket"], key


def bucket_location(value: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of a bucket given as a name or ``s3://bucket[/prefix]`` (default prefix
    ``switchyard/spark``): where ``package`` uploads, the manifest lives and logs go by default."""
    uri = value if value.startswith("s3://") else f"s3://{value}"
    name, prefix = parse_s3_uri(uri, "--bucket")
    return name, prefix.strip("/") or DEFAULT_PREFIX


@dataclass(frozen=True)
class JobSpec:
    """Everything one ``StartJobRun`` needs; validated when built."""

    application_id: str
    role_arn: str
    entry_point: str
    archive: str
    log_uri: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # set on the driver and every executor
    name: str = "switchyard-publish"

    def __post_init__(self) -> None:
        if not _ID.match(self.application_id or ""):
            raise InvalidJobInputError(f"--application-id must be an EMR Serverless application id "
                                       f"(lowercase letters and digits), got {self.application_id!r}")
        if not _ROLE_ARN.match(self.role_arn or ""):
            raise InvalidJobInputError("--role-arn must be an IAM role ARN (arn:aws:iam::ACCOUNT:role/NAME), "
                                       f"got {self.role_arn!r}")
        _, key = parse_s3_uri(self.entry_point, "--entry-point", need_key=True)
        if not key.endswith(".py"):
            raise InvalidJobInputError(f"--entry-point must be a Python file (.py), got {self.entry_point!r}")
        _, key = parse_s3_uri(self.archive, "--archive", need_key=True)
        if not key.endswith((".tar.gz", ".tgz", ".zip")):
            raise InvalidJobInputError(f"--archive must be a .tar.gz, .tgz or .zip environment archive, "
                                       f"got {self.archive!r}")
        parse_s3_uri(self.log_uri, "--logs")
        for name, value in self.env:
            if not _ENV_NAME.match(name):
                raise InvalidJobInputError(f"--env {name}=...: not a variable name (A-Z, 0-9, _)")
            if not value or any(c.isspace() for c in value):
                raise InvalidJobInputError(f"--env {name}: the value must be non-empty, without spaces "
                                           "(sparkSubmitParameters are split on whitespace)")

    def spark_submit_parameters(self) -> str:
        """The packaged environment as driver and executor Python (EMR Serverless's documented confs)."""
        confs = (
            f"spark.archives={self.archive}#{ENVIRONMENT_ALIAS}",
            f"spark.emr-serverless.driverEnv.PYSPARK_DRIVER_PYTHON={ENVIRONMENT_PYTHON}",
            f"spark.emr-serverless.driverEnv.PYSPARK_PYTHON={ENVIRONMENT_PYTHON}",
            f"spark.executorEnv.PYSPARK_PYTHON={ENVIRONMENT_PYTHON}",
            *(f"{where}.{name}={value}" for name, value in self.env
              for where in ("spark.emr-serverless.driverEnv", "spark.executorEnv")),
        )
        return " ".join(f"--conf {conf}" for conf in confs)

    def request(self) -> dict[str, Any]:
        """The ``StartJobRun`` parameters."""
        logs = {"s3MonitoringConfiguration": {"logUri": self.log_uri.rstrip("/") + "/"}}
        return {
            "applicationId": self.application_id,
            "executionRoleArn": self.role_arn,
            "clientToken": uuid.uuid4().hex,
            "name": self.name,
            "jobDriver": {"sparkSubmit": {
                "entryPoint": self.entry_point,
                "entryPointArguments": list(self.args),
                "sparkSubmitParameters": self.spark_submit_parameters(),
            }},
            "configurationOverrides": {"monitoringConfiguration": logs},
        }


def emr_client() -> Any:
    import boto3

    return boto3.client("emr-serverless")


def _client_error(action: str, exc: Exception) -> EmrJobError:
    return EmrJobError(f"EMR Serverless {action} failed: {exc}")


def start_job_run(client: Any, spec: JobSpec) -> str:
    """Submit ``spec``; returns the job run id."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return client.start_job_run(**spec.request())["jobRunId"]
    except (BotoCoreError, ClientError) as exc:
        raise _client_error(f"StartJobRun on application {spec.application_id}", exc) from exc


def driver_logs(log_uri: str, application_id: str, job_run_id: str) -> str:
    """Where EMR Serverless writes a run's driver stdout/stderr under an S3 monitoring location."""
    return f"{log_uri.rstrip('/')}/applications/{application_id}/jobs/{job_run_id}/SPARK_DRIVER/"


def wait_for_job_run(
    client: Any,
    application_id: str,
    job_run_id: str,
    *,
    poll_interval: float = 5.0,
    timeout: float | None = None,
    report: Callable[[str], None] = print,
    heartbeat: float = 30.0,
) -> dict[str, Any]:
    """Poll ``GetJobRun`` until a final state, reporting each state change (and a heartbeat) with the
    elapsed time: a run takes minutes, and silence would look like a hang."""
    from botocore.exceptions import BotoCoreError, ClientError

    started = last_report = time.monotonic()
    state = None
    while True:
        try:
            run = client.get_job_run(applicationId=application_id, jobRunId=job_run_id)["jobRun"]
        except (BotoCoreError, ClientError) as exc:
            raise _client_error(f"GetJobRun {job_run_id}", exc) from exc
        now = time.monotonic()
        elapsed = now - started
        if run["state"] != state or now - last_report >= heartbeat:
            change = f" (was {state})" if state and run["state"] != state else ""
            report(f"[{elapsed:7.1f}s] job run {job_run_id}: {run['state']}{change}")
            state, last_report = run["state"], now
        if state in FINAL_STATES:
            return run
        if timeout is not None and elapsed >= timeout:
            raise EmrJobError(f"job run {job_run_id} still {state} after {timeout:.0f}s; it keeps running "
                              f"(follow it with: switchyard spark wait --application-id {application_id} "
                              f"--job-run-id {job_run_id})")
        time.sleep(poll_interval)


def log_uri_of(run: Mapping[str, Any]) -> str | None:
    overrides = run.get("configurationOverrides") or {}
    s3 = (overrides.get("monitoringConfiguration") or {}).get("s3MonitoringConfiguration") or {}
    return s3.get("logUri")


def finish(run: Mapping[str, Any], report: Callable[[str], None] = print) -> int:
    """Print a run's final state and where its logs are; 0 for SUCCESS, else an error saying where to look."""
    logs = log_uri_of(run)
    where = driver_logs(logs, run["applicationId"], run["jobRunId"]) if logs else None
    report(f"job run {run['jobRunId']}: {run['state']}" + (f"; driver logs: {where}" if where else ""))
    if run["state"] != SUCCESS:
        details = run.get("stateDetails") or "no details from EMR Serverless"
        look = (f"look at {where}stderr.gz (driver) and the executors' logs beside it" if where
                else "this run has no S3 log location; look in the EMR Studio console")
        raise EmrJobError(f"job run {run['jobRunId']} ended {run['state']}: {details}; {look}")
    return 0


# -- defaults -----------------------------------------------------------------------------------

def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    """``NAME=VALUE`` flags as a dict (later ones win)."""
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise InvalidJobInputError(f"--env takes NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


def job_settings() -> frozenset[str]:
    """The deployed settings the job reads (switchyard/spark/job.py): the broker (its URLs and where
    its credentials come from), the calls' default timeout, the delay input topic on MSK; nothing of
    Redis or Postgres, whose secrets the job role may not read."""
    from switchyard.delay.settings import DELAY
    from switchyard.rpc.settings import CALL_TIMEOUT  # here: switchyard.rpc brings pika along

    read = (CALL_TIMEOUT, KAFKA_BOOTSTRAP, KAFKA_AUTH, DELAY["input_topic"])
    return frozenset({*SECRET_URLS["AMQP"], *source_variables("AMQP"),
                      *(name for setting in read for name in (setting.name, *setting.old))})


def stack_config(stack: str) -> dict[str, str]:
    """The stack's deployed ``SWITCHYARD_*`` settings (Powertools' cache: ``--stack`` just read them)."""
    from switchyard.core.deployed_config import config_path, fetch

    return fetch(config_path(stack))


def stack_outputs(stack: str) -> dict[str, str]:
    """A deployed stack's outputs (one ``DescribeStacks``), for defaults."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        stacks = boto3.client("cloudformation").describe_stacks(StackName=stack)["Stacks"]
    except (BotoCoreError, ClientError) as exc:
        raise EmrJobError(f"cannot read the outputs of stack {stack!r}: {exc}") from exc
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}


def resolve(flag: str | None, setting: str | None, outputs: Mapping[str, str], output: str) -> str | None:
    """A setting from its flag, else its variable (``EmrSettings``), else the stack output."""
    return flag or setting or outputs.get(output) or None


def read_manifest(s3: Any, bucket: str) -> dict[str, str]:
    """What the last ``package`` run uploaded under ``bucket`` (a name or ``s3://bucket[/prefix]``)."""
    from botocore.exceptions import BotoCoreError, ClientError

    name, prefix = bucket_location(bucket)
    key = f"{prefix}/{MANIFEST_NAME}"
    try:
        manifest = json.loads(s3.get_object(Bucket=name, Key=key)["Body"].read())
    except (BotoCoreError, ClientError, ValueError) as exc:
        raise InvalidJobInputError("no --entry-point/--archive given and no package manifest at "
                                   f"s3://{name}/{key} ({exc}); run `switchyard spark package` first"
                                   ) from exc
    if not isinstance(manifest, dict):
        raise InvalidJobInputError(f"the package manifest s3://{name}/{key} is not a JSON object; "
                                   "run `switchyard spark package` again")
    return manifest


def _application_id(args: argparse.Namespace, outputs: Mapping[str, str],
                    settings: EmrSettings) -> str | None:
    return resolve(args.application_id, settings.application_id, outputs, STACK_OUTPUTS["application_id"])


def spec_from_args(args: argparse.Namespace, outputs: Mapping[str, str],
                   deployed: Mapping[str, str] | None = None, settings: EmrSettings | None = None) -> JobSpec:
    """The submission the flags, variables (``settings``, default from the environment) and stack
    outputs (and the deployed settings the job reads, ``job_settings``) describe."""
    settings = settings or EmrSettings.from_env()
    bucket = resolve(args.bucket, settings.bucket, outputs, STACK_OUTPUTS["bucket"])
    location = bucket_location(bucket) if bucket else None
    entry_point, archive = args.entry_point, args.archive
    if not (entry_point and archive):
        if not bucket:
            raise InvalidJobInputError("--entry-point and --archive are required (or --bucket / "
                                       f"{BUCKET_ENV} with a package manifest in it)")
        import boto3

        manifest = read_manifest(boto3.client("s3"), bucket)
        entry_point, archive = entry_point or manifest.get("entryPoint"), archive or manifest.get("archive")
    log_uri = args.logs or settings.log_uri or (
        f"s3://{location[0]}/{location[1]}/{LOGS_SUFFIX}" if location else None)
    if not log_uri:
        raise InvalidJobInputError(f"--logs (or {LOG_URI_ENV}, or --bucket) is required: the S3 location "
                                   "of the job's logs")
    application_id = _application_id(args, outputs, settings)
    role_arn = resolve(args.role_arn, settings.job_role_arn, outputs, STACK_OUTPUTS["role_arn"])
    if not application_id:
        raise InvalidJobInputError(f"--application-id (or {APPLICATION_ID_ENV}, or --stack) is required")
    if not role_arn:
        raise InvalidJobInputError(f"--role-arn (or {JOB_ROLE_ARN_ENV}, or --stack) is required")
    job_args = list(args.job_args or [])
    if job_args[:1] == ["--"]:
        job_args = job_args[1:]
    wanted = job_settings()
    env = {name: value for name, value in (deployed or {}).items() if name in wanted}
    env.update(parse_env(args.env))
    return JobSpec(application_id=application_id, role_arn=role_arn, entry_point=entry_point,
                   archive=archive, log_uri=log_uri, args=tuple(job_args), env=tuple(sorted(env.items())),
                   name=args.name)


# -- command line -------------------------------------------------------------------------------

def cmd_submit(args: argparse.Namespace) -> int:
    stack = getattr(args, "stack", None)
    spec = spec_from_args(args, stack_outputs(stack) if stack else {}, stack_config(stack) if stack else None)
    client = emr_client()
    job_run_id = start_job_run(client, spec)
    print(f"submitted job run {job_run_id} to application {spec.application_id}")
    print(f"  entry point: {spec.entry_point} {' '.join(spec.args)}".rstrip())
    print(f"  environment: {spec.archive}")
    if spec.env:
        print(f"  variables:   {', '.join(name for name, _ in spec.env)}")
    print(f"  driver logs: {driver_logs(spec.log_uri, spec.application_id, job_run_id)}")
    if not args.wait:
        print(f"follow it with: switchyard spark wait --application-id {spec.application_id} "
              f"--job-run-id {job_run_id}")
        return 0
    return _wait(client, spec.application_id, job_run_id, args)


def cmd_wait(args: argparse.Namespace) -> int:
    outputs = stack_outputs(args.stack) if getattr(args, "stack", None) else {}
    application_id = _application_id(args, outputs, EmrSettings.from_env())
    for value, flag in ((application_id, "--application-id"), (args.job_run_id, "--job-run-id")):
        if not _ID.match(value or ""):
            raise InvalidJobInputError(f"{flag} must be an EMR Serverless id (lowercase letters and digits), "
                                       f"got {value!r}")
    return _wait(emr_client(), cast(str, application_id), args.job_run_id, args)  # matched _ID above


def _wait(client: Any, application_id: str, job_run_id: str, args: argparse.Namespace) -> int:
    run = wait_for_job_run(client, application_id, job_run_id, poll_interval=args.poll_interval,
                           timeout=args.timeout or None, report=lambda line: print(line, flush=True))
    return finish(run)


def _positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--application-id", help="EMR Serverless application (default: "
                        f"{APPLICATION_ID_ENV}, or the --stack output PipelineApplicationId)")
    parser.add_argument("--poll-interval", type=_positive, default=5.0, metavar="S",
                        help="seconds between GetJobRun polls while waiting (default 5)")
    parser.add_argument("--timeout", type=_positive, default=None, metavar="S",
                        help="stop waiting after this many seconds (the run goes on); default: no limit")


def add_submit_parsers(spark_subparsers: argparse._SubParsersAction) -> None:
    """``submit`` and ``wait`` under the ``switchyard spark`` group."""
    submit = spark_subparsers.add_parser(
        "submit", help="run the publish job on EMR Serverless (StartJobRun), optionally waiting for it",
        description="Submit jobs/publish_requests.py to EMR Serverless with the packaged environment. "
                    "Arguments after -- go to the job (e.g. -- --input s3://... --output s3://...).")
    _add_common(submit)
    submit.add_argument("--role-arn", help=f"the job's execution role (default: {JOB_ROLE_ARN_ENV}, or the "
                                           "--stack output PipelineJobRoleArn)")
    submit.add_argument("--entry-point",
                        help="s3://.../publish_requests.py (default: the bucket's package manifest)")
    submit.add_argument("--archive", help="s3://.../env.tar.gz, the packaged Python environment "
                                          "(default: the bucket's package manifest)")
    submit.add_argument("--bucket", help=f"s3://BUCKET[/prefix] that `spark package` uploaded to (default: "
                                         f"{BUCKET_ENV}, or the --stack output PipelineBucket)")
    submit.add_argument("--logs", help=f"s3:// location of the job's logs (default: {LOG_URI_ENV}, else "
                                       f"BUCKET/{DEFAULT_PREFIX}/{LOGS_SUFFIX})")
    submit.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help=f"a variable for the job's driver and executors, e.g. {AMQP_URL.name}=... "
                             "(repeatable; with --stack the stack's deployed settings the job reads are "
                             "passed too, these win)")
    submit.add_argument("--name", default="switchyard-publish", help="the job run's name")
    submit.add_argument("--wait", action="store_true", help="poll until the run ends; exit 1 unless SUCCESS")
    submit.add_argument("job_args", nargs=argparse.REMAINDER, metavar="JOB_ARGS",
                        help="after --: the job's own arguments, passed as entryPointArguments")
    submit.set_defaults(func=cmd_submit)

    wait = spark_subparsers.add_parser("wait", help="follow an EMR Serverless job run until it ends")
    _add_common(wait)
    wait.add_argument("--job-run-id", required=True, help="the job run to wait for (spark submit prints it)")
    wait.set_defaults(func=cmd_wait)

