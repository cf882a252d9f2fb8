"""Switchyard's five parts by name, and the services each needs: defined once.

A user adopts one part at a time (a delay scheduler alone, an event bus alone): the stack deploys
the parts chosen (``switchyard:parts``, stacks/), ``./dev services --parts`` starts what they need
locally, and ``switchyard demo --parts`` shows only those. The service names are the ones
``switchyard.cli.preflight.require`` checks.
"""

from __future__ import annotations

RPC, DELAY, PENDING, BUS, SPARK = "rpc", "delay", "pending", "bus", "spark"
PARTS = (RPC, DELAY, PENDING, BUS, SPARK)

# The services a part talks to (AMQP with its management API, Redis, Postgres, Kafka).
SERVICES: dict[str, tuple[str, ...]] = {
    RPC: ("amqp", "management", "redis"),
    DELAY: ("postgres", "kafka"),
    PENDING: ("redis",),
    BUS: ("redis",),
    SPARK: ("amqp", "management", "redis", "postgres", "kafka"),  # its rows go through delay into rpc
}


def services_of(parts: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Every service the ``parts`` need, each once, in a stable order."""
    return tuple(dict.fromkeys(service for part in parts for service in SERVICES[part]))


def parse_parts(raw: str) -> tuple[str, ...]:
    """``rpc,bus`` as parts; ValueError naming the parts when one is unknown or none is given."""
    parts = tuple(dict.fromkeys(p.strip() for p in raw.split(",") if p.strip()))
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise ValueError(f"{', '.join(unknown) or 'no part'}: the parts are {', '.join(PARTS)}")
    return parts
