"""Hypothesis profiles of the fuzz run: ``ci`` (the test command) and ``faults`` (``./dev faults``).

``SWITCHYARD_FUZZ_EXAMPLES`` is the number of generated events over the whole run; each test takes
its share (``examples(share)``), so the parsers, which are cheap, get most of them.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

CI_EXAMPLES = 500
TOTAL_EXAMPLES = int(os.environ.get("SWITCHYARD_FUZZ_EXAMPLES") or CI_EXAMPLES)

_common = {"deadline": None, "database": None, "print_blob": True,
           "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.data_too_large, HealthCheck.large_base_example]}
settings.register_profile("ci", **_common)
settings.register_profile("faults", **_common)
settings.load_profile("faults" if os.environ.get("SWITCHYARD_FUZZ_EXAMPLES") else "ci")


def examples(share: float, least: int = 3) -> int:
    """This test's number of examples: ``share`` of the run's total."""
    return max(least, int(TOTAL_EXAMPLES * share))
