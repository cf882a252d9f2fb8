"""One structured logger and one metrics sink for the whole package (Powertools).

Locally the logger writes one readable line per record to stderr (``WARNING switchyard: message
key=value``; level WARNING unless set); on AWS (in Lambda or an ECS task) or with
``SWITCHYARD_LOG_FORMAT=json`` it writes Powertools' JSON lines. ``SWITCHYARD_LOG_LEVEL`` (or
``POWERTOOLS_LOG_LEVEL``) sets the level. Metrics are EMF blobs flushed by the handler decorators,
exactly as in Lambda; the command line ships them or turns them off (stdout is for results).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import asdict
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import AmazonCloudWatchEMFProvider
from aws_lambda_powertools.utilities.data_classes import event_source

from switchyard.core.deployed_config import DEFAULT_METRICS_NAMESPACE
from switchyard.core.settings import LOG_FORMAT, LOG_LEVEL, METRICS_NAMESPACE, XRAY_PATCH

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME") or "switchyard"
# The ``service`` dimension of each part's metrics: the deployed functions carry it (stacks/) and the
# alarms select on it, so metrics shipped from the local runtime must carry the same.
DELAY_SERVICE = "switchyard-delay"
BUS_SERVICE = "switchyard-bus"
DEPLOY_SERVICE = "switchyard-deploy"
SCHEDULED_SERVICE = "switchyard-scheduled"  # the scheduled-call relay: one for every pool


def pool_service(pool: str) -> str:
    """The service of a pool's control-plane functions (``switchyard-<pool>``)."""
    return f"switchyard-{pool}"


def metrics_namespace(source: Mapping[str, str] | None = None) -> str:
    """This process's namespace: Powertools' variable (each deployed function and task has its stack's),
    else the deployed stack's configuration (``switchyard --stack NAME`` names it), else the default.
    ``source``: where settings are read (default: the environment over the deployed configuration)."""
    return (os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or METRICS_NAMESPACE.read(source)
            or DEFAULT_METRICS_NAMESPACE)



REDACTED = "<redacted>"
# A URL's userinfo: its netloc runs to the first / ? # (or the end of the word), and the userinfo to
# the netloc's LAST @, as urllib and the drivers read it (a password may hold an @).
URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/?#\s\"'<>]*)@")
# Credentials as they appear in log lines and messages: a token in the path of the bus's token
# routes, an Authorization value, a URL's userinfo, a generated bus token's secret part, and the
# values of JSON or key=value fields named after credentials.
_CREDENTIALS = (
    (re.compile(r"(/api_tokens/)[^/\s\"'?#]+"), rf"\1{REDACTED}"),
    (re.compile(r"(?i)\b(basic|bearer)(\s+)[A-Za-z0-9._~+/=-]+"), rf"\1\2{REDACTED}"),
    (URL_USERINFO, rf"\1{REDACTED}@"),
    (re.compile(r"\b([a-z0-9:_-]+--)[0-9a-f]{32}\b"), rf"\1{REDACTED}"),
    (re.compile(r"(?i)([\"']?\b(?:api_?token|token|uuid|password|passwd|secret|root_?key|authorization)"
                r"[\"']?\s*[:=]\s*[\"']?)[^\"'\s,}&]+"), rf"\1{REDACTED}"),
)


def redact(text: str) -> str:
    """``text`` with every credential it shows replaced by ``<redacted>`` (logs and error messages:
    a token read in a log is a token anyone with log access holds)."""
    for pattern, replacement in _CREDENTIALS:
        text = pattern.sub(replacement, text)
    return text


def redact_url(text: str) -> str:
    """``text`` with the password of every URL in it shown as ``***`` (the user name kept): what
    ``switchyard config`` and the command line's error lines print."""

    def hide(match: re.Match[str]) -> str:
        user, has_password, _ = match.group(2).partition(":")
        return f"{match.group(1)}{user}:***@" if has_password else match.group(0)

    return URL_USERINFO.sub(hide, text)


def printable(text: str, width: int = 0) -> str:
    """``text`` safe for a terminal: every control character (ESC, a newline, a bidi override) as its
    visible escape (``\\x1b``, ``\\n``), so a caller's key or id can neither clear the screen nor
    forge a line. Every human output goes through it (``switchyard.cli.options.show``, the text log);
    ``width``: cut to that many characters, the last one ``…``."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if width and len(text) > width:
        text = text[:width - 1] + "…"
    return text


class RedactingStreamHandler(logging.StreamHandler):
    """A stream handler whose every line, whatever its level, fields or traceback, is redacted
    after formatting: no logger, ``extra`` field or exception message can print a credential."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


LOG_FORMAT_ENV = LOG_FORMAT.name
LOG_FORMATS = ("text", "json")
# Keys every Powertools record carries, and the Lambda context's (the local runtime's fake one);
# the text line shows level, service and message in front and drops the rest (the time is the
# terminal's, the location a developer's, the context the same for every line of a handler).
_STANDARD_KEYS = frozenset({"level", "location", "message", "timestamp", "service", "exception",
                            "exception_name", "exception_notes", "stack_trace", "xray_trace_id",
                            "sampling_rate", "cold_start", "function_name", "function_memory_size",
                            "function_arn", "function_request_id"})


class TextFormatter(LambdaPowertoolsFormatter):
    """Powertools' formatter with a line a person reads instead of JSON:
    ``WARNING switchyard: worker exited pool=core code=1`` (a traceback, if any, below it). The
    message and the fields carry others' text (keys, call ids): control characters are escaped
    (``printable``), so a record is one line whatever it holds."""

    def serialize(self, log: Any) -> str:
        extra = " ".join(f"{printable(key)}={_text_value(value)}" for key, value in log.items()
                         if key not in _STANDARD_KEYS)
        line = printable(f"{log.get('level')} {log.get('service')}: {log.get('message')}")
        line += f" {extra}" if extra else ""
        exception = log.get("exception")
        return f"{line}\n{exception}" if exception else line

    def formatException(self, ei: Any) -> str:
        """The traceback's frames line by line; each exception's message (anyone's text) on one line."""
        chunks = traceback.format_exception(*ei)
        return "".join(chunk if chunk.startswith(_TRACEBACK_CHUNKS) else f"{printable(chunk.rstrip())}\n"
                       for chunk in chunks).rstrip()


# How the chunks of ``traceback.format_exception`` begin that are not an exception's message: its
# header, a frame (indented), the line between chained exceptions.
_TRACEBACK_CHUNKS = ("Traceback (most recent call last):", "  ", "\n")


def _text_value(value: Any) -> str:
    if not isinstance(value, str):
        value = json.dumps(value, default=str, separators=(",", ":"))
    text = printable(value)
    return '"' + text.replace('"', '\\"') + '"' if not text or " " in text else text


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_format() -> str:
    """``json`` on AWS (Lambda, an ECS task: their logs are queried as JSON) or when
    ``SWITCHYARD_LOG_FORMAT=json`` asks; ``text`` otherwise."""
    asked = LOG_FORMAT.read(os.environ).strip().lower()
    if asked in LOG_FORMATS:
        return asked
    on_aws = os.environ.get("AWS_LAMBDA_FUNCTION_NAME") or os.environ.get("ECS_CONTAINER_METADATA_URI_V4")
    return "json" if on_aws else "text"


def _build_logger() -> Logger:
    in_lambda = bool(os.environ.get("AWS_LAMBDA_FUNCTION_NAME"))
    # Outside Lambda keep stdout for the program's own output (summaries, JSON results), and
    # keep a terminal quiet unless asked: ECS task definitions set SWITCHYARD_LOG_LEVEL=INFO.
    # (Lambda reads stdout, as Powertools' own handler writes.)
    handler = RedactingStreamHandler(sys.stdout if in_lambda else sys.stderr)
    default = "INFO" if in_lambda else "WARNING"
    asked = LOG_LEVEL.read(os.environ) or os.environ.get("POWERTOOLS_LOG_LEVEL") or default
    level = asked.strip().upper()
    known = level in LOG_LEVELS  # a typo must not stop every process (or Lambda init) at import
    formatter = TextFormatter() if log_format() == "text" else None
    built = Logger(service=SERVICE, level=level if known else default, logger_handler=handler,
                   logger_formatter=formatter)
    if not known:
        built.warning(f"log level {asked[:32]!r} is not one of {', '.join(LOG_LEVELS)}; using {default}")
    return built


class NoTracer:
    """Stands in for Powertools' ``Tracer`` where no trace would be recorded (outside Lambda, or
    ``POWERTOOLS_TRACE_DISABLED``). ``Tracer()`` imports the X-Ray SDK and botocore whether or not
    it traces: about half a second of CPU that every worker start, CLI call and local handler would
    pay for nothing."""

    @staticmethod
    def capture_lambda_handler(function: Callable | None = None, **_: Any) -> Callable:
        return function if function is not None else (lambda f: f)

    capture_method = capture_lambda_handler

    @staticmethod
    def put_annotation(key: str, value: Any) -> None:
        """Nothing to annotate: no segment is recorded."""

    put_metadata = put_annotation


def _build_tracer() -> Tracer | NoTracer:
    disabled = os.environ.get("POWERTOOLS_TRACE_DISABLED", "").lower() in ("1", "true", "yes", "on")
    if os.environ.get("LAMBDA_TASK_ROOT") and not disabled:
        # No auto-patching: patching botocore imports it whole (about 350 ms of a cold start) for
        # subsegments of AWS calls that only the reconciler's ECS driver makes. The handler's own
        # segment is still recorded; SWITCHYARD_XRAY_PATCH=botocore,requests patches on demand.
        patch: list[str] = list(XRAY_PATCH.read(os.environ))
        return Tracer(service=SERVICE, auto_patch=bool(patch), patch_modules=patch or None)
    return NoTracer()


class EMFProvider(AmazonCloudWatchEMFProvider):
    """Powertools' stdout EMF provider, silent while ``POWERTOOLS_METRICS_DISABLED`` is on.

    Powertools' switch only skips the flush's print, and keeps the set: in a process that lives
    longer than one invocation (the local runtime, the demo) the set grows with every handler call
    until a metric's 100th value, which ``add_metric`` prints whatever the switch says. Here a
    metric added while metrics are off is not kept, and a flush while they are off drops the set.
    """

    def add_metric(self, name: str, unit: Any, value: float, resolution: Any = 60) -> None:
        from aws_lambda_powertools.metrics.functions import is_metrics_disabled

        if not is_metrics_disabled():
            super().add_metric(name=name, unit=unit, value=value, resolution=resolution)

    def flush_metrics(self, raise_on_empty_metrics: bool = False) -> None:
        from aws_lambda_powertools.metrics.functions import is_metrics_disabled

        if is_metrics_disabled():
            self.clear_metrics()  # what was added before the switch went on is not printed later
            return
        super().flush_metrics(raise_on_empty_metrics=raise_on_empty_metrics)


logger = _build_logger()
metrics = Metrics(namespace=metrics_namespace(os.environ), service=SERVICE)  # no AWS call at import
tracer = _build_tracer()
_provider_factory: Callable[..., AmazonCloudWatchEMFProvider] | None = None


def use_metrics_provider(factory: Callable[..., AmazonCloudWatchEMFProvider] | None) -> None:
    """Route every metric through providers built by ``factory`` (it takes the keyword arguments of
    Powertools' ``AmazonCloudWatchEMFProvider``) instead of stdout EMF; ``None`` restores stdout
    (``EMFProvider``).

    The local runtime ships metrics to CloudWatch this way (nothing reads its stdout); Lambda never
    calls it. The metric, dimension and metadata sets stay the ones ``Metrics`` shares.
    """
    global _provider_factory
    _provider_factory = factory
    # The local runtime's shipper: the stack's namespace, if the process names one; stdout (at import
    # too): the environment's alone, as at import, where the deployed configuration is not read.
    metrics.namespace = metrics_namespace() if factory is not None else metrics_namespace(os.environ)
    metrics.provider = (factory or EMFProvider)(
        namespace=metrics.namespace, service=metrics.service, metric_set=metrics.metric_set,
        dimension_set=metrics.dimension_set, metadata_set=metrics.metadata_set,
        default_dimensions=metrics.default_dimensions)


use_metrics_provider(None)  # Powertools' own provider would keep (and print) metrics while they are off


def _log_metrics(handler: Callable) -> Callable:
    """``metrics.log_metrics`` looked up at each call, so a handler loaded before the local runtime
    installed its provider flushes through it too (the decorator binds the provider it was built on)."""

    @functools.wraps(handler)
    def with_metrics(event: Any, context: Any) -> Any:
        return metrics.log_metrics(handler)(event, context)

    return with_metrics


def emit_gauge(name: str, value: float, dimension: str, dimension_value: str) -> None:
    """One metric with its own dimension (e.g. queue depth per worker group), flushed at once."""
    from aws_lambda_powertools.metrics import MetricUnit, single_metric
    from aws_lambda_powertools.metrics.functions import is_metrics_disabled

    if is_metrics_disabled():
        return
    if _provider_factory is not None:  # the local runtime's provider (its CloudWatch shipper)
        gauge = _provider_factory(namespace=metrics.namespace, service=metrics.service)
        gauge.add_dimension(name=dimension, value=dimension_value)
        gauge.add_metric(name=name, unit=MetricUnit.Count, value=value)
        gauge.flush_metrics()
        return
    with single_metric(name=name, unit=MetricUnit.Count, value=value, namespace=metrics.namespace) as metric:
        metric.add_dimension(name=dimension, value=dimension_value)


def emit_counts(outcome: object, prefix: str = "") -> None:
    """Add every integer field of an outcome dataclass as a Count metric (``forwarded`` -> ``Forwarded``)."""
    from dataclasses import fields

    from aws_lambda_powertools.metrics import MetricUnit

    for f in fields(outcome):  # type: ignore[arg-type]
        value = getattr(outcome, f.name)
        if isinstance(value, int) and not isinstance(value, bool):
            name = prefix + "".join(part.capitalize() for part in f.name.split("_"))
            metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)


MAX_TRACES_NOTED = 100  # trace ids one invocation annotates (a batch may hold thousands)
_traces_seen: ContextVar[list[str] | None] = ContextVar("switchyard_traces_seen", default=None)


def note_trace(trace_id: str) -> None:
    """Remember a W3C trace id this invocation worked on (``switchyard.core.tracing.scope`` calls it)."""
    seen = _traces_seen.get()
    if seen is not None and len(seen) < MAX_TRACES_NOTED and trace_id not in seen[-1:]:
        seen.append(trace_id)


def xray_root(trace_id: str) -> str:
    """A W3C trace id in X-Ray's form, ``1-<first 8 hex>-<last 24 hex>`` (X-Ray reads the first
    part as the epoch seconds the trace began; a W3C id carries none, so it is taken as it is)."""
    return f"1-{trace_id[:8]}-{trace_id[8:]}"


def joins_traces(handler: Callable) -> Callable:
    """Annotate the invocation's X-Ray subsegment with the W3C traces its work noted: ``trace_id``
    (the first, searchable: ``annotation.trace_id = "<32 hex>"``) and, as metadata, all of them
    with their X-Ray roots. Inside ``tracer.capture_lambda_handler``, whose subsegment it annotates."""

    @functools.wraps(handler)
    def joined(event: Any, context: Any) -> Any:
        seen: list[str] = []
        token = _traces_seen.set(seen)
        try:
            return handler(event, context)
        finally:
            _traces_seen.reset(token)
            if seen:
                tracer.put_annotation("trace_id", seen[0])
                tracer.put_metadata("traces", {trace: xray_root(trace) for trace in seen})

    return joined


def lambda_handler_for(
    work: Callable[[Any, Any], Any],
    *,
    data_class: type,
    metric_prefix: str = "",
    report: Callable[[Any], None] | None = None,
    respond: Callable[[Any], Any] | None = None,
) -> Callable:
    """A Lambda entry point around one core call, in the Powertools way.

    Logger context, tracing (the W3C traces of its messages annotated: ``joins_traces``) and
    metrics decorators; the event parsed into ``data_class`` and
    handed to ``work(event, context)``; the outcome dataclass it returns is reported as metrics
    (``report(outcome)``, or every count field under ``metric_prefix``) and returned as JSON, or
    as ``respond(outcome)`` where the event source reads a response (a partial batch response).
    """

    @_log_metrics
    @tracer.capture_lambda_handler
    @joins_traces
    @logger.inject_lambda_context
    @event_source(data_class=data_class)
    def lambda_handler(event: Any, context: Any) -> dict[str, Any]:
        outcome = work(event, context)
        if report is not None:
            report(outcome)
        else:
            emit_counts(outcome, prefix=metric_prefix)
        return respond(outcome) if respond is not None else asdict(outcome)

    return lambda_handler
