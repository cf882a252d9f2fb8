"""No Lambda handler carries the local runtime, the command line or the demo into its cold start.

Each ``functions/*.py`` is imported in a fresh interpreter (``bench/layer_imports.py``'s probe, on
this source tree), and ``sys.modules`` is read after it: the delay handlers once loaded the local
Kafka bridge through ``switchyard.delay.runtime``.
"""

from __future__ import annotations

import pytest

from bench.layer_imports import ADAPTER_PREFIXES, adapter_modules_loaded, handlers, probe
from tests.conftest import ROOT

HANDLERS = handlers(ROOT / "functions")


@pytest.mark.parametrize("module", sorted(HANDLERS))
def test_a_handler_loads_no_adapter_module(module: str) -> None:
    _, _, adapters = probe(module, HANDLERS[module], source=ROOT)
    assert adapters == [], f"functions/{module}.py loads {adapters}"


def test_the_probe_sees_an_adapter_module() -> None:
    """The check can fail: a name under each prefix is caught, a look-alike is not."""
    loaded = [*ADAPTER_PREFIXES, "switchyard.local.msk_bridge", "switchyard.localize", "switchyard.rpc"]
    assert adapter_modules_loaded(loaded) == [*ADAPTER_PREFIXES, "switchyard.local.msk_bridge"]
