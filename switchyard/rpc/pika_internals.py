"""Every pika internal Switchyard reaches into (from ``switchyard.rpc.amqp`` and ``amqp_decode`` only),
in one list, each with the use it serves and what that use buys.

pika is pinned exactly (``PIKA_VERSION``: pyproject.toml, requirements.txt, constraints.txt), and
tests/rpc/test_pika_internals.py opens a plain pika connection and checks every path below: that it
is there and, for a callable, that its parameters are the ones listed. A pika upgrade fails there
first, naming what moved, before any RPC test times out on it. mypy reads pika as ``Any`` (pika ships
no ``py.typed``), so that test is the check.

The uses and their measured gains (docs/benchmarks.md, "The hot path"; valgrind's callgrind counts
instructions per sequential call, which load does not move much, unlike times):

* ``direct``, ``passes``, ``wake``: consuming on the underlying channel (``consume_direct``), one
  pass of the loop under one timer (``LoopPasses``) and wakes through the loop (``wake_threadsafe``)
  replaced BlockingChannel's event queues and ``process_data_events``' timer per call. With
  ``written`` below they took client + worker from 1,234,154 to about 950,000 instructions per
  call (-23 %), level with plain pika's 953,700; measured together (2026-11-27), not one by one.
  ``direct`` is also a fix: BlockingChannel's handler of a broker's cancel raises ``KeyError`` for a
  consumer it does not know, which tore the connection down; a worker whose queue is deleted now
  stops cleanly (tests/rpc: the queue-deleted tests).
* ``written``: a request, or a reply with its ack, joined into one ``send`` and sent when written,
  with no writability watch turned on and off around it (``written_together``, ``_Cork``,
  ``send_now``). Saves per request two ``epoll_ctl`` calls, a pass of the loop, and 2-3 ``send``
  calls (a publish is three frames, an ack one). Measured on its own 2026-12-02 (``bench/rpc_cost.py
  --calls 100``, quorum queues; the same checkout with ``_coalesce_writes`` a no-op, run just before,
  load average 7-13 on 2 shared cores): client + worker 1,306,236 instructions per sequential call
  without (client 572,010, worker 734,226), 1,101,637 with (499,658 and 601,979): -16 % (client
  -13 %, worker -18 %), before the system calls it saves, which callgrind does not count. Plain pika,
  earlier that hour (load average 50): 943,659 (419,233 and 524,426); Switchyard then: 1,180,005.
  In calls/s (``bench/rpc_bench.py --rounds 6``, ratio Switchyard / plain pika in the same run,
  three runs each, alternating, load average 4-20): sequential 1.05, 1.06, 0.95 without, 1.33,
  1.48, 1.26 with; 64 in flight 0.91, 1.00, 0.80 without, 1.31, 1.11, 1.05 with.
* ``buffered``: basic_publish, ack and reject on the underlying channel, without BlockingChannel's
  flush per message: about 10x cheaper per message in a batch publisher (the control plane's
  forwards, the worker's replies; measured when ``publish_buffered`` was written, not re-measured),
  and the only kind safe inside frame processing (a callback).
* ``confirms``: publisher confirms with an ack/nack callback; BlockingChannel's ``confirm_delivery``
  blocks each publish until its confirm, serialising the client's pipeline (64 in flight) and the
  control plane's batches. No public alternative: a function, not a speed-up.
* ``returns``: the client's mandatory returns handled as their frames arrive, before the ack that
  settles a send (BlockingChannel queues a return until ``process_data_events`` dispatches): a fix.
* ``liveness``, ``abandon``, ``frame_max``, ``close_reason``, ``headers``: no public API at all —
  a kept connection's last received data (half-open detection), dropping a socket without the close
  handshake a stuck channel never answers, the negotiated frame size, why a channel closed, and
  decoding the header tables pika's own decoder cannot read (``amqp_decode``). Correctness, not speed.
"""

from __future__ import annotations

from dataclasses import dataclass

PIKA_VERSION = "1.4.4"


@dataclass(frozen=True)
class Internal:
    """One private name: ``path`` from ``connection`` (a pika ``BlockingConnection``), ``channel`` (one
    of its ``BlockingChannel``) or a module; ``parameters`` a callable's, as ``name`` or
    ``name=default`` (None: not a callable); ``use`` one of the module docstring's uses."""

    path: str
    use: str
    parameters: str | None = None


_TRANSPORT = "connection._impl._transport"
INTERNALS: tuple[Internal, ...] = (
    Internal("connection._impl", "all"),
    Internal("connection._impl.params", "liveness"),
    Internal("connection._impl.params.heartbeat", "liveness"),
    Internal("connection._impl.params.frame_max", "frame_max"),
    Internal(f"{_TRANSPORT}._sock", "liveness"),
    Internal("pika.adapters.utils.io_services_utils._AsyncPlaintextTransport", "written"),
    Internal("pika.adapters.utils.io_services_utils._TRY_IO_AGAIN_SOCK_ERROR_CODES", "written"),
    Internal(f"{_TRANSPORT}._produce", "written", ""),
    Internal(f"{_TRANSPORT}._tx_buffers", "written"),
    Internal(f"{_TRANSPORT}.write", "written", "data"),
    Internal(f"{_TRANSPORT}._state", "written"),
    Internal(f"{_TRANSPORT}._STATE_ACTIVE", "written"),
    Internal(f"{_TRANSPORT}._buffer_tx_data", "written", "data"),
    Internal(f"{_TRANSPORT}._initiate_abort", "written", "error"),
    Internal(f"{_TRANSPORT}._nbio.set_writer", "written", "fd, on_writable"),
    Internal(f"{_TRANSPORT}._on_socket_writable", "written", ""),
    Internal(f"{_TRANSPORT}.get_write_buffer_size", "written", ""),
    Internal("connection._impl._terminate_stream", "abandon", "error"),
    Internal("connection._impl.ioloop.call_later", "passes", "delay, callback"),
    Internal("connection._impl.ioloop.remove_timeout", "passes", "timeout_handle"),
    Internal("connection._impl.ioloop.poll", "passes", ""),
    Internal("connection._impl.ioloop.process_timeouts", "passes", ""),
    Internal("connection._impl.is_closed", "passes"),
    Internal("connection._closed_result.ready", "passes"),
    Internal("connection._OnClosedArgs._fields", "passes"),  # holds "error": the lost connection's
    Internal("connection._cleanup", "passes", ""),
    Internal("connection._cleanup_mutex", "wake"),
    Internal("connection._impl.ioloop.add_callback_threadsafe", "wake", "callback"),
    Internal("channel._impl", "all"),
    Internal("channel._impl.basic_consume", "direct",
             "queue, on_message_callback, auto_ack=False, exclusive=False, consumer_tag=None, "
             "arguments=None, callback=None"),
    Internal("channel._impl.basic_cancel", "direct", "consumer_tag='', callback=None"),
    Internal("channel._impl.consumer_tags", "direct"),
    Internal("channel._impl.channel_number", "direct"),
    Internal("channel._impl.callbacks.remove", "direct", "prefix, key, callback_value=None, arguments=None"),
    Internal("channel._impl.add_on_cancel_callback", "direct", "callback"),
    Internal("channel._on_consumer_cancelled_by_broker", "direct", "method_frame"),
    Internal("channel._impl.basic_publish", "buffered",
             "exchange, routing_key, body, properties=None, mandatory=False"),
    Internal("channel._impl.basic_ack", "buffered", "delivery_tag=0, multiple=False"),
    Internal("channel._impl.basic_reject", "buffered", "delivery_tag=0, requeue=True"),
    Internal("channel._impl.confirm_delivery", "confirms", "ack_nack_callback, callback=None"),
    Internal("channel._impl.add_on_return_callback", "returns", "callback"),
    Internal("channel._impl.close", "returns", "reply_code=0, reply_text='Normal shutdown'"),
    Internal("channel._closing_reason", "close_reason"),
    Internal("pika.spec.props", "headers"),  # frame type 60 (basic) -> its properties class
    Internal("pika.spec.BasicProperties.decode", "headers", "encoded, offset=0"),
    Internal("pika.spec.BasicProperties.encode", "headers", ""),
)
