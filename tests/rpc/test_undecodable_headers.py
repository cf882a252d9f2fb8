"""Strangers' messages: headers pika cannot decode, odd counts, keys and user ids (issue 34, items
1, 5, 6, 9). Each is sent raw by a plain pika client through the real RabbitMQ, at a real worker
subprocess or the local control plane's bridges, and must be that message's problem only.

pika cannot encode a year-58888 timestamp or arrays nested 1,200 deep, so ``RawHeaders`` writes the
content header's table bytes itself; the broker delivers them as they were sent.
"""

from __future__ import annotations

import decimal
import json
import struct
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pika
import pika.frame
import pytest
import redis

from switchyard.aws import services
from switchyard.local.functions import load_function
from switchyard.local.lambda_context import FakeLambdaContext
from switchyard.local.rmq_bridge import RmqDelivery, build_rmq_event
from switchyard.rpc import amqp_decode, protocol
from switchyard.rpc.client import RpcClient
from switchyard.rpc.drivers import NoopDriver
from switchyard.rpc.ports import WorkerGroup
from switchyard.rpc.service import ControlPlane
from switchyard.rpc.settings import ControlSettings, Delays
from tests.conftest import wait_for
from tests.rpc.conftest import drain, flush_pool_state
from tests.rpc.test_rpc import H, bind

SHOW = f"{H}:shed_once_and_show"
MS_NOW = int(time.time() * 1000)  # as a timestamp in seconds: the year 58,000 or so


# -- raw header tables --------------------------------------------------------------------------
def entry(name: str, value: bytes) -> bytes:
    raw = name.encode()
    return bytes([len(raw)]) + raw + value


def table(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack(">I", len(body)) + body


def string(value: str) -> bytes:
    return b"S" + struct.pack(">I", len(value.encode())) + value.encode()


def ms_timestamp() -> bytes:
    return b"T" + struct.pack(">Q", MS_NOW)


def deep_array(depth: int = 1200) -> bytes:
    value = b"V"
    for _ in range(depth):
        value = b"A" + struct.pack(">I", len(value)) + value
    return value


class RawHeaders(pika.BasicProperties):
    """Properties whose headers table is the bytes given (no content type or encoding: the table
    follows the flags)."""

    def __init__(self, raw_table: bytes, **fields: Any) -> None:
        super().__init__(**fields)
        self._raw_table = raw_table

    def encode(self) -> list[bytes]:
        pieces = pika.BasicProperties(**{k: v for k, v in vars(self).items() if k != "_raw_table"}).encode()
        flags = struct.unpack(">H", pieces[0])[0] | pika.BasicProperties.FLAG_HEADERS
        return [struct.pack(">H", flags), self._raw_table, *pieces[1:]]


class Producer:
    """A plain pika client with a reply queue of its own."""

    def __init__(self, amqp_url: str) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
        self.channel = self.connection.channel()
        self.reply_queue = self.channel.queue_declare("", exclusive=True).method.queue

    def publish(self, exchange: str, routing_key: str, body: bytes, props: pika.BasicProperties) -> None:
        self.channel.basic_publish(exchange, routing_key, body, props)

    def request(self, pool: str, key: str, body: bytes, correlation_id: str, raw_table: bytes | None = None,
                **fields: Any) -> None:
        fields = {"reply_to": self.reply_queue, "correlation_id": correlation_id, **fields}
        props = RawHeaders(raw_table, **fields) if raw_table is not None else pika.BasicProperties(**fields)
        self.publish(protocol.req_exchange(pool), protocol.routing_key(key), body, props)

    def drain(self, queue: str) -> list[tuple[pika.BasicProperties, bytes]]:
        return drain(self.channel, queue)

    def replies(self, expected: int, timeout: float = 20.0) -> dict[str, tuple[pika.BasicProperties, bytes]]:
        got: dict[str, tuple[pika.BasicProperties, bytes]] = {}

        def arrived() -> bool:
            got.update((props.correlation_id, (props, body)) for props, body in self.drain(self.reply_queue))
            return len(got) >= expected

        wait_for(arrived, timeout=timeout, what=f"{expected} replies")
        return got

    def poisoned(self, pool: str, expected: int,
                 timeout: float = 20.0) -> list[tuple[pika.BasicProperties, bytes]]:
        got: list[tuple[pika.BasicProperties, bytes]] = []

        def arrived() -> bool:
            got.extend(self.drain(protocol.poison_queue(pool)))
            return len(got) >= expected

        wait_for(arrived, timeout=timeout, what=f"{expected} poisoned messages")
        return got

    def close(self) -> None:
        self.connection.close()


@pytest.fixture
def producer(pool) -> Iterator[Producer]:
    client = Producer(pool[1].connections.amqp_url)
    yield client
    client.close()


def answer(reply: tuple[pika.BasicProperties, bytes]) -> tuple[str, Any]:
    props, body = reply
    return props.headers[protocol.STATUS_HEADER], json.loads(body)


# -- the decoder alone --------------------------------------------------------------------------
def test_the_decoder_reads_what_pika_reads_and_pika_still_calls_it() -> None:
    """Every type pika encodes decodes the same (pika's int for a float aside); and pika's frame
    decoding still goes through ``pika.spec.props``, so a change of its internals fails here."""
    headers = {"s": "v", "b": b"\xff", "n": 7, "big": 2**40, "neg": -3, "t": True, "none": None,
               "d": decimal.Decimal("1.25"), "when": datetime.fromtimestamp(2021, UTC),
               "nested": {"x-death": [{"count": 1, "routing-keys": ["k"]}]}, "list": ["a", 1]}
    encoded = b"".join(pika.BasicProperties(headers=headers, reply_to="r", timestamp=5).encode())
    ours = amqp_decode.TolerantProperties().decode(encoded)
    assert vars(ours) == vars(pika.BasicProperties().decode(encoded))
    amqp_decode.install()
    raw = b"".join(RawHeaders(table(entry("a", deep_array())), reply_to="r").encode())
    payload = struct.pack(">HHQ", 60, 0, 0) + raw
    frame = struct.pack(">BHI", pika.spec.FRAME_HEADER, 1, len(payload)) + payload + b"\xce"
    _consumed, decoded = pika.frame.decode_frame(frame)
    assert isinstance(decoded.properties, amqp_decode.TolerantProperties)
    assert decoded.properties.reply_to == "r"
    assert "nested deeper than 64" in amqp_decode.undecodable(decoded.properties.headers)


def test_a_reply_the_client_cannot_decode_reads_as_an_error_not_ok(pool, producer) -> None:
    """A stranger's worker answering with a header table pika cannot decode: the client's
    connection lived (the tolerant decoder), but the answer read as ``ok``, whatever it said."""
    name, settings = pool
    bind(name, settings, "k")
    with RpcClient(name, settings, timeout=10) as client:
        future = client.submit("k", b"question")
        request: list[tuple[pika.BasicProperties, bytes]] = []

        def taken() -> bool:
            request.extend(producer.drain(protocol.request_queue(name, "k")))
            return bool(request)

        wait_for(taken, timeout=10, what="the request in its queue")
        (props, _body), = request
        reply = table(entry(protocol.STATUS_HEADER, string("ok")), entry("a", deep_array()))
        reply_props = RawHeaders(reply, correlation_id=props.correlation_id)
        producer.publish("", props.reply_to, b"answer", reply_props)
        response = future.result(timeout=10)
        assert (response.status, response.body) == (protocol.Status.ERROR, b"answer")
        assert "nested deeper than" in response.headers[protocol.UNDECODABLE_HEADER]


# -- item 1: the worker -------------------------------------------------------------------------
def test_a_worker_poisons_a_request_pika_cannot_decode_and_serves_the_rest(pool, workers, producer) -> None:
    """A 1,200-deep array killed every worker that took the request (a delivery-limit strike for
    each request prefetched with it); a millisecond ``T`` header did too. Now the deep one is
    answered ``error``, parked in ``{pool}-poison`` with its reason and counted; the ``T`` one is
    served with the timestamp as a number; the good ones around them are answered by the same
    worker, never redelivered."""
    name, settings = pool
    bind(name, settings, "k")
    worker = workers.start(name, "k", SHOW, WORKER_PREFETCH="4")
    workers.wait_consuming(settings, protocol.request_queue(name, "k"))
    for i in range(3):
        producer.request(name, "k", b"good", f"before-{i}")
    deep = table(entry(protocol.KEY_HEADER, string("k")), entry("a", deep_array()))
    producer.request(name, "k", b"deep", "deep", deep)
    producer.request(name, "k", b"ms", "ms", table(entry("when", ms_timestamp())))
    for i in range(3):
        producer.request(name, "k", b"good", f"after-{i}")

    replies = producer.replies(8)
    goods = [answer(replies[f"{when}-{i}"]) for when in ("before", "after") for i in range(3)]
    assert goods == [("ok", {"user": None, "when": "NoneType", "count": 0})] * 6  # never redelivered
    assert answer(replies["ms"]) == ("ok", {"user": None, "when": "int", "count": 0})
    status, detail = answer(replies["deep"])
    assert status == protocol.Status.ERROR and detail["error"] == "UndecodableHeaders", detail
    (props, body), = producer.poisoned(name, 1)
    assert body == b"deep" and props.correlation_id == "deep"
    assert "nested deeper than 64" in props.headers[protocol.POISON_REASON_HEADER]
    assert worker.poll() is None
    worker.terminate()
    assert worker.wait(15) == 0
    assert worker.stderr.read().decode().count("request sent to the poison inventory") == 1


def test_a_worker_poisons_a_request_whose_reply_to_is_not_utf8(pool, workers, producer) -> None:
    """pika leaves such a ``reply_to`` bytes; the worker's reply path read it as text and died."""
    name, settings = pool
    bind(name, settings, "k")
    worker = workers.start(name, "k", SHOW)
    workers.wait_consuming(settings, protocol.request_queue(name, "k"))
    props = pika.BasicProperties(reply_to=b"\xff\xfe", correlation_id="bytes")
    producer.publish(protocol.req_exchange(name), protocol.routing_key("k"), b"bytes", props)
    producer.request(name, "k", b"good", "good")
    assert answer(producer.replies(1)["good"])[0] == protocol.Status.OK
    (props, body), = producer.poisoned(name, 1)
    assert (body == b"bytes"
            and props.headers[protocol.POISON_REASON_HEADER] == "property reply_to is not UTF-8")
    assert worker.poll() is None


# -- item 5: a shed request's counts ------------------------------------------------------------
def test_a_shed_request_whose_count_is_not_a_number_is_shed_and_answered(pool, workers, producer) -> None:
    """``x-switchyard-redeliveries: "zz"``: ``int()`` outside the worker's error handling killed the
    worker at each shed, until the delivery limit poisoned the request."""
    name, settings = pool
    bind(name, settings, "k")
    worker = workers.start(name, "k", SHOW)
    workers.wait_consuming(settings, protocol.request_queue(name, "k"))
    counts = {protocol.REDELIVERIES_HEADER: "zz", protocol.DELIVERY_COUNT_HEADER: "?"}
    producer.request(name, "k", b"shed", "zz", headers=counts)
    assert answer(producer.replies(1)["zz"]) == ("ok", {"user": None, "when": "NoneType", "count": 1})
    assert worker.poll() is None



@pytest.mark.parametrize("when", [b"d" + struct.pack(">d", 1.5), b"T" + struct.pack(">Q", 2**63 + 5)],
                         ids=["float", "timestamp past 2**63"])
def test_a_shed_copy_carries_every_header_it_was_given(when: bytes, pool, workers, producer) -> None:
    """The tolerant decoder keeps a float a float and a timestamp past Python's dates a number; the
    shed copy went back through pika's encoder, which can write neither (a float is unsupported,
    2**63 and more overflow its signed 64 bits): the worker died at each shed (the fuzz scenario)."""
    name, settings = pool
    bind(name, settings, "k")
    worker = workers.start(name, "k", SHOW)
    workers.wait_consuming(settings, protocol.request_queue(name, "k"))
    producer.request(name, "k", b"shed", "copy", table(entry("when", when)))
    kind = "float" if when[:1] == b"d" else "int"
    assert answer(producer.replies(1)["copy"]) == ("ok", {"user": None, "when": kind, "count": 1})
    assert worker.poll() is None


# -- item 9: a producer's user-id header --------------------------------------------------------
def test_a_producers_user_id_header_never_reads_as_the_broker_checked_user(pool, workers, producer) -> None:
    """``x-switchyard-user-id`` is where the orphan handler keeps the broker-checked ``user_id``: beside
    a ``user_id`` of its own a producer's header reached the handler unchanged, a shed copy (which
    drops ``user_id``: the broker checks it against the worker's user) kept only the header, and
    without any ``user_id`` the header reached the handler as it came."""
    name, settings = pool
    user = pika.URLParameters(settings.connections.amqp_url).credentials.username
    bind(name, settings, "k")
    workers.start(name, "k", SHOW)
    workers.wait_consuming(settings, protocol.request_queue(name, "k"))
    claim = {protocol.ORIGINAL_USER_ID_HEADER: "admin"}
    producer.request(name, "k", b"me", "claim", user_id=user, headers=claim)
    producer.request(name, "k", b"shed", "shed", user_id=user, headers=claim)  # its copy has no user_id
    producer.request(name, "k", b"me", "unchecked", headers=claim)  # no user_id: nothing to believe
    replies = producer.replies(3)
    assert [answer(replies[cid])[1]["user"] for cid in ("claim", "shed", "unchecked")] == [user, user, None]


# -- item 1: the bridges ------------------------------------------------------------------------
@pytest.mark.parametrize("shape", ["deep array header", "timestamp in ms"])
def test_the_orphan_bridge_goes_on_after_a_cold_start_it_cannot_decode(shape, pool, planes, producer) -> None:
    """A deep array on a cold-start request wedged the orphan bridge (it lost its connection on the
    same message for ever); a ``timestamp`` property in milliseconds killed its thread
    (``format_timestamp``). Either way no new key started again. Now the deep one is poisoned with
    its reason (its caller answered ``error``), the millisecond one is forwarded, and later keys start."""
    name, settings = pool
    planes.start(name, settings, handler=SHOW)
    if shape == "timestamp in ms":
        producer.request(name, "new-ms", b"ms", "first", timestamp=MS_NOW)
    else:
        producer.request(name, "new-deep", b"deep", "first", table(entry("a", deep_array())))
    with RpcClient(name, settings, timeout=30) as client:
        assert client.call("later", "x").ok
    status, detail = answer(producer.replies(1)["first"])
    if shape == "timestamp in ms":
        assert status == protocol.Status.OK
        return
    assert status == protocol.Status.ERROR and detail["error"] == "UndecodableHeaders", detail
    (props, body), = producer.poisoned(name, 1)
    assert body == b"deep" and "nested deeper than 64" in props.headers[protocol.POISON_REASON_HEADER]


def test_the_dead_letter_bridge_goes_on_after_an_undecodable_dead_letter(pool, planes, producer) -> None:
    """The ``{pool}-dl`` bridge lost its connection on an undecodable dead letter for ever (its
    delivery limit is 1,000,000): no later dead letter was answered."""
    name, settings = pool
    planes.start(name, settings)
    bad = table(entry(protocol.FIRST_DEATH_REASON_HEADER, string("expired")), entry("when", deep_array()))
    producer.publish("", protocol.dl_queue(name), b"dead", RawHeaders(bad, reply_to=producer.reply_queue,
                                                                   correlation_id="deep"))
    bind(name, settings, "nobody")  # no worker: the call expires and is dead-lettered
    with RpcClient(name, settings, timeout=30) as client:
        assert client.call("nobody", "x", expiration_ms=50).status == protocol.Status.EXPIRED
    props, _body = producer.replies(1)["deep"]
    assert props.headers[protocol.STATUS_HEADER] == "dead_lettered"
    (props, body), = producer.poisoned(name, 1)
    assert body == b"dead" and "nested deeper than 64" in props.headers[protocol.POISON_REASON_HEADER]


# -- item 6: a NUL in a key ---------------------------------------------------------------------
class RecordingDriver(NoopDriver):
    def __init__(self) -> None:
        super().__init__()
        self.started: list[WorkerGroup] = []

    def start(self, group: WorkerGroup) -> None:
        self.started.append(group)


@pytest.fixture
def plane(pool, redis_client: redis.Redis) -> Iterator[ControlPlane]:
    name, settings = pool
    control = ControlPlane(ControlSettings(name, Delays(30, 30)), settings, RecordingDriver(), redis_client)
    services.control_plane.install(control)
    yield control
    services.control_plane.install(None)
    control.close()
    flush_pool_state(redis_client, name)


def orphans(pool: str, *deliveries: RmqDelivery) -> dict[str, Any]:
    event = build_rmq_event(protocol.orphan_queue(pool), "/", deliveries)
    return load_function("rpc_orphans").lambda_handler(event, FakeLambdaContext("rpc_orphans", 60_000))


def test_a_key_with_a_nul_is_refused_at_the_orphan_path(pool, plane, producer, capfd) -> None:
    """A NUL reached the driver's ``Popen`` (``embedded null byte``), retried and logged with a
    traceback at every reconciler pass, the raw NUL in the log."""
    name, _settings = pool
    headers = {protocol.KEY_HEADER: "a\x00b"}
    props = pika.BasicProperties(headers=headers, reply_to=producer.reply_queue, correlation_id="nul")
    outcome = orphans(name, RmqDelivery(b"nul", props))
    assert outcome["invalid_key"] == 1 and outcome["forwarded"] == 0, outcome
    assert plane.driver.started == []
    assert plane.state.get("a\x00b") is None
    status, detail = answer(producer.replies(1)["nul"])
    assert status == protocol.Status.ERROR and detail["error"] == "InvalidKey"
    (poisoned, body), = producer.poisoned(name, 1)
    assert body == b"nul" and "NUL" in poisoned.headers[protocol.POISON_REASON_HEADER]
    out, err = capfd.readouterr()
    assert "\x00" not in out + err


def test_the_orphan_handler_keeps_only_the_broker_checked_user_id(pool, plane, producer) -> None:
    """A producer's own ``x-switchyard-user-id`` was forwarded as if the broker had checked it."""
    name, _settings = pool
    claim = pika.BasicProperties(headers={protocol.KEY_HEADER: "u",
                                          protocol.ORIGINAL_USER_ID_HEADER: "admin"})
    checked = pika.BasicProperties(headers={protocol.KEY_HEADER: "u",
                                            protocol.ORIGINAL_USER_ID_HEADER: "admin"},
                                   user_id="guest")
    assert orphans(name, RmqDelivery(b"claim", claim), RmqDelivery(b"checked", checked))["forwarded"] == 2
    got = {body: props.headers.get(protocol.ORIGINAL_USER_ID_HEADER)
           for props, body in producer.drain(protocol.request_queue(name, "u"))}
    assert got == {b"claim": None, b"checked": "guest"}


def test_the_handlers_poison_an_aws_event_message_nested_too_deep(pool, plane, producer) -> None:
    """On AWS the Java client decodes what pika cannot, and the ``aws:rmq`` event carries it: a
    500-deep array made the orphan and dead-letter handlers raise ``RecursionError`` on the whole
    batch, redelivered for ever."""
    name, _settings = pool
    deep: Any = []
    for _ in range(500):
        deep = [deep]
    good = pika.BasicProperties(headers={protocol.KEY_HEADER: "fine"}, correlation_id="fine")
    event = build_rmq_event(protocol.orphan_queue(name), "/", [RmqDelivery(b"fine", good)])
    message = {**event["rmqMessagesByQueue"][f"{protocol.orphan_queue(name)}::/"][0]}
    message["basicProperties"] = {**message["basicProperties"], "correlationId": "deep",
                                  "replyTo": producer.reply_queue,
                                  "headers": {"x-switchyard-key": {"bytes": [107]}, "a": deep}}
    event["rmqMessagesByQueue"][f"{protocol.orphan_queue(name)}::/"].insert(0, message)
    context = FakeLambdaContext("rpc_orphans", 60_000)
    outcome = load_function("rpc_orphans").lambda_handler(event, context)
    assert outcome["undecodable"] == 1 and outcome["forwarded"] == 1, outcome
    assert answer(producer.replies(1)["deep"])[1]["error"] == "UndecodableHeaders"
    (props, _body), = producer.poisoned(name, 1)
    assert "nested deeper than" in props.headers[protocol.POISON_REASON_HEADER]
    dead = {protocol.dl_queue(name) + "::/": [message]}
    outcome = load_function("rpc_dead_letters").lambda_handler({**event, "rmqMessagesByQueue": dead}, context)
    assert outcome["undecodable"] == 1 and outcome["responses"] == 1, outcome
    activity = {protocol.activity_queue(name) + "::/": [message]}
    outcome = load_function("rpc_activity").lambda_handler({**event, "rmqMessagesByQueue": activity}, context)
    assert (outcome["undecodable"], outcome["without_key"], outcome["keys"]) == (1, 0, 0), outcome
