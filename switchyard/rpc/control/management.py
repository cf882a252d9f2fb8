"""Adapter for the RabbitMQ management HTTP API: policies and queue inventory.

Amazon MQ sends no per-queue metrics to CloudWatch on 4.x, and quorum queues refuse
``if-empty`` deletes, so queue depth and existence are read here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import requests

from switchyard.core.config import service_urls
from switchyard.core.observability import logger
from switchyard.core.settings import MANAGEMENT_URL
from switchyard.rpc.errors import BrokerUnavailableError, ManagementApiError

PAGE_SIZE = 500  # the management API refuses larger pages
# Listing a whole vhost takes the broker about 1 ms per queue when it is busy: 10,000 queues need
# more than the 10 s that any other request is given, and less than the reconciler's Lambda timeout
# (60 s) must be left for the rest of its pass.
LISTING_TIMEOUT_S = 30.0


# A node that is down on another host drops the connect silently: it is given this long, then the
# next URL is tried. A node that accepted but does not answer has the request's own timeout.
CONNECT_TIMEOUT_S = 3.0
# A load balancer (or a node still booting) in front of a node that cannot serve: try the next URL.
FAILOVER_STATUSES = frozenset({502, 503, 504})


def vhost_from_amqp_url(amqp_url: str) -> str:
    """The vhost of an AMQP URL, or of the first of a comma-separated list (every node serves the same)."""
    path = urlsplit((service_urls(amqp_url) or [amqp_url])[0]).path
    return unquote(path[1:]) if len(path) > 1 else "/"


@dataclass(frozen=True)
class _Node:
    base: str  # scheme://host:port/.../api, no credentials (it is printed)
    auth: tuple[str, str]


def _node(url: str) -> _Node:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ManagementApiError(f"management URL must be http(s)://user:pass@host:port, got {parts.scheme}://"
                                 f"{parts.hostname or ''}")
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    return _Node(f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}/api",
                 (unquote(parts.username or "guest"), unquote(parts.password or "guest")))


class ManagementApi:
    """A thin, typed client for the few management endpoints Switchyard needs.

    ``url`` may list several nodes' URLs, comma-separated (a cluster without a load balancer in
    front): a request goes to the node that answered last, and on to the next when that one cannot
    be reached (``CONNECT_TIMEOUT_S`` to connect, ``timeout`` to answer) or answers 502-504.
    """

    def __init__(self, url: str, vhost: str = "/", timeout: float = 10.0) -> None:
        self._nodes = [_node(one) for one in service_urls(url) or [url]]
        self._current = 0
        self._vhost = quote(vhost, safe="")
        self._timeout = timeout
        self._listing_timeout = max(timeout, LISTING_TIMEOUT_S)
        self._session = requests.Session()
        self._session.headers["content-type"] = "application/json"

    def _request(self, method: str, path: str, timeout: float | None = None,
                 **kwargs: Any) -> requests.Response:
        failures: list[str] = []
        for step in range(len(self._nodes)):
            index = (self._current + step) % len(self._nodes)
            node = self._nodes[index]
            try:
                response = self._session.request(
                    method, node.base + path, auth=node.auth,
                    timeout=(min(CONNECT_TIMEOUT_S, timeout or self._timeout), timeout or self._timeout),
                    **kwargs)
            except requests.RequestException as exc:
                failures.append(f"{node.base}: {exc}")
                continue
            if response.status_code in FAILOVER_STATUSES and step < len(self._nodes) - 1:
                failures.append(f"{node.base}: {response.status_code}")
                continue
            if index != self._current:
                logger.warning("management API failed over", extra={"to": node.base, "failed": failures})
                self._current = index
            if response.status_code >= 400 and response.status_code != 404:
                raise ManagementApiError(
                    f"{method} {path} answered {response.status_code}: {response.text[:300]}",
                    response.status_code, response.text,
                )
            return response
        raise BrokerUnavailableError(
            f"RabbitMQ management API unreachable at {'; '.join(failures)}. "
            "Is the rabbitmq_management plugin enabled (rabbitmq-plugins enable rabbitmq_management), "
            f"and does {MANAGEMENT_URL.name} point at it?"
        )

    def put_policy(
        self, name: str, pattern: str, definition: dict[str, Any], priority: int, apply_to: str = "queues"
    ) -> None:
        body = {"pattern": pattern, "definition": definition, "priority": priority, "apply-to": apply_to}
        self._request("PUT", f"/policies/{self._vhost}/{quote(name, safe='')}", json=body)

    def get_policy(self, name: str) -> dict[str, Any] | None:
        return self._get_or_none(f"/policies/{self._vhost}/{quote(name, safe='')}")

    def get_queue(self, name: str) -> dict[str, Any] | None:
        return self._get_or_none(f"/queues/{self._vhost}/{quote(name, safe='')}")

    def declare_queue(self, name: str, arguments: dict[str, Any], node: str | None = None) -> None:
        """Declare a durable queue on ``node`` (None: the node that answers): the broker runs the
        declare there, so a quorum queue led by the declaring node starts on it (an AMQP declare
        runs on the node the connection reached, which a load balancer in front of a cluster picks)."""
        body: dict[str, Any] = {"durable": True, "auto_delete": False, "arguments": arguments}
        if node is not None:
            body["node"] = node
        self._request("PUT", f"/queues/{self._vhost}/{quote(name, safe='')}", json=body)

    def get_exchange(self, name: str) -> dict[str, Any] | None:
        return self._get_or_none(f"/exchanges/{self._vhost}/{quote(name, safe='')}")

    def list_queues(
        self, name_regex: str, columns: str = "name,messages,consumers,type,policy",
        page_size: int = PAGE_SIZE,
    ) -> list[dict[str, Any]]:
        """All queues whose name matches ``name_regex``.

        One page (of up to 500, the API's largest) when that is all there is; otherwise one
        unpaginated listing of the vhost, filtered here. Every request, paged or not, makes the
        broker list and filter every queue of the vhost, so following the pages cost N/500 such
        listings: 20 at 10,000 queues, each over 10 s on a loaded 2-core broker (docs/benchmarks.md).
        """
        params = {"page": 1, "page_size": page_size, "name": name_regex, "use_regex": "true",
                  "columns": columns}
        data = self._request("GET", f"/queues/{self._vhost}", params=params).json()
        if data.get("page_count", 1) <= 1:
            return list(data.get("items", []))
        wanted = columns if "name" in columns.split(",") else f"name,{columns}"
        listing = self._request("GET", f"/queues/{self._vhost}", params={"columns": wanted},
                                timeout=self._listing_timeout).json()
        pattern = re.compile(name_regex)
        return [queue for queue in listing if pattern.search(queue.get("name", ""))]

    def list_consumers(self) -> list[dict[str, Any]]:
        """Every consumer of the vhost: its queue and its channel's connection (the console's worker ids)."""
        return list(self._request("GET", f"/consumers/{self._vhost}").json())

    def connection_names(self) -> dict[str, str]:
        """The vhost's connections: the broker's name of each -> the name its client gave (else the
        broker's)."""
        listing = self._request("GET", f"/vhosts/{self._vhost}/connections",
                                params={"columns": "name,client_properties.connection_name"}).json()
        return {c["name"]: str((c.get("client_properties") or {}).get("connection_name") or c["name"])
                for c in listing if "name" in c}

    def put_user(self, name: str, password: str, tags: tuple[str, ...] = ()) -> None:
        """Create or update a user (password and tags replaced)."""
        body = {"password": password, "tags": ",".join(tags)}
        self._request("PUT", f"/users/{quote(name, safe='')}", json=body)

    def put_permissions(self, user: str, configure: str, write: str, read: str) -> None:
        """Set ``user``'s configure/write/read patterns in this vhost (replacing any)."""
        body = {"configure": configure, "write": write, "read": read}
        self._request("PUT", f"/permissions/{self._vhost}/{quote(user, safe='')}", json=body)

    def put_vhost(self) -> None:
        """Create this vhost (no change if it exists)."""
        self._request("PUT", f"/vhosts/{self._vhost}")

    def delete_vhost(self) -> None:
        self._request("DELETE", f"/vhosts/{self._vhost}")

    def delete_user(self, name: str) -> None:
        self._request("DELETE", f"/users/{quote(name, safe='')}")

    def delete_policy(self, name: str) -> None:
        self._request("DELETE", f"/policies/{self._vhost}/{quote(name, safe='')}")

    def _get_or_none(self, path: str) -> dict[str, Any] | None:
        response = self._request("GET", path)
        return None if response.status_code == 404 else response.json()
