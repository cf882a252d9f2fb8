"""Locally, the handlers' metrics go to CloudWatch ``PutMetricData``, as the CloudWatch agent ships them.

In Lambda, Powertools prints each flushed metric set as an EMF blob on stdout and CloudWatch Logs
extracts the metrics. Locally nothing reads stdout, so with ``SWITCHYARD_SHIP_METRICS=1`` the local
runtime installs ``ShippingEMFProvider``: Powertools' own EMF provider whose flush hands the blob
to a ``MetricsShipper`` instead of printing it. The shipper converts each blob to MetricDatum
entries (one per metric and dimension set), merges equal metrics of the same second into
Values/Counts (percentiles survive), and sends them from a background thread in batches that
respect the API's limits, to the endpoint boto3 is configured with (``AWS_ENDPOINT_URL_CLOUDWATCH``
or ``AWS_ENDPOINT_URL``: LocalStack), so the alarms deployed there see the metrics AWS would.

Nothing here raises into a handler: a malformed blob is a logged, counted drop; an unreachable
CloudWatch means retries with backoff, and once the backlog is full the oldest datums are dropped
(counted, logged).
"""

from __future__ import annotations

import atexit
import functools
import json
import math
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import AmazonCloudWatchEMFProvider

from switchyard.core import observability
from switchyard.core.config import build
from switchyard.core.errors import ConfigError, SwitchyardError
from switchyard.core.observability import logger
from switchyard.core.settings import METRICS_FLUSH_INTERVAL, METRICS_MAX_BACKLOG, SHIP_METRICS

# PutMetricData's limits (API reference): 1,000 metrics and 1 MB per request, 150 distinct values
# per metric through Values/Counts, 30 dimensions per metric.
MAX_DATUMS_PER_CALL = 1000
MAX_REQUEST_BYTES = 1_000_000
MAX_VALUES_PER_DATUM = 150
MAX_DIMENSIONS = 30
# Powertools flushes a metric set on its own when it reaches 100 metrics or 100 values of one.
POWERTOOLS_MAX_METRICS = 100

SHIP_ENV = SHIP_METRICS.name
TRUE_VALUES = ("1", "true", "yes", "on")


class MalformedEMFError(SwitchyardError, ValueError):
    """A blob that is not the Embedded Metric Format Powertools writes."""


# What makes two datums one metric: (namespace, name, dimensions, unit, resolution, second).
DatumKey = tuple[str, str, tuple[tuple[str, str], ...], str, int, int]


@dataclass(frozen=True)
class Datum:
    """One metric of one dimension set in one second; ``values`` are (value, count) pairs."""

    namespace: str
    name: str
    dimensions: tuple[tuple[str, str], ...]
    unit: str
    resolution: int
    second: int
    values: tuple[tuple[float, int], ...]

    @property
    def key(self) -> DatumKey:
        return self.namespace, self.name, self.dimensions, self.unit, self.resolution, self.second

    def to_api(self) -> dict[str, Any]:
        """The MetricDatum of ``put_metric_data`` (one value as ``Value``, several as Values/Counts)."""
        datum: dict[str, Any] = {
            "MetricName": self.name,
            "Dimensions": [{"Name": k, "Value": v} for k, v in self.dimensions],
            "Timestamp": datetime.fromtimestamp(self.second, UTC),
            "Unit": self.unit,
        }
        if self.resolution == 1:
            datum["StorageResolution"] = 1
        if len(self.values) == 1 and self.values[0][1] == 1:
            datum["Value"] = self.values[0][0]
        else:
            datum["Values"] = [v for v, _ in self.values]
            datum["Counts"] = [float(c) for _, c in self.values]
        return datum


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise MalformedEMFError(f"{where}: {value!r} is not a finite number")
    return float(value)


def emf_to_datums(blob: Mapping[str, Any]) -> list[Datum]:
    """Every metric of an EMF blob, once per dimension set of its directive (the EMF specification:
    ``_aws.CloudWatchMetrics[].{Namespace, Dimensions, Metrics}``, values and dimension values as
    top-level members, ``_aws.Timestamp`` in epoch milliseconds)."""
    try:
        aws = blob["_aws"]
        second = int(_number(aws["Timestamp"], "_aws.Timestamp") // 1000)
        directives = aws["CloudWatchMetrics"]
        if not isinstance(directives, list) or not directives:
            raise MalformedEMFError("_aws.CloudWatchMetrics must be a non-empty list")
        datums: list[Datum] = []
        for directive in directives:
            namespace = directive["Namespace"]
            if not isinstance(namespace, str) or not namespace:
                raise MalformedEMFError(f"bad namespace {namespace!r}")
            dimension_sets = directive.get("Dimensions") or [[]]
            for definition in directive["Metrics"]:
                name = definition["Name"]
                raw = blob[name]
                values = [_number(v, name) for v in (raw if isinstance(raw, list) else [raw])]
                if not values:
                    raise MalformedEMFError(f"metric {name!r} has no values")
                counted = tuple(sorted(Counter(values).items()))
                unit = definition.get("Unit") or "None"
                resolution = int(definition.get("StorageResolution", 60))
                for keys in dimension_sets:
                    if len(keys) > MAX_DIMENSIONS:
                        raise MalformedEMFError(f"{len(keys)} dimensions (CloudWatch takes {MAX_DIMENSIONS})")
                    dims = tuple((str(k), str(blob[k])) for k in keys)
                    datums.append(Datum(namespace, name, dims, unit, resolution, second, counted))
        return datums
    except MalformedEMFError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MalformedEMFError(f"{type(exc).__name__}: {exc}") from exc


def merge(datums: Iterable[Datum]) -> list[Datum]:
    """Equal metrics (name, dimensions, unit, resolution, second) as one datum with Values/Counts,
    split where a metric has more distinct values than one datum may carry."""
    merged: dict[DatumKey, Counter[float]] = {}
    first: dict[DatumKey, Datum] = {}
    for d in datums:
        counts = merged.setdefault(d.key, Counter())
        first.setdefault(d.key, d)
        for value, n in d.values:
            counts[value] += n
    out: list[Datum] = []
    for key, counts in merged.items():
        pairs = sorted(counts.items())
        for i in range(0, len(pairs), MAX_VALUES_PER_DATUM):
            out.append(Datum(*key, values=tuple(pairs[i:i + MAX_VALUES_PER_DATUM])))
    return out


def _size(datum: dict[str, Any]) -> int:
    """An upper bound of a datum's bytes on the wire (CBOR and JSON are both smaller than this)."""
    return len(json.dumps(datum, default=str)) + 64


def batches(datums: Iterable[Datum]) -> Iterator[tuple[str, list[Datum]]]:
    """Per namespace, runs of datums within one request's limits (count and bytes)."""
    by_namespace: dict[str, list[Datum]] = {}
    for d in datums:
        by_namespace.setdefault(d.namespace, []).append(d)
    for namespace, items in by_namespace.items():
        batch: list[Datum] = []
        size = 256 + len(namespace)
        for d in items:
            n = _size(d.to_api())
            if batch and (len(batch) == MAX_DATUMS_PER_CALL or size + n > MAX_REQUEST_BYTES):
                yield namespace, batch
                batch, size = [], 256 + len(namespace)
            batch.append(d)
            size += n
        if batch:
            yield namespace, batch


@dataclass(frozen=True)
class ShipperSettings:
    """How often and how much the shipper sends, and how much it keeps while CloudWatch is away."""

    flush_interval_s: float = 5.0
    max_backlog: int = 20_000  # datums waiting (new or to retry); beyond it the oldest are dropped
    max_backoff_s: float = 30.0
    call_timeout_s: float = 5.0

    @classmethod
    def from_env(cls) -> ShipperSettings:
        return build(cls, {"flush_interval_s": METRICS_FLUSH_INTERVAL, "max_backlog": METRICS_MAX_BACKLOG},
                     os.environ)


@dataclass
class ShipperStats:
    """What the shipper did, for the runtime to print and the tests to assert."""

    blobs: int = 0
    datums_queued: int = 0
    datums_shipped: int = 0
    calls: int = 0
    malformed: int = 0
    dropped: int = 0  # datums dropped because the backlog was full, or rejected by CloudWatch
    errors: int = 0  # failed calls (each retried, unless CloudWatch rejected the data)

    def line(self) -> str:
        return (f"metrics shipped to CloudWatch: {self.blobs} blobs, {self.datums_shipped} datums in "
                f"{self.calls} calls; {self.malformed} malformed, {self.dropped} datums dropped, "
                f"{self.errors} failed calls")


def _transient(exc: Exception) -> bool:
    """Worth a retry: no answer, throttling, a server error. A 4xx validation error is not."""
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 500)
        code = exc.response.get("Error", {}).get("Code", "")
        return status >= 500 or status == 429 or "Throttl" in code
    return isinstance(exc, BotoCoreError | OSError)


class MetricsShipper:
    """EMF blobs in (any thread, never blocking on the network), ``PutMetricData`` batches out."""

    def __init__(self, client: Any, settings: ShipperSettings | None = None) -> None:
        self.client = client
        self.settings = settings or ShipperSettings()
        self.stats = ShipperStats()
        self._backlog: deque[Datum] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._sending = False
        self._backoff_s = 0.0
        self._thread = threading.Thread(target=self._run, name="metrics-shipper", daemon=True)
        self._thread.start()

    def submit(self, blob: Mapping[str, Any]) -> None:
        """Queue one blob's metrics; a malformed blob is logged and counted, never raised."""
        try:
            datums = emf_to_datums(blob)
        except MalformedEMFError as exc:
            with self._lock:
                self.stats.malformed += 1
            logger.warning("metrics shipper: malformed EMF blob dropped", extra={"error": str(exc)})
            return
        with self._lock:
            self.stats.blobs += 1
            self.stats.datums_queued += len(datums)
            self._backlog.extend(datums)
            self._trim()
            full = len(self._backlog) >= MAX_DATUMS_PER_CALL
        if full:
            self._wake.set()

    def _trim(self) -> None:
        """Drop the oldest datums beyond the backlog limit (caller holds the lock)."""
        excess = len(self._backlog) - self.settings.max_backlog
        if excess > 0:
            for _ in range(excess):
                self._backlog.popleft()
            self.stats.dropped += excess
            logger.warning("metrics shipper: backlog full, oldest datums dropped",
                           extra={"dropped": excess, "dropped_total": self.stats.dropped})

    def _run(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(max(self.settings.flush_interval_s, self._backoff_s))
            self._wake.clear()
            self._send_pending()

    def _send_pending(self) -> bool:
        """Send everything queued; on a transient failure put the rest back and back off."""
        with self._lock:
            if self._sending:
                return False
            self._sending = True
            pending = list(self._backlog)
            self._backlog.clear()
        try:
            unsent: list[Datum] = []
            failed = False
            for namespace, batch in batches(merge(pending)):
                if failed:
                    unsent.extend(batch)
                    continue
                failed = not self._put(namespace, batch)
                if failed:
                    unsent.extend(batch)
            self._backoff_s = min(self.settings.max_backoff_s, max(1.0, 2 * self._backoff_s)) * failed
            with self._lock:
                self._backlog.extendleft(reversed(unsent))
                self._trim()
            return not failed
        finally:
            with self._lock:
                self._sending = False
                self._idle.notify_all()

    def _put(self, namespace: str, batch: list[Datum]) -> bool:
        """One call; False when it should be retried (the batch is kept)."""
        try:
            self.client.put_metric_data(Namespace=namespace, MetricData=[d.to_api() for d in batch])
        except Exception as exc:
            transient = _transient(exc)
            with self._lock:
                self.stats.errors += 1
                if not transient:
                    self.stats.dropped += len(batch)
            logger.warning("metrics shipper: PutMetricData failed",
                           extra={"error": f"{type(exc).__name__}: {exc}", "datums": len(batch),
                                  "retry": transient})
            return not transient
        with self._lock:
            self.stats.calls += 1
            self.stats.datums_shipped += len(batch)
        return True

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Send what is queued now, from the caller's thread; True when nothing is left unsent."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._sending and time.monotonic() < deadline:
                self._idle.wait(deadline - time.monotonic())
        return self._send_pending() and not self._backlog

    def close(self, timeout_s: float = 30.0) -> ShipperStats:
        """Stop the thread and send what is left (one try: CloudWatch may be gone for good); what
        could not be sent is counted as dropped."""
        if not self._closed.is_set():
            self._closed.set()
            self._wake.set()
            self._thread.join(timeout_s)
            self.flush(timeout_s)
            with self._lock:
                left = len(self._backlog)
                self._backlog.clear()
                self.stats.dropped += left
            if left:
                logger.warning("metrics shipper: closed with datums unsent, dropped", extra={"dropped": left})
        return self.stats


class ShippingEMFProvider(AmazonCloudWatchEMFProvider):
    """Powertools' EMF provider whose flushes hand the blob to a shipper instead of printing it.

    The local runtime calls handlers from several threads while ``Metrics`` shares one metric set,
    so adding and flushing hold one lock (in Lambda one invocation runs at a time).
    """

    _lock = threading.RLock()

    def __init__(self, shipper: MetricsShipper, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shipper = shipper

    def add_metric(self, name: str, unit: Any, value: float, resolution: Any = 60) -> None:
        with self._lock:
            # Powertools prints the set itself once it reaches 100 metrics or 100 values of one:
            # ship it one step earlier, so its print never runs.
            existing = self.metric_set.get(name.strip())
            if (existing is None and len(self.metric_set) >= POWERTOOLS_MAX_METRICS - 1) or \
                    (existing is not None and len(existing["Value"]) >= POWERTOOLS_MAX_METRICS - 1):
                self._ship(keep_dimensions=True)
            super().add_metric(name=name, unit=unit, value=value, resolution=resolution)

    def flush_metrics(self, raise_on_empty_metrics: bool = False) -> None:
        with self._lock:
            if not self.metric_set:
                if raise_on_empty_metrics:
                    super().flush_metrics(raise_on_empty_metrics=True)
                return
            self._ship(keep_dimensions=False)

    def _ship(self, keep_dimensions: bool) -> None:
        from aws_lambda_powertools.metrics.functions import is_metrics_disabled

        try:
            blob = self.serialize_metric_set()
        except Exception as exc:
            with self.shipper._lock:
                self.shipper.stats.malformed += 1
            logger.warning("metrics shipper: metric set not serializable, dropped", extra={"error": str(exc)})
            blob = None
        if keep_dimensions:
            self.metric_set.clear()
        else:
            self.clear_metrics()
        if blob is not None and not is_metrics_disabled():
            self.shipper.submit(blob)


def ship_metrics_enabled() -> bool:
    return SHIP_METRICS.read(os.environ).strip().lower() in TRUE_VALUES


# The ``service`` dimension each deployed function family carries (observability names them once).
FUNCTION_SERVICES = {"delay": observability.DELAY_SERVICE, "bus": observability.BUS_SERVICE,
                     "deploy": observability.DEPLOY_SERVICE}


def service_for_function(function: str) -> str | None:
    """The deployed service of ``functions/<function>.py`` (``rpc_*``: the pool's, from
    ``SWITCHYARD_RPC_POOL``); None where unknown or ``POWERTOOLS_SERVICE_NAME`` already says it."""
    if os.environ.get("POWERTOOLS_SERVICE_NAME"):
        return None
    if function == "rpc_scheduled":  # the relay serves every pool
        return observability.SCHEDULED_SERVICE
    family = function.split("_", 1)[0]
    if family == "rpc":
        from switchyard.rpc.settings import POOL  # not at import: switchyard.rpc brings pika

        pool = POOL.read()
        return observability.pool_service(pool) if pool else None
    return FUNCTION_SERVICES.get(family)


def ship_if_enabled(service: str | None = None) -> MetricsShipper | None:
    """Install the shipper when ``SWITCHYARD_SHIP_METRICS`` is on (the local runtime's commands
    call this first); its stats are printed to stderr at exit."""
    return install_metrics_shipper(service) if ship_metrics_enabled() else None


def cloudwatch_client() -> Any:
    """boto3's CloudWatch client: endpoint from ``AWS_ENDPOINT_URL_CLOUDWATCH`` / ``AWS_ENDPOINT_URL``."""
    import boto3
    from botocore.config import Config

    # LocalStack takes seconds to store a full batch: a short read timeout would resend it.
    return boto3.client("cloudwatch", config=Config(connect_timeout=2, read_timeout=60,
                                                    retries={"max_attempts": 1, "mode": "standard"}))


_installed: MetricsShipper | None = None
_service_before: str | None = None


def install_metrics_shipper(service: str | None = None, client: Any | None = None,
                            settings: ShipperSettings | None = None) -> MetricsShipper:
    """Ship every metric of this process to CloudWatch (replacing a shipper installed before).

    ``service`` is the ``service`` dimension the deployed functions carry (``switchyard-<pool>``,
    ``switchyard-delay``): the alarms select on it. Metrics are turned on unless
    ``POWERTOOLS_METRICS_DISABLED`` says otherwise, which is a contradiction and an error.
    """
    global _installed, _service_before
    from aws_lambda_powertools.metrics.functions import is_metrics_disabled

    if os.environ.get("AWS_LAMBDA_FUNCTION_NAME"):
        raise ConfigError("the metrics shipper is for the local runtime: in Lambda, EMF on stdout is shipped")
    if is_metrics_disabled():
        raise ConfigError(f"{SHIP_ENV}=1, but POWERTOOLS_METRICS_DISABLED (or POWERTOOLS_DEV) turns them off")
    uninstall_metrics_shipper()
    shipper = MetricsShipper(client if client is not None else cloudwatch_client(),
                             settings or ShipperSettings.from_env())
    observability.use_metrics_provider(functools.partial(ShippingEMFProvider, shipper))
    _service_before = observability.metrics.service
    if service:
        observability.metrics.service = service
    _installed = shipper
    return shipper


def uninstall_metrics_shipper() -> ShipperStats | None:
    """Back to stdout EMF; the installed shipper sends what it holds and stops."""
    global _installed
    shipper, _installed = _installed, None
    if shipper is None:
        return None
    observability.metrics.service = _service_before
    observability.use_metrics_provider(None)
    return shipper.close()


def _close_at_exit() -> None:
    import sys

    stats = uninstall_metrics_shipper()
    if stats is not None:
        print(stats.line(), file=sys.stderr)


atexit.register(_close_at_exit)

