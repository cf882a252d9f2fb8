"""The summary of the keyed-RPC demo, printed once its pool is gone."""

from __future__ import annotations

from switchyard.core.latency import LatencySummary
from switchyard.demo.printer import Printer
from switchyard.demo.rpc_pool import PoolRun


def print_summary(out: Printer, run: PoolRun) -> None:
    """Cold starts, the client's counts, the control plane's passes and invocations, what is left."""
    out.section("Summary")
    cold_summary = LatencySummary.of(list(run.cold.values()))
    out.line(f"cold start (first response for a new key, {len(run.cold)} keys at once): "
             f"p50 {cold_summary.p50_ms:.0f} ms, max {cold_summary.max_ms:.0f} ms")
    stats = run.stats
    out.line(f"client: {stats.published:,} requests, {stats.responses:,} responses, "
             f"{stats.timeouts} timeouts, {stats.stale_responses} late responses ignored")
    out.line(f"control plane: {run.runtime.reconcile_passes} reconciler passes; bridges: "
             + ", ".join(f"{s.function_name.split('-')[0]} {s.stats.invocations} invocations"
                         for s in run.runtime.sources))
    out.line("pool deleted" if not run.kept else f"pool kept: switchyard pool status --pool {run.pool}")
