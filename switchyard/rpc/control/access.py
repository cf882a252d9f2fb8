"""Who may do what on the broker: one RabbitMQ user per role, made at deploy time.

On AWS the Amazon MQ admin user is the pools custom resource's alone: it declares the topology, puts
the policies and makes these users (``ensure_users``, through the management API), each with the
password of its own secret and permissions limited to what the role does (configure / write / read;
docs/deployment.md has the same as a table):

- orphans: declare request queues / bind them, publish to the request exchange and ``amq.default``
  (poison copies, negative answers) / the request exchange (a bind's source);
- dead-letters: nothing / ``amq.default`` (answers, poison copies) / nothing;
- activity: declare request queues / bind them / the request exchange;
- reconcile: delete request queues / unbind and bind / the request queues (the leaderless-queue
  probe consumes one: refused, it would read as silence and delete the queue) and the request exchange
  (a bind's source); tag ``management``
  (queue lists and depths);
- mappings (the event source mappings' pollers): nothing / nothing / the orphan, dl, activity queues;
- workers (users' code): nothing / ``amq.default`` (replies, sheds) and the activity exchange /
  the request queues;
- clients: the exclusive ``amq.gen-*`` reply queues and the durable ``switchyard-reply-*`` ones /
  every pool's request exchange / those reply queues. A per-application clients user
  (``BrokerUser(CLIENTS, application=app)``) has only ``switchyard-reply-app.*`` of the durable ones;
- scheduled (the scheduled-call relay, functions/rpc_scheduled.py): nothing / every pool's request
  exchange and ``amq.default`` (poison copies, expired answers) / nothing (it checks a pool by a
  passive declare, which needs no permission);
- probe (the reconciler's dead-lettering probe): the probe's queues, in the probe's own vhost
  (``protocol.DEAD_LETTER_PROBE_VHOST``) and nowhere else / nothing / nothing; tag ``policymaker``.

Every role but ``clients``, ``scheduled`` and ``probe`` is per pool. No run-time role may configure
an exchange (the request queues' pattern leaves the request exchange out). ``policymaker`` is not
limited by the permission patterns: it puts policies on any queue of each vhost its user may use
(measured: pool A's reconcile user put ``max-length: 0`` on pool B's request queues). So only the
probe's user holds it, and that user may use only the probe's vhost, where nothing else lives.
RabbitMQ checks what it checks (its access-control guide): a passive declare needs nothing,
``queue.bind`` needs write on the queue and read on the exchange, a publish needs write on the
exchange (``amq.default`` for the default one, whatever the routing key: a role that answers through
it can address any queue by name, so the replying processes check ``reply_to``: ``protocol.replyable``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from switchyard.core.errors import ConfigError
from switchyard.rpc import protocol

if TYPE_CHECKING:  # the worker imports this module for its user names only, not the API client
    from switchyard.rpc.control.management import ManagementApi

USERNAME_PREFIX = "switchyard-"
POLICYMAKER = "policymaker"
MANAGEMENT = "management"  # the management API, read-only beyond the user's permissions


class BrokerRole(StrEnum):
    ORPHANS = "orphans"  # the orphan handler (Lambda)
    DEAD_LETTERS = "dead-letters"  # the dead-letter responder (Lambda)
    ACTIVITY = "activity"  # the activity tracker (Lambda)
    RECONCILE = "reconcile"  # the pool reconciler (Lambda on a schedule)
    MAPPINGS = "mappings"  # the Amazon MQ event source mappings' pollers
    WORKERS = "workers"  # the ECS workers: users' handler code
    CLIENTS = "clients"  # callers of every pool (the EMR job)
    SCHEDULED = "scheduled"  # the scheduled-call relay (Lambda on the delay scheduler's output topic)
    PROBE = "probe"  # the reconciler's dead-lettering probe, in its own vhost


DEPLOYMENT_WIDE = frozenset({BrokerRole.CLIENTS, BrokerRole.SCHEDULED, BrokerRole.PROBE})  # every pool


@dataclass(frozen=True)
class Permissions:
    """A user's configure/write/read patterns in the vhost, and its management tags."""

    configure: str = protocol.NOTHING_PATTERN
    write: str = protocol.NOTHING_PATTERN
    read: str = protocol.NOTHING_PATTERN
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class BrokerUser:
    """One role's user: per pool, except the ``DEPLOYMENT_WIDE`` roles'."""

    role: BrokerRole
    pool: str | None = None
    application: str | None = None  # a clients user of one application's reply queues only

    def __post_init__(self) -> None:
        if (self.role in DEPLOYMENT_WIDE) != (self.pool is None):
            raise ConfigError(f"broker role {self.role} is {'not ' if self.pool is None else ''}per pool")
        if self.pool is not None:
            protocol.validate_pool(self.pool)
        if self.application is not None:
            if self.role is not BrokerRole.CLIENTS:
                raise ConfigError(f"broker role {self.role} has no per-application users; only clients has")
            protocol.validate_application(self.application)

    @property
    def username(self) -> str:
        """The name a deployment gives this user (its secret's ``username``)."""
        if self.application is not None:
            return f"{USERNAME_PREFIX}{self.role}-{self.application}"
        return USERNAME_PREFIX + (self.role if self.pool is None else f"{self.pool}-{self.role}")

    def permissions(self, pools: Sequence[str]) -> Permissions:
        """What this user may do when the deployment has ``pools`` (the probe's: in its own vhost)."""
        exchanges = map(protocol.req_exchange, pools)
        if self.role is BrokerRole.SCHEDULED:
            return Permissions(write=protocol.names_pattern(*exchanges, protocol.DEFAULT_EXCHANGE_RESOURCE))
        if self.role is BrokerRole.PROBE:
            return Permissions(configure=protocol.DEAD_LETTER_PROBE_PATTERN, tags=(POLICYMAKER,))
        if self.pool is None:
            replies = protocol.any_of(protocol.server_named_queues_pattern(),
                                      protocol.reply_queues_pattern(self.application))
            return Permissions(configure=replies, write=protocol.names_pattern(*exchanges), read=replies)
        return _pool_permissions(self.role, self.pool)


def _pool_permissions(role: BrokerRole, pool: str) -> Permissions:
    requests, exchange = (protocol.request_queues_pattern(pool),
                          protocol.names_pattern(protocol.req_exchange(pool)))
    binds = Permissions(configure=requests, write=requests, read=exchange)  # declare and bind queues
    return {
        BrokerRole.ORPHANS: Permissions(
            configure=requests, read=exchange,
            write=protocol.any_of(requests, protocol.names_pattern(protocol.req_exchange(pool),
                                                                   protocol.DEFAULT_EXCHANGE_RESOURCE))),
        BrokerRole.DEAD_LETTERS: Permissions(
            write=protocol.names_pattern(protocol.DEFAULT_EXCHANGE_RESOURCE)),
        BrokerRole.ACTIVITY: binds,
        BrokerRole.RECONCILE: Permissions(configure=requests, write=requests,
                                          read=protocol.any_of(requests, exchange), tags=(MANAGEMENT,)),
        BrokerRole.MAPPINGS: Permissions(
            read=protocol.names_pattern(protocol.orphan_queue(pool), protocol.dl_queue(pool),
                                        protocol.activity_queue(pool))),
        BrokerRole.WORKERS: Permissions(
            write=protocol.names_pattern(protocol.DEFAULT_EXCHANGE_RESOURCE,
                                         protocol.activity_exchange(pool)),
            read=requests),
    }[role]


def deployment_users(pools: Iterable[str], applications: Iterable[str] = ()) -> list[BrokerUser]:
    """Every user a deployment with ``pools`` has: the per-pool roles of each pool, the
    deployment-wide ones (clients, the scheduled-call relay, the probe) and a clients user per
    application named."""
    per_pool = [role for role in BrokerRole if role not in DEPLOYMENT_WIDE]
    return [*(BrokerUser(role, pool) for pool in pools for role in per_pool),
            *(BrokerUser(role) for role in BrokerRole if role in DEPLOYMENT_WIDE),
            *(BrokerUser(BrokerRole.CLIENTS, application=name) for name in applications)]


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    @classmethod
    def from_secret(cls, values: Mapping[str, Any], where: str) -> Credentials:
        username, password = values.get("username"), values.get("password")
        if not (isinstance(username, str) and username and isinstance(password, str) and password):
            raise ConfigError(f"{where} must hold a non-empty username and password")
        return cls(username, password)


def ensure_users(management: ManagementApi, pools: Sequence[str],
                 users: Iterable[tuple[BrokerUser, Credentials]], admin: str,
                 probe: ManagementApi | None = None) -> list[str]:
    """Create or update each user: its password, tags and permissions in the vhost (idempotent: PUT
    whole); the probe's user's in the vhost of ``probe`` (created here), never in the deployment's.
    ``admin`` (the connection's own user) is refused, so a wrong secret cannot demote it."""
    done = []
    for user, credentials in users:
        where = management
        if user.role is BrokerRole.PROBE:
            if probe is None:
                raise ConfigError("the probe user needs the probe's vhost: pass its management API")
            probe.put_vhost()
            where = probe
        if credentials.username == admin:
            raise ConfigError(f"the {user.role} user cannot be the broker admin {admin!r}")
        if user.pool is not None and user.pool not in pools:
            raise ConfigError(f"the {user.role} user of pool {user.pool!r} names a pool not deployed")
        granted = user.permissions(pools)
        management.put_user(credentials.username, credentials.password, granted.tags)
        where.put_permissions(credentials.username, granted.configure, granted.write, granted.read)
        done.append(credentials.username)
    return done
