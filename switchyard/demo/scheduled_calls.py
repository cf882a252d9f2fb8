"""Scheduled calls' demo: calls made 2-5 s from now, through the delay scheduler and the relay into a
pool, answered into a durable reply queue at their time."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

from switchyard.demo.printer import Printer

DELAYS_S = (2.0, 3.0, 4.0, 5.0)
KEYS = ("tenant-a", "tenant-b")


def scheduled_calls_part(out: Printer) -> None:
    """A fresh pool (its control plane and workers running locally) and a fresh delay scheduler (with
    the scheduled-call relay); one call scheduled per delay, each printed when its answer arrives."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from switchyard.core.config import Connections
    from switchyard.core.redis_client import connect_redis
    from switchyard.delay.settings import DelaySettings
    from switchyard.delay.store import PostgresDelayStore
    from switchyard.local.delay_runtime import LocalRuntime
    from switchyard.local.rpc_runtime import LocalControlPlane
    from switchyard.rpc import protocol
    from switchyard.rpc.amqp import connect
    from switchyard.rpc.client import RpcClient
    from switchyard.rpc.client.schedule import CallScheduler, collect, declare_reply_queue
    from switchyard.rpc.control.topology import PoolTopology
    from switchyard.rpc.settings import ControlSettings, Delays, RpcSettings
    from switchyard.rpc.store import PoolState

    name = f"demo_sched_{uuid.uuid4().hex[:6]}"
    delay = DelaySettings(input_topic=f"{name}-in", output_topic=f"{name}-out", schema=name,
                          consumer_group=f"{name}-g", application_name=name)
    connections, settings = Connections.from_env(), RpcSettings.from_env()
    out.section(f"Scheduled calls: {len(DELAYS_S)} calls of pool {name} due {DELAYS_S[0]:g}-{DELAYS_S[-1]:g} "
                f"s from now, through the delay scheduler, answered into {protocol.reply_queue(name)}")
    admin = AdminClient({"bootstrap.servers": connections.kafka_bootstrap})
    for future in admin.create_topics([NewTopic(t, 2, 1) for t in (delay.input_topic,
                                                                   delay.output_topic)]).values():
        future.result(15)
    plane = LocalControlPlane(ControlSettings(name, Delays(unbind_s=30, stop_s=30), 0.5), settings).start()
    scheduler = LocalRuntime(delay, connections)
    declare_reply_queue(settings, name)
    try:
        scheduler.start()
        started = time.monotonic()
        with RpcClient(name, settings, timeout=30) as client:  # the groups started first: no cold start
            for key in KEYS:
                client.call(key, "warm-up")
        time.sleep(max(0.0, started + 3.0 - time.monotonic()))  # the bridges join their consumer groups
        calls = CallScheduler(name, settings, topic=delay.input_topic)
        start, due = time.time(), {}
        for n, seconds in enumerate(DELAYS_S):  # deadlines from one instant (the first confirm is slow)
            at = datetime.fromtimestamp(start + seconds, UTC)
            call_id = calls.schedule(KEYS[n % 2], f"report #{n}", at=at, reply=name).result(30)
            due[call_id] = start + seconds
        calls.close()
        out.line(f"scheduled at {datetime.now(UTC).strftime('%H:%M:%S')} UTC, due "
                 + ", ".join(f"+{s:g} s" for s in DELAYS_S))
        for call_id, deadline in sorted(due.items(), key=lambda item: item[1]):  # each on its own wait
            answer = collect(settings, name, [call_id], timeout=max(0.0, deadline - time.time()) + 30)
            if call_id not in answer:
                out.line(f"call {call_id} not answered in time")
                continue
            late = time.time() - deadline
            out.line(f"+{time.time() - start:4.1f} s  {answer[call_id].status} ({late * 1000:+.0f} ms from "
                     f"its deadline): {answer[call_id].text()}")
    finally:
        scheduler.join()
        plane.stop()
        with PoolTopology(name, settings) as topology:
            topology.delete(force=True)
        connection = connect(settings.connections.amqp_url, "switchyard-demo")
        connection.channel().queue_delete(protocol.reply_queue(name))
        connection.close()
        PoolState(connect_redis(settings.connections), name).clear()
        with PostgresDelayStore(connections.postgres_dsn, name) as dropping:
            dropping.drop_schema()
        admin.delete_topics([delay.input_topic, delay.output_topic])
