"""OpenTelemetry for compactions, when ``opentelemetry-api`` is importable (Hermes ships it
from 0.14 on); no dependency of the guard's own, and nothing to configure here: the
process's tracer and meter providers (an SDK the operator set up, or the API's no-op
defaults) decide where it goes (docs/events.md).

From the compaction events (hook ``session_guard_compaction_event``):

- one span ``session_guard.compaction`` per compaction, a child of whatever span is
  current when it starts and current itself until it ends (an instrumented summary call
  nests under it); attributes: session and op id, release, strategy, messages in/out,
  summary call duration, outcome, error type;
- metrics: ``session_guard.compactions`` (counter, by outcome),
  ``session_guard.compaction.duration`` (histogram, ms, by outcome),
  ``session_guard.compaction.lock_wait`` (histogram, ms),
  ``session_guard.compaction.messages_buffered`` (counter).

Ids, counts, durations and outcomes only; never message or summary text, never a reason
sentence (it may quote an exception's message).
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

from .fail_open import failing_open
from .hooks.specs import COMPACTION_FAILED, COMPACTION_STARTED, CompactionEvent

SCOPE = "hermes_session_guard"
SPAN_NAME = "session_guard.compaction"


class _Instruments:
    def __init__(self, trace: Any, metrics: Any, context: Any) -> None:
        self.trace, self.context = trace, context
        meter = metrics.get_meter(SCOPE)
        self.compactions = meter.create_counter(
            "session_guard.compactions", unit="{compaction}", description="Guarded compactions, by outcome")
        self.duration = meter.create_histogram(
            "session_guard.compaction.duration", unit="ms", description="Guarded compaction wall time, by outcome")
        self.lock_wait = meter.create_histogram(
            "session_guard.compaction.lock_wait", unit="ms", description="Wait for the session's compaction lock")
        self.buffered = meter.create_counter(
            "session_guard.compaction.messages_buffered", unit="{message}",
            description="Messages held back while their session compacted")


_state: dict[str, Any] = {}  # "instruments": _Instruments | None once looked up
_open: dict[str, tuple[Any, Any]] = {}  # op id -> (span, context token)
_lock = threading.Lock()


def _instruments() -> _Instruments | None:
    """The instruments, or None when ``opentelemetry-api`` is not importable (looked up once)."""
    if "instruments" not in _state:
        with failing_open("looking up OpenTelemetry for compactions", "compactions are not traced or measured",
                          advice=None, level=logging.DEBUG) as failed:  # absent, or an API too old for these calls
            trace = importlib.import_module("opentelemetry.trace")
            metrics = importlib.import_module("opentelemetry.metrics")
            context = importlib.import_module("opentelemetry.context")
            _state["instruments"] = _Instruments(trace, metrics, context)
        if failed:
            _state["instruments"] = None
    instruments: _Instruments | None = _state["instruments"]
    return instruments


def reset() -> None:
    """Look the API up again at the next event (tests that install a provider)."""
    with _lock:
        _state.clear()
        _open.clear()


def _attributes(event: CompactionEvent) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "session_guard.session_id": event.session_id,
        "session_guard.op_id": event.op_id,
        "session_guard.strategy": event.strategy,
        "session_guard.messages_in": event.messages_before,
    }
    if event.release:
        attrs["hermes.release"] = event.release
    optional = {
        "session_guard.messages_out": event.messages_after,
        "session_guard.summary_duration_ms": event.summary_ms,
        "session_guard.lock_wait_ms": event.lock_wait_ms,
        "session_guard.outcome": event.outcome,
        "session_guard.snapshot_id": event.snapshot_id,
        "session_guard.messages_buffered": event.messages_buffered,
        "error.type": event.error_type,
    }
    attrs.update({k: v for k, v in optional.items() if v is not None})
    return attrs


def record(event: CompactionEvent) -> None:
    """One compaction event into the span and the metrics (no-op without the API)."""
    otel = _instruments()
    if otel is None:
        return
    if event.name == COMPACTION_STARTED:
        span = otel.trace.get_tracer(SCOPE).start_span(SPAN_NAME, attributes=_attributes(event))
        token = otel.context.attach(otel.trace.set_span_in_context(span))
        with _lock:
            _open[event.op_id] = (span, token)
        return
    with _lock:
        span, token = _open.pop(event.op_id, (None, None))
    outcome = event.outcome or "failed"
    otel.compactions.add(1, {"outcome": outcome})
    if event.duration_ms is not None:
        otel.duration.record(event.duration_ms, {"outcome": outcome})
    if event.lock_wait_ms is not None:
        otel.lock_wait.record(event.lock_wait_ms)
    if event.messages_buffered:
        otel.buffered.add(event.messages_buffered)
    if span is None:
        return
    try:
        span.set_attributes(_attributes(event))
        if event.name == COMPACTION_FAILED:
            span.set_status(otel.trace.Status(otel.trace.StatusCode.ERROR))
    finally:
        span.end()
        # ended on another thread or out of order: the span still ended
        with failing_open("detaching the compaction span's context", "the span still ended", advice=None,
                          level=logging.DEBUG):
            otel.context.detach(token)
