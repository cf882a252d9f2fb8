"""Composition, as every part's: ``build_service(settings, connections)`` makes a DelayService from
settings its caller has read (nothing here reads the environment).

The adapters call it: the Lambda handlers through ``switchyard.aws.services`` (one per execution
environment, connections made once, lazily), the CLI, and the local runtime
(``switchyard.local.delay_runtime``), which installs its own so the same handlers run against it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from switchyard.core.config import Connections
from switchyard.core.observability import logger
from switchyard.delay.enqueue import enqueue_records
from switchyard.delay.fire import FireLoop
from switchyard.delay.fire_log import FireLog
from switchyard.delay.model import Drop, EnqueueOutcome, FireOutcome, InputRecord, SweepOutcome
from switchyard.delay.publisher import KafkaPublisher
from switchyard.delay.settings import DelaySettings
from switchyard.delay.store import PostgresDelayStore
from switchyard.delay.sweep import run_sweeps


class DelayService:
    """A queuing node: its id, its store and its publishers; the three operations of the seed."""

    def __init__(self, settings: DelaySettings, connections: Connections, node_id: str | None = None) -> None:
        self.settings = settings
        self.connections = connections
        self.node_id = node_id or str(uuid.uuid4())
        self.store = PostgresDelayStore(connections.postgres_dsn, settings.schema, settings.application_name,
                                        settings.store_timeout_ms / 1000)
        self._local = threading.local()
        self.fire_log = FireLog(settings.lateness_sla_ms)
        logger.info(f"delay node {self.node_id} started", extra={"node_id": self.node_id})

    def publisher(self) -> KafkaPublisher[Any]:
        """This thread's producer for the output topic. Enqueue (tokens: ids) and fire (tokens: rows)
        share it; each waits for its own deliveries before the other runs on this thread."""
        pub = getattr(self._local, "publisher", None)
        if pub is None:
            pub = KafkaPublisher(self.connections.kafka_bootstrap, self.settings.output_topic,
                                 self.settings.publish_timeout_ms, self.settings.publish_linger_ms,
                                 self.settings.max_message_bytes)
            self._local.publisher = pub
        return pub

    def enqueue(self, records: Iterable[InputRecord | Drop]) -> EnqueueOutcome:
        return enqueue_records(records, self.store, self.publisher(), self.settings)

    def fire(self, remaining_ms: Callable[[], int]) -> FireOutcome:
        outcome = FireLoop(self.store, self.publisher(), self.settings, self.node_id).run(remaining_ms)
        self.fire_log(outcome)
        return outcome

    def sweep(self, remaining_ms: Callable[[], int]) -> SweepOutcome:
        return run_sweeps(self.store, self.settings, remaining_ms)

    def close(self) -> None:
        self.store.close()



def build_service(settings: DelaySettings, connections: Connections, *,
                  node_id: str | None = None) -> DelayService:
    """A queuing node on ``connections`` (its store connects on first use)."""
    return DelayService(settings, connections, node_id)
