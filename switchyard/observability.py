"""One structured logger and one metrics sink for the whole package (Powertools).

Locally the logger writes JSON lines to stderr (level WARNING unless set) and metrics are EMF
blobs flushed by the handler decorators, exactly as in Lambda. ``SWITCHYARD_LOG_LEVEL`` (or
``POWERTOOLS_LOG_LEVEL``) sets the level.
"""

from __future__ import annotations

import logging
import os
import sys

from aws_lambda_powertools import Logger, Metrics

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME") or "switchyard"
METRICS_NAMESPACE = os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or "Switchyard"


def _build_logger() -> Logger:
    in_lambda = bool(os.environ.get("AWS_LAMBDA_FUNCTION_NAME"))
    # Outside Lambda keep stdout for the program's own output (summaries, JSON results), and
    # keep a terminal quiet unless asked: ECS task definitions set SWITCHYARD_LOG_LEVEL=INFO.
    handler = None if in_lambda else logging.StreamHandler(sys.stderr)
    level = os.environ.get("SWITCHYARD_LOG_LEVEL") or os.environ.get("POWERTOOLS_LOG_LEVEL")
    level = level or ("INFO" if in_lambda else "WARNING")
    return Logger(service=SERVICE, level=level, logger_handler=handler)


logger = _build_logger()
metrics = Metrics(namespace=METRICS_NAMESPACE, service=SERVICE)
