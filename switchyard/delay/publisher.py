"""confluent-kafka adapter of the Publisher port: idempotent, acks=all, confirmations via callbacks.

Not thread-safe by design: each thread that fires builds its own (delivery callbacks are served to
whoever polls, so a shared producer would hand one loop another's confirmations).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from switchyard.delay.errors import MessageRefusedError, PublishError
from switchyard.delay.model import Header
from switchyard.delay.ports import Delivery
from switchyard.delay.settings import validate_topic
from switchyard.msk_auth import kafka_security_config
from switchyard.observability import logger

# Errors about one message itself: another attempt fails the same way (anything else may pass).
REFUSED_CODES = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG, KafkaError.INVALID_MSG_SIZE,
                           KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD})


class KafkaPublisher:
    """Publishes to one topic and reports which messages the broker confirmed."""

    def __init__(self, bootstrap: str, topic: str, timeout_ms: int, linger_ms: int = 1,
                 max_message_bytes: int = 1_000_000) -> None:
        self.topic = validate_topic(topic)
        self._deliveries: list[Delivery] = []
        self._outstanding: dict[int, object] = {}
        self._sequence = itertools.count()
        self._fatal = False
        self._config = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": linger_ms,
            "message.timeout.ms": timeout_ms,
            "message.max.bytes": max_message_bytes,  # larger messages are refused (and parked) here
            "socket.connection.setup.timeout.ms": max(1000, timeout_ms),
            "reconnect.backoff.max.ms": 500,
            "client.id": "switchyard-delay",
            "error_cb": self._on_error,
            **kafka_security_config(),  # MSK on AWS: IAM (SASL/OAUTHBEARER); locally nothing
        }
        self._producer = Producer(self._config)

    def _on_error(self, err: KafkaError) -> None:
        # An idempotent producer turns fatal when the broker forgot its producer id (e.g. the
        # broker restarted with empty storage): it must be replaced, or it never sends again.
        if err.fatal():
            self._fatal = True
            logger.error("output producer failed fatally; replacing it", extra={"error": str(err)})

    def _replace_if_fatal(self) -> None:
        if self._fatal:
            self._producer.poll(0)
            for token in self._outstanding.values():  # never confirmed: report them failed
                self._deliveries.append(Delivery(token, "producer replaced after a fatal error"))
            self._outstanding.clear()
            self._producer = Producer(self._config)
            self._fatal = False

    def _on_delivery(self, number: int) -> object:
        def callback(err: KafkaError | None, _msg: Message) -> None:
            token = self._outstanding.pop(number, None)
            if token is None:
                return  # already reported failed when the producer was replaced
            if err is not None and err.fatal():
                self._fatal = True
            refused = err is not None and err.code() in REFUSED_CODES
            self._deliveries.append(Delivery(token, None if err is None else str(err), refused))
        return callback

    def send(self, key: bytes | None, value: bytes | None, headers: Sequence[Header], token: object) -> None:
        """Queue a message; its Delivery comes back from a later poll()."""
        self._replace_if_fatal()
        number = next(self._sequence)
        while True:
            try:
                self._producer.produce(
                    self.topic, value=value, key=key, headers=list(headers),
                    on_delivery=self._on_delivery(number),
                )
                self._outstanding[number] = token
                return
            except BufferError:
                self._producer.poll(0.05)  # local queue full: let confirmations drain first
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                # After a fatal error, produce() raises _FATAL, whose own fatal() is False.
                if isinstance(error, KafkaError) and (error.fatal() or error.code() == KafkaError._FATAL):
                    self._fatal = True
                if isinstance(error, KafkaError) and error.code() in REFUSED_CODES:
                    raise MessageRefusedError(f"{self.topic} refuses this message: {error.str()}") from exc
                raise PublishError(f"cannot produce to {self.topic}: {exc}") from exc

    def poll(self, timeout_s: float) -> list[Delivery]:
        try:
            self._producer.poll(max(0.0, timeout_s))
        except KafkaException as exc:  # a fatal error is raised here too, not only to error_cb
            logger.error("output producer failed fatally; replacing it", extra={"error": str(exc)})
            self._fatal = True
        self._replace_if_fatal()
        out, self._deliveries = self._deliveries, []
        return out

    def in_flight(self) -> int:
        return len(self._outstanding)

    def flush(self, timeout_s: float) -> list[Delivery]:
        """Wait for every outstanding confirmation (up to ``timeout_s``) and return them."""
        self._producer.flush(max(0.0, timeout_s))
        return self.poll(0)
