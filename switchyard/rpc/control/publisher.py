"""Batch publishing with publisher confirms, pipelined: the control plane's only way to publish.

Handlers publish a whole batch, then wait until the broker has confirmed every message, and
only then return (so their input batch is acked). Any nack, return of a mandatory message,
lost connection or timeout raises: the input batch is redelivered and duplicates, never losses,
follow.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import pika
import pika.exceptions
import pika.spec

from switchyard.rpc.amqp import (
    connect,
    enable_async_confirms,
    frame_max,
    is_alive,
    publish_buffered,
    url_parameters,
)
from switchyard.rpc.errors import BrokerError, PublishRejectedError, UnroutableError
from switchyard.rpc.protocol import NOT_FOUND


@dataclass(frozen=True)
class Outgoing:
    exchange: str
    routing_key: str
    body: bytes
    properties: pika.BasicProperties
    mandatory: bool = False


class ConfirmingPublisher:
    """One connection and confirm-mode channel, reopened after failures. Not thread-safe."""

    def __init__(self, amqp_url: str, name: str) -> None:
        self._url = amqp_url
        self._name = name
        self._connection: pika.BlockingConnection | None = None
        self._channel: Any = None
        self._unconfirmed: set[int] = set()
        self._nacked = 0
        self._returned: list[str] = []
        self._next_tag = 0
        self._nacked_tags: set[int] = set()
        self._returned_ids: set[str] = set()

    def _ensure_channel(self) -> Any:
        if not is_alive(self._connection):
            self._connection = connect(self._url, self._name)
            self._channel = None
        if self._channel is None or not self._channel.is_open:
            channel = self._connection.channel()
            channel.add_on_return_callback(self._on_return)
            self._unconfirmed.clear()
            self._next_tag = 0
            enable_async_confirms(channel, self._on_confirm)
            self._channel = channel
        return self._channel

    def publish_all(self, messages: Iterable[Outgoing], timeout: float = 30.0) -> int:
        """Publish every message and wait for all confirms; returns how many were published."""
        try:
            return self._publish_all(messages, timeout)
        except pika.exceptions.AMQPError as exc:
            self.close()
            raise BrokerError(f"publishing failed, nothing acknowledged: {exc!r}") from exc

    def _publish_all(self, messages: Iterable[Outgoing], timeout: float) -> int:
        channel = self._ensure_channel()
        self._nacked = 0
        self._returned = []
        count = 0
        for msg in messages:
            # Record before publishing: basic_publish may already process the broker's confirm.
            self._next_tag += 1
            self._unconfirmed.add(self._next_tag)
            publish_buffered(channel, msg.exchange, msg.routing_key, msg.body, msg.properties,
                             mandatory=msg.mandatory)
            count += 1
        self._wait_confirms(channel, timeout)
        if self._nacked:
            raise PublishRejectedError(f"the broker nacked {self._nacked} of {count} messages")
        if self._returned:
            raise UnroutableError(
                f"{len(self._returned)} mandatory messages were returned: {self._returned[0]}")
        return count

    def publish_settled(self, messages: list[Outgoing], timeout: float = 30.0) -> list[str | None]:
        """Publish every message and wait for all confirms; one outcome each, in order: None
        (confirmed), ``"returned"`` (a mandatory message nothing routed) or ``"nacked"``. A lost
        connection or a timeout still raises ``BrokerError`` (none of them is known to be there).
        Returns are matched by ``message_id``: give each mandatory message its own."""
        try:
            return self._publish_settled(messages, timeout)
        except pika.exceptions.AMQPError as exc:
            self.close()
            raise BrokerError(f"publishing failed, nothing acknowledged: {exc!r}") from exc

    def _publish_settled(self, messages: list[Outgoing], timeout: float) -> list[str | None]:
        channel = self._ensure_channel()
        self._nacked_tags, self._returned_ids = set(), set()
        tags = []
        for msg in messages:
            self._next_tag += 1
            self._unconfirmed.add(self._next_tag)
            tags.append(self._next_tag)
            publish_buffered(channel, msg.exchange, msg.routing_key, msg.body, msg.properties,
                             mandatory=msg.mandatory)
        self._wait_confirms(channel, timeout)
        nacked, returned = self._nacked_tags, self._returned_ids
        self._nacked_tags, self._returned_ids = set(), set()
        return ["nacked" if tag in nacked else
                "returned" if msg.mandatory and msg.properties.message_id in returned else None
                for tag, msg in zip(tags, messages, strict=True)]

    @property
    def user(self) -> str:
        """The broker user it publishes as: a ``user_id`` it sets is checked against it."""
        return url_parameters(self._url).credentials.username

    def frame_max(self) -> int:
        """The frame size negotiated with the broker (connecting if need be): a message's
        properties must fit in one frame (``switchyard.rpc.frames``)."""
        try:
            self._ensure_channel()
        except pika.exceptions.AMQPError as exc:
            self.close()
            raise BrokerError(f"connecting to publish: {exc!r}") from exc
        return frame_max(cast("pika.BlockingConnection", self._connection))

    def exchange_exists(self, exchange: str) -> bool:
        """Whether ``exchange`` exists (a passive declare, on a channel of its own: a 404 closes it)."""
        self._ensure_channel()
        try:
            channel = cast("pika.BlockingConnection", self._connection).channel()
            try:
                channel.exchange_declare(exchange, passive=True)
            except pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code == NOT_FOUND:
                    return False
                raise
            channel.close()
            return True
        except pika.exceptions.AMQPError as exc:
            self.close()
            raise BrokerError(f"checking exchange {exchange!r}: {exc!r}") from exc

    def _wait_confirms(self, channel: Any, timeout: float) -> None:
        """Until the broker confirmed every publish. Confirms are handled inside the I/O, which does
        not end the wait: poll in short steps. _ensure_channel connected it; close() (which clears
        it) is always followed by a raise."""
        deadline = time.monotonic() + timeout
        while self._unconfirmed:
            if time.monotonic() > deadline:
                self.close()
                raise BrokerError(f"{len(self._unconfirmed)} publishes unconfirmed after {timeout:.0f}s")
            cast("pika.BlockingConnection", self._connection).process_data_events(time_limit=0.002)
            if not channel.is_open:
                self.close()
                raise BrokerError("the channel closed before every publish was confirmed")

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tags = ([t for t in self._unconfirmed if t <= method.delivery_tag] if method.multiple
                else [method.delivery_tag])
        for tag in tags:
            self._unconfirmed.discard(tag)
        if isinstance(method, pika.spec.Basic.Nack):
            self._nacked += len(tags)
            self._nacked_tags.update(tags)

    def _on_return(self, _channel: Any, method: pika.spec.Basic.Return, props: Any, _body: bytes) -> None:
        if props.message_id is not None:
            self._returned_ids.add(props.message_id)
        self._returned.append(
            f"{method.reply_code} {method.reply_text} ({method.exchange}/{method.routing_key})")

    def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                connection.close()
