"""confluent-kafka adapter of the Publisher port: idempotent, acks=all, confirmations via callbacks.

Not thread-safe by design: each thread that fires builds its own (delivery callbacks are served to
whoever polls, so a shared producer would hand one loop another's confirmations).
"""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from switchyard.delay.errors import PublishError
from switchyard.delay.model import Header
from switchyard.delay.ports import Delivery
from switchyard.delay.settings import validate_topic


class KafkaPublisher:
    """Publishes to one topic and reports which messages the broker confirmed."""

    def __init__(self, bootstrap: str, topic: str, timeout_ms: int, linger_ms: int = 1) -> None:
        self.topic = validate_topic(topic)
        self._deliveries: list[Delivery] = []
        self._in_flight = 0
        self._producer = Producer({
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": linger_ms,
            "message.timeout.ms": timeout_ms,
            "socket.connection.setup.timeout.ms": max(1000, timeout_ms),
            "reconnect.backoff.max.ms": 500,
            "client.id": "switchyard-delay",
        })

    def _on_delivery(self, token: object) -> object:
        def callback(err: KafkaError | None, _msg: Message) -> None:
            self._in_flight -= 1
            self._deliveries.append(Delivery(token, None if err is None else str(err)))
        return callback

    def send(self, key: bytes | None, value: bytes | None, headers: Sequence[Header], token: object) -> None:
        """Queue a message; its Delivery comes back from a later poll()."""
        while True:
            try:
                self._producer.produce(
                    self.topic, value=value, key=key, headers=list(headers),
                    on_delivery=self._on_delivery(token),
                )
                self._in_flight += 1
                return
            except BufferError:
                self._producer.poll(0.05)  # local queue full: let confirmations drain first
            except KafkaException as exc:
                raise PublishError(f"cannot produce to {self.topic}: {exc}") from exc

    def poll(self, timeout_s: float) -> list[Delivery]:
        self._producer.poll(max(0.0, timeout_s))
        out, self._deliveries = self._deliveries, []
        return out

    def in_flight(self) -> int:
        return self._in_flight

    def flush(self, timeout_s: float) -> list[Delivery]:
        """Wait for every outstanding confirmation (up to ``timeout_s``) and return them."""
        self._producer.flush(max(0.0, timeout_s))
        return self.poll(0)
