"""The keyed-RPC wire protocol (the keyed RPC design): names, headers, statuses, events. Defined once here.

Names
-----
A pool owns ``{pool}-req-xchg`` (direct, alternate exchange ``{pool}-orphan-xchg``),
``{pool}-orphan-xchg`` / ``{pool}-orphan``, ``{pool}-dl-xchg`` / ``{pool}-dl``,
``{pool}-activity-xchg`` / ``{pool}-activity`` and ``{pool}-poison``. Pool names are
``[A-Za-z0-9_]{1,64}``: no ``-``, so one pool's names can never fall under another pool's
patterns, and no regex metacharacters, so policy patterns need no escaping.

Keys
----
A key is any UTF-8 string (empty included). It is carried two ways:

* routing key: the raw key, when it fits AMQP's 255-byte short string and does not start with
  ``~sha256:``; otherwise ``~sha256:`` + the hex SHA-256 of the key. Both branches are
  injective and cannot meet.
* header ``x-switchyard-key``: the raw key, set by Switchyard's client and worker. Optional:
  the keyed RPC design's clients and workers send the key as routing key only.
* ``x-death`` routing keys: Lambda's Amazon MQ events carry no routing key, so the orphan and
  activity exchanges feed *staging* queues (``{pool}-orphan-staging``, ``{pool}-activity-staging``)
  whose messages expire at once (TTL 0) and are dead-lettered, through the default exchange, into
  ``{pool}-orphan`` and ``{pool}-activity``. Dead-lettering writes the original routing key into
  ``x-death``, where the handlers read it when the header is absent. It also moves a message's own
  ``expiration`` into ``x-death`` (``original-expiration``): the orphan handler restores what is
  left of it when it forwards the request.
* queue argument ``x-switchyard-key``: the raw key, so a lost pool state can be rebuilt from
  the broker's queue list even when the queue name is hashed.
* queue name ``{pool}-req-{encoded}``: the key percent-encoded byte by byte, keeping only
  ``A-Z a-z 0-9 _ . - = , :`` (``%`` itself is always escaped, so decoding is unambiguous);
  when the whole name would pass RabbitMQ's 255-byte limit, a readable prefix of the encoding
  followed by ``~`` and the full hex SHA-256 of the key. ``~`` never appears in an encoding, so
  the two forms cannot collide either.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any
from urllib.parse import unquote

from switchyard.core.errors import InvalidNameError

MAX_NAME_BYTES = 255

# AMQP reply codes the client, the worker and the control plane act on.
NOT_FOUND = 404  # a passive declare or consume of a queue or exchange that does not exist
PRECONDITION_FAILED = 406  # a queue redeclared with other arguments
INTERNAL_ERROR = 541  # what a broker whose dead-letter supervisor stopped answers a declare
# The one limit of a pool name, locally and in a deployment (stacks/config.py checks it too): the
# broker's names take it (255 bytes with the longest suffix and a key) and the AWS names built from
# it are cut to fit their own limits (stacks/names.py: physical_name; CDK-generated function names).
MAX_POOL_NAME_CHARS = 64
POOL_NAME_RE = re.compile(rf"^[A-Za-z0-9_]{{1,{MAX_POOL_NAME_CHARS}}}$")

# Headers
STATUS_HEADER = "x-status"
EVENT_HEADER = "x-event"
WORKER_ID_HEADER = "x-worker-id"
KEY_HEADER = "x-switchyard-key"
KEY_QUEUE_ARGUMENT = "x-switchyard-key"
FIRST_DEATH_REASON_HEADER = "x-first-death-reason"
FIRST_DEATH_QUEUE_HEADER = "x-first-death-queue"
POISON_REASON_HEADER = "x-switchyard-poison-reason"  # why a message is in {pool}-poison
# Set by Switchyard's decoder (rpc/amqp_decode.py) in place of a headers table it could not decode
# (the reason); every consumer sends such a message to {pool}-poison. The deepest nesting of tables
# and arrays it decodes (x-death, the deepest the broker writes, is 3).
UNDECODABLE_HEADER = "x-switchyard-undecodable"
MAX_HEADER_DEPTH = 64
# On a ``request-received`` activity report: the requests the worker answered since its previous
# report, as "count p50 p99 max" (milliseconds from delivery to the worker to its reply, nearest-rank
# over at most the last 4,096). Optional: the keyed RPC design's workers send no such header.
LATENCY_HEADER = "x-switchyard-latency"
QUEUE_TYPE_ARGUMENT = "x-queue-type"
# Where a new quorum queue's members and leader go (3.10+ and 4.x accept both). The broker's default
# places the leader on the node of the declaring connection, so one topology connection put every
# queue's leader on one node of a cluster; ``balanced`` picks the node leading the fewest. Both are
# fixed when the queue is created: a queue declared without them refuses a declare with them
# (PRECONDITION_FAILED, "inequivalent arg"), so they are creation-only (control/topology.py).
LEADER_LOCATOR_ARGUMENT = "x-queue-leader-locator"
BALANCED = "balanced"
CLIENT_LOCAL = "client-local"
INITIAL_GROUP_SIZE_ARGUMENT = "x-quorum-initial-group-size"
DELIVERY_COUNT_HEADER = "x-delivery-count"
DEATH_HEADER = "x-death"
# A request a worker shed (``Requeue``) is republished, not rejected, so shedding never counts
# against the delivery limit; these carry what the broker's own count and TTL clock would lose.
DEADLINE_HEADER = "x-switchyard-deadline-ms"  # epoch ms at which the request's expiration runs out
REDELIVERIES_HEADER = "x-switchyard-redeliveries"  # deliveries before its last republish
# What the broker wrote on a message's way to the orphan queue (dead-lettering: x-death, 3.10's
# x-first-death-*, 3.13+'s x-last-death-*; quorum delivery: x-delivery-count): the orphan handler
# strips it, so a forwarded request's later deaths and deliveries read as its own.
BROKER_BOOKKEEPING_PREFIXES = ("x-death", "x-first-death-", "x-last-death-", DELIVERY_COUNT_HEADER)
# Where the orphan handler keeps a request's ``user_id`` property: the broker checks that property
# against the publishing connection's user, so a republished ``user_id`` of another user is refused.
ORIGINAL_USER_ID_HEADER = "x-switchyard-user-id"
STAGING_SUFFIX = "-staging"
REQUEST_EXCHANGE_SUFFIX = "xchg"  # ``{pool}-req-xchg``, under the request queues' prefix
# A scheduled call (switchyard/rpc/scheduling.py builds and reads them): the Kafka headers its record
# carries through the delay scheduler beside ``x-switchyard-key``: the pool, the call's id (the
# scheduler strips its own chronosMessageId; the id becomes the AMQP message and correlation id, so
# workers can deduplicate and answers are found by it) and, when the caller named one, the durable
# reply queue its answer goes to. An expiration travels as ``DEADLINE_HEADER`` (epoch ms).
POOL_HEADER = "x-switchyard-pool"
ID_HEADER = "x-switchyard-id"
REPLY_QUEUE_HEADER = "x-switchyard-reply-queue"
# Durable reply queues: ``switchyard-reply-{name}``, named by the caller, kept across restarts.
REPLY_QUEUE_PREFIX = "switchyard-reply-"
REPLY_NAME_RE = re.compile(r"^[A-Za-z0-9_.]{1,128}$")
# An application's own durable reply queues, ``switchyard-reply-{application}.{name}``: the part its
# per-application clients user may declare, read and delete (switchyard/rpc/control/access.py).
APPLICATION_RE = re.compile(r"^[A-Za-z0-9_]{1,64}$")
DIRECT_REPLY_TO = "amq.rabbitmq.reply-to"  # RabbitMQ's direct reply-to: routed to the caller's channel

# Dead-letter strategies of quorum queues (policy key ``dead-letter-strategy``). At-least-once keeps
# a dead letter until its target confirms it, through a per-queue worker under one node-wide
# supervisor that RabbitMQ's #16652 can stop for good: Switchyard uses it only where the dead letter
# is a request in transit (the orphan staging hop), see switchyard/rpc/control/dead_lettering.py.
AT_LEAST_ONCE = "at-least-once"
AT_MOST_ONCE = "at-most-once"
DEAD_LETTER_STRATEGY = "dead-letter-strategy"
# The broker-wide probe of at-least-once dead-lettering: its policy and its short-lived queues.
DEAD_LETTER_PROBE_POLICY = "switchyard-dead-letter-probe"
DEAD_LETTER_PROBE_PREFIX = "switchyard-dead-letter-probe-"
# The vhost the probe runs in on AWS: policies are per vhost, and the ``policymaker`` tag lets its user
# put them on any queue of each vhost it may use, so the probe's user may use this one only (the
# dead-letter supervisor it probes is the node's, the same for every vhost).
DEAD_LETTER_PROBE_VHOST = "switchyard-dead-letter-probe"
RETIRE_POLICY_PREFIX = "switchyard-retire-"

HASHED_ROUTING_PREFIX = "~sha256:"
# The longest key a request may carry. The raw key travels in a header (the content header frame
# must fit the broker's frame_max), in a queue argument and in the worker's environment (ECS
# RunTask overrides hold 8 KiB in all): 4 KiB leaves room for the rest.
MAX_KEY_BYTES = 4096
_SAFE_KEY_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-=,:")


class Status(StrEnum):
    """Values of the ``x-status`` response header."""

    OK = "ok"  # the worker answered
    ERROR = "error"  # the worker's handler failed: a negative response (the slotted client design)
    EXPIRED = "expired"  # dead-lettered: the request's TTL ran out before a worker answered
    DELIVERY_LIMIT = "delivery_limit"  # dead-lettered: delivered too many times (poison)
    REJECTED = "rejected"  # dead-lettered: rejected without requeue
    MAXLEN = "maxlen"  # dead-lettered: the queue was full


class Event(StrEnum):
    """Values of the ``x-event`` header on worker activity reports."""

    STARTED = "started"
    REQUEST_RECEIVED = "request-received"


class QueueType(StrEnum):
    QUORUM = "quorum"
    CLASSIC = "classic"


def validate_pool(pool: str) -> str:
    if not isinstance(pool, str) or not POOL_NAME_RE.match(pool):
        raise InvalidNameError(
            f"invalid pool name {pool!r}: use 1 to {MAX_POOL_NAME_CHARS} characters from A-Z, a-z, 0-9 and _"
        )
    return pool


def _key_bytes(key: str) -> bytes:
    if not isinstance(key, str):
        raise InvalidNameError(f"a key must be a string, got {type(key).__name__}")
    try:
        return key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidNameError(f"key {key!r} is not valid UTF-8") from exc


def reply_queue(name: str) -> str:
    """The durable reply queue ``name`` stands for: ``switchyard-reply-{name}``; ``name`` is
    ``[A-Za-z0-9_.]{1,128}`` (no pattern or path characters: it goes into permissions and URLs)."""
    if not isinstance(name, str) or not REPLY_NAME_RE.match(name):
        raise InvalidNameError(f"invalid reply queue name {name!r}: use 1 to 128 characters from "
                               "A-Z, a-z, 0-9, _ and .")
    return REPLY_QUEUE_PREFIX + name


def reply_queues_pattern(application: str | None = None) -> str:
    """Every durable reply queue, or ``application``'s own (the clients' permissions)."""
    if application is None:
        return f"^{re.escape(REPLY_QUEUE_PREFIX)}"
    return f"^{re.escape(REPLY_QUEUE_PREFIX + validate_application(application))}\\."


def validate_application(application: str) -> str:
    if not isinstance(application, str) or not APPLICATION_RE.match(application):
        raise InvalidNameError(f"invalid application name {application!r}: use 1 to 64 characters from "
                               "A-Z, a-z, 0-9 and _")
    return application


def replyable(reply_to: str | None) -> bool:
    """Whether a request's ``reply_to`` may receive its answer: RabbitMQ's direct reply-to, a
    server-named exclusive queue (``amq.gen-*``) or a durable reply queue (``switchyard-reply-*``).

    Why: the replying process (a worker, the dead-letter responder) publishes through the default
    exchange, which reaches any queue by name whatever the publisher's permissions say; without this
    check a caller could have it write into a queue the caller may not write itself (another pool's
    request queue). The replying process calls it; an answer it refuses is not sent.
    """
    if not reply_to:
        return False
    return (reply_to == DIRECT_REPLY_TO or reply_to.startswith(DIRECT_REPLY_TO + ".")
            or reply_to.startswith((SERVER_NAMED_QUEUE_PREFIX, REPLY_QUEUE_PREFIX)))


def validate_key(key: str) -> str:
    """A key every part of the protocol can carry: UTF-8, no NUL, at most ``MAX_KEY_BYTES``.

    NUL cannot pass through a worker's environment (WORKER_KEY), so such a key could never be served.
    """
    raw = _key_bytes(key)
    if "\x00" in key:
        raise InvalidNameError(f"key {key[:80]!r} contains NUL, which no worker's environment can carry")
    if len(raw) > MAX_KEY_BYTES:
        raise InvalidNameError(f"key of {len(raw)} bytes is longer than the {MAX_KEY_BYTES} bytes "
                               "the protocol carries (header, queue argument, worker environment)")
    return key


def key_digest(key: str) -> str:
    return hashlib.sha256(_key_bytes(key)).hexdigest()


def routing_key(key: str) -> str:
    """The AMQP routing key that carries ``key`` (see the module docstring)."""
    raw = _key_bytes(key)
    if len(raw) <= MAX_NAME_BYTES and not key.startswith(HASHED_ROUTING_PREFIX):
        return key
    return HASHED_ROUTING_PREFIX + hashlib.sha256(raw).hexdigest()


def encode_key(key: str) -> str:
    """Percent-encode a key for use inside a queue name (injective)."""
    return "".join(chr(b) if b in _SAFE_KEY_CHARS else f"%{b:02X}" for b in _key_bytes(key))


def request_queue_prefix(pool: str) -> str:
    return f"{validate_pool(pool)}-req-"


def request_queue(pool: str, key: str) -> str:
    """``{pool}-req-{key}``, encoded to stay a valid, unique queue name under 255 bytes. The key
    ``xchg`` is ``%78chg``: the queue's name is never the request exchange's, so permissions can
    grant the queues without the exchange."""
    prefix = request_queue_prefix(pool)
    encoded = encode_key(key)
    if encoded == REQUEST_EXCHANGE_SUFFIX:
        encoded = f"%{ord(encoded[0]):02X}{encoded[1:]}"
    if len(prefix) + len(encoded) <= MAX_NAME_BYTES:
        return prefix + encoded
    room = MAX_NAME_BYTES - len(prefix) - 1 - 64
    head = encoded[:room]
    cut = head.rfind("%")
    if cut != -1 and cut > len(head) - 3:  # never split a %XX escape
        head = head[:cut]
    return f"{prefix}{head}~{key_digest(key)}"


def key_from_request_queue(pool: str, name: str, arguments: Mapping[str, Any] | None = None) -> str | None:
    """The raw key of one of the pool's request queues: its ``x-switchyard-key`` argument, else its
    decoded name. None for a name Switchyard would not have made (another application's queue, an
    undecodable or hashed name): callers skip it, they never fail on it."""
    prefix = request_queue_prefix(pool)
    key = (arguments or {}).get(KEY_QUEUE_ARGUMENT)
    if not isinstance(key, str):
        if not name.startswith(prefix) or "~" in name:
            return None  # a hashed name is readable only through its argument
        try:
            key = unquote(name[len(prefix):], errors="strict")
        except UnicodeDecodeError:
            return None
    try:
        return key if request_queue(pool, key) == name else None
    except InvalidNameError:
        return None


def req_exchange(pool: str) -> str:
    return request_queue_prefix(pool) + REQUEST_EXCHANGE_SUFFIX


def orphan_exchange(pool: str) -> str:
    return f"{validate_pool(pool)}-orphan-xchg"


def orphan_queue(pool: str) -> str:
    return f"{validate_pool(pool)}-orphan"


def dl_exchange(pool: str) -> str:
    return f"{validate_pool(pool)}-dl-xchg"


def dl_queue(pool: str) -> str:
    return f"{validate_pool(pool)}-dl"


def activity_exchange(pool: str) -> str:
    return f"{validate_pool(pool)}-activity-xchg"


def activity_queue(pool: str) -> str:
    return f"{validate_pool(pool)}-activity"


def orphan_staging_queue(pool: str) -> str:
    """Bound to ``{pool}-orphan-xchg``; dead-letters every message at once into ``{pool}-orphan``."""
    return orphan_queue(pool) + STAGING_SUFFIX


def activity_staging_queue(pool: str) -> str:
    """Bound to ``{pool}-activity-xchg``; dead-letters every report at once into ``{pool}-activity``."""
    return activity_queue(pool) + STAGING_SUFFIX


def staging_policy_name(pool: str, target_queue: str) -> str:
    return f"switchyard-{validate_pool(pool)}-{target_queue[len(pool) + 1:]}-staging"


def staging_policy_pattern(target_queue: str) -> str:
    return f"^{target_queue}{STAGING_SUFFIX}$"


def pool_queue_names(pool: str) -> tuple[str, ...]:
    """Every fixed-name queue a pool owns (request queues aside)."""
    return (orphan_staging_queue(pool), orphan_queue(pool), dl_queue(pool),
            activity_staging_queue(pool), activity_queue(pool), poison_queue(pool))


def key_from_routing_key(routing: str) -> str | None:
    """The key a routing key carries, or None for a hashed one (its key cannot be recovered)."""
    return None if routing.startswith(HASHED_ROUTING_PREFIX) else routing


def poison_queue(pool: str) -> str:
    return f"{validate_pool(pool)}-poison"


def request_policy_name(pool: str) -> str:
    return f"switchyard-{validate_pool(pool)}-requests"


def pool_queues_policy_name(pool: str) -> str:
    return f"switchyard-{validate_pool(pool)}-pool-queues"


def request_policy_pattern(pool: str) -> str:
    """Matches exactly the pool's request queues (pool names hold no regex metacharacters)."""
    return f"^{request_queue_prefix(pool)}"


def orphan_policy_name(pool: str) -> str:
    return f"switchyard-{validate_pool(pool)}-orphans"


def orphan_policy_pattern(pool: str) -> str:
    return f"^{orphan_queue(pool)}$"


def retire_policy_name(queue: str) -> str:
    """The policy that turns one queue's dead-lettering to at-most-once before it is deleted."""
    return RETIRE_POLICY_PREFIX + hashlib.sha256(queue.encode("utf-8")).hexdigest()[:32]


def exact_queue_pattern(queue: str) -> str:
    """A policy pattern matching ``queue`` alone (queue names may hold ``.``, so it is escaped)."""
    return f"^{re.escape(queue)}$"


def pool_queues_policy_pattern(pool: str) -> str:
    """Matches exactly the pool's dead-letter, activity and poison queues."""
    return f"^{validate_pool(pool)}-(dl|activity|poison)$"


# Permission patterns. RabbitMQ grants a user configure, write and read on the resources (queues and
# exchanges alike) whose names match that user's regular expressions, unanchored unless anchored: each
# pattern here is anchored. switchyard/rpc/control/access.py builds every user's permissions from these.
DEFAULT_EXCHANGE_RESOURCE = "amq.default"  # the default exchange's name in permission checks
SERVER_NAMED_QUEUE_PREFIX = "amq.gen-"  # exclusive reply queues; only the broker makes amq.* names
DEAD_LETTER_PROBE_PATTERN = f"^{re.escape(DEAD_LETTER_PROBE_PREFIX)}"
NOTHING_PATTERN = "^$"  # RabbitMQ's "no resource" (no queue or exchange has an empty name)


def names_pattern(*names: str) -> str:
    """A pattern matching exactly ``names``."""
    if not names:
        return NOTHING_PATTERN
    return "^(" + "|".join(re.escape(name) for name in names) + ")$"


def any_of(*patterns: str) -> str:
    """A pattern matching what any of ``patterns`` matches."""
    patterns = tuple(dict.fromkeys(p for p in patterns if p != NOTHING_PATTERN))
    return "|".join(f"(?:{p})" for p in patterns) if patterns else NOTHING_PATTERN


def request_queues_pattern(pool: str) -> str:
    """The pool's request queues and not its request exchange (same prefix; no queue has its name:
    ``request_queue``), so a role that declares or deletes queues cannot delete the exchange."""
    return f"{request_policy_pattern(pool)}(?!{REQUEST_EXCHANGE_SUFFIX}$)"


def server_named_queues_pattern() -> str:
    return f"^{re.escape(SERVER_NAMED_QUEUE_PREFIX)}"


def body_bytes(value: object, refusal: str) -> bytes:
    """A message body from what an application hands over (a handler's result, a row's column):
    None is empty, ``str`` is UTF-8, bytes-likes are copied; anything else raises ``TypeError``
    with ``refusal`` (the caller's words) and the type's name."""
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"{refusal}, not {type(value).__name__}")
