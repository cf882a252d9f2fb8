"""An order-pricing service as a Switchyard worker: one key per tenant (``tenant=acme``), so each
tenant's requests queue for that tenant's workers alone, and a tenant with a burst of orders does
not slow the others.

The body is a JSON order, ``{"items": [{"sku": "BOLT-M8", "quantity": 100}]}``; the response is the
priced order, in cents. A bad order raises ``ValueError``: the caller gets status ``error`` with the
message, and the worker goes on with the next request.

Run it: ``switchyard worker --handler pricing:quote`` (the image built from this directory's
Dockerfile does, on Fargate). The walk-through is this directory's README.md.
"""

from __future__ import annotations

import json
from typing import Any

from switchyard.rpc.worker import Request

# The price list in cents. A real service would load it from its own store at start-up.
PRICES = {"BOLT-M8": 12, "NUT-M8": 5, "WASHER-M8": 2, "BRACKET-L": 240}
# Percent off per tenant; the others pay list price.
DISCOUNTS = {"acme": 10, "globex": 5}
MAX_ITEMS = 100


def quote(request: Request) -> bytes:
    """Price the order in ``request.body`` for the tenant named by ``request.key``."""
    tenant = tenant_of(request.key)
    lines = [price_line(item) for item in items_of(request.body)]
    subtotal = sum(line["total"] for line in lines)
    discount = subtotal * DISCOUNTS.get(tenant, 0) // 100
    return json.dumps({
        "tenant": tenant,
        "lines": lines,
        "subtotal": subtotal,
        "discount": discount,
        "total": subtotal - discount,
        "worker": request.worker_id,
    }).encode()


def tenant_of(key: str) -> str:
    """``tenant=acme`` -> ``acme``: the key is how requests reach the tenant's workers."""
    name, _, tenant = key.partition("=")
    if name != "tenant" or not tenant:
        raise ValueError(f"the key must be tenant=NAME, got {key!r}")
    return tenant


def items_of(body: bytes) -> list[dict[str, Any]]:
    try:
        order = json.loads(body)
    except ValueError as exc:
        raise ValueError(f"the order is not JSON: {exc}") from exc
    items = order.get("items") if isinstance(order, dict) else None
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_ITEMS:
        raise ValueError(f'the order needs "items": a list of 1 to {MAX_ITEMS} items')
    return items


def price_line(item: Any) -> dict[str, Any]:
    sku = item.get("sku") if isinstance(item, dict) else None
    quantity = item.get("quantity") if isinstance(item, dict) else None
    if sku not in PRICES:
        raise ValueError(f"unknown sku {sku!r}")
    if not isinstance(quantity, int) or isinstance(quantity, bool) or quantity < 1:
        raise ValueError(f"quantity of {sku} must be a positive whole number, got {quantity!r}")
    return {"sku": sku, "quantity": quantity, "unit": PRICES[sku], "total": PRICES[sku] * quantity}
