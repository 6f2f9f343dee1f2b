#!/usr/bin/env python3
"""What the compaction events and OpenTelemetry cost per guarded compaction.

    PYTHONPATH=. python scripts/bench_events.py [--n 300]

Runs the guard's compaction contract (``guarded_compression``, strategy ``detach_db``) on a
stand-in agent and SessionDB, ``n`` times in each of three set-ups, and prints the median
time per compaction and its ratio to the first:

``off``  OpenTelemetry not importable for the guard (the events still go to their hook)
``api``  ``opentelemetry-api`` only, no SDK configured (the no-op providers: the default)
``sdk``  an SDK tracer and meter provider with an in-memory exporter and reader (skipped
         when ``opentelemetry-sdk`` is not importable)

A compaction's own summary call takes seconds; this measures the guard's side only.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

from hermes_session_guard import telemetry
from hermes_session_guard.config import GuardConfig
from hermes_session_guard.runtime import Runtime
from hermes_session_guard.seam_behaviour import Strategy
from hermes_session_guard.seams.compression import guarded_compression

SUMMARY = "[CONTEXT COMPACTION — REFERENCE ONLY] earlier turns\n## Goal\nship it"


class _Engine:
    _last_summary_error = None

    def compress(self, messages: list[dict], current_tokens: int | None = None) -> list[dict]:
        return [messages[0], {"role": "assistant", "content": SUMMARY}, messages[-1]]


class _Agent:
    def __init__(self, db: Any, sid: str) -> None:
        self.session_id, self._session_db, self.context_compressor = sid, db, _Engine()
        self._last_flushed_db_idx = 10

    def _compress_context(self, messages: list[dict], system_message: str) -> tuple[list[dict], str]:
        return self.context_compressor.compress(messages), "prompt"


def _once(runtime: Runtime, db: Any, sid: str) -> float:
    agent = _Agent(db, sid)
    messages = [{"role": "user" if k % 2 == 0 else "assistant", "content": f"m{k}"} for k in range(10)]
    start = time.perf_counter()
    guarded_compression(runtime, Strategy.DETACH_DB, agent, messages, lambda: agent._compress_context(messages, "s"))
    return time.perf_counter() - start


def _interleaved(runtime: Runtime, db: Any, n: int, modes: dict[str, Any]) -> dict[str, float]:
    """Median ms per compaction of each mode, the modes taking turns (a loaded machine's
    drift hits them alike)."""
    times: dict[str, list[float]] = {name: [] for name in modes}
    for i in range(n):
        for name, select in modes.items():
            select()
            times[name].append(_once(runtime, db, f"{name}-{i}"))
    return {name: statistics.median(t) * 1000 for name, t in times.items()}


def _use(instruments: Any) -> Any:
    """A mode: the guard's OpenTelemetry instruments (None: as when the API is not importable)."""
    return lambda: telemetry._state.__setitem__("instruments", instruments)


def _current() -> Any:
    telemetry.reset()
    return telemetry._instruments()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=300)
    n = p.parse_args().n
    with tempfile.TemporaryDirectory() as tmp:
        runtime = Runtime(config=GuardConfig(), host_version="bench", fixed_home=Path(tmp))
        db = mock.Mock()
        db.db_path = Path(tmp) / "state.db"
        db.get_messages_as_conversation.return_value = []
        off = _use(None)
        _interleaved(runtime, db, 10, {"warm": off})
        phases = [_interleaved(runtime, db, n, {"off": off, "api": _use(_current())})]
        try:
            from opentelemetry import metrics, trace
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        except ImportError:
            print("sdk: opentelemetry-sdk not importable, not measured")
        else:
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
            trace.set_tracer_provider(provider)
            metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
            phases.append(_interleaved(runtime, db, n, {"off": off, "sdk": _use(_current())}))
        runtime.close()
    for results in phases:
        base = results["off"]
        print("  ".join(f"{name}: median {ms:.3f} ms (ratio {ms / base:.3f})" for name, ms in results.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
