"""OpenTelemetry for compactions, when ``opentelemetry-api`` is importable; no dependency of
the guard's own (Hermes declares none up to 0.19; 0.20+ offer one through their ``otlp``
extra), and nothing to configure here: the process's tracer and meter providers (an SDK
the operator set up, or the API's no-op defaults) decide where it goes (docs/events.md).

In the semantic conventions' style: durations in seconds (unit ``s``), the conventions' own
attributes where they have one (``session.id``, ``error.type``), every other attribute in
the one namespace ``session_guard.``, on span and metrics alike, and an instrumentation
scope with the guard's name and version. From the compaction events (hook
``session_guard_compaction_event``):

- one span ``session_guard.compaction`` per compaction, a child of whatever span is
  current when it starts and current itself until it ends (an instrumented summary call
  nests under it); attributes: session and op id, Hermes release, strategy, messages
  in/out, summary call and lock wait durations, outcome, snapshot, error type;
- metrics: ``session_guard.compactions`` (counter, by outcome),
  ``session_guard.compaction.duration`` (histogram, s, by outcome),
  ``session_guard.compaction.lock_wait.duration`` (histogram, s),
  ``session_guard.compaction.messages_buffered`` (counter).

Ids, counts, durations and outcomes only; never message or summary text, never a reason
sentence (it may quote an exception's message).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
from typing import Any

from .compaction_event import COMPACTION_FAILED, COMPACTION_STARTED, CompactionEvent
from .fail_open import failing_open
from .hostinfo import GUARD_VERSION

SCOPE = "hermes_session_guard"
SPAN_NAME = "session_guard.compaction"
SESSION_ID = "session.id"  # the conventions' session attribute
OUTCOME = "session_guard.outcome"  # on the span and on every metric point that has one
# Bucket advice in seconds (SDKs that take advice use it; the default buckets are cut for ms)
DURATION_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
LOCK_WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0)


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0


def scope_version() -> str:
    return GUARD_VERSION


class _Instruments:
    def __init__(self, trace: Any, metrics: Any, context: Any) -> None:
        self.trace, self.context = trace, context
        self.version = scope_version()
        meter = metrics.get_meter(SCOPE, self.version)
        self.compactions = meter.create_counter(
            "session_guard.compactions", unit="{compaction}", description="Guarded compactions, by outcome")
        self.duration = _histogram(
            meter, "session_guard.compaction.duration", "Guarded compaction wall time, by outcome", DURATION_BUCKETS)
        self.lock_wait = _histogram(
            meter, "session_guard.compaction.lock_wait.duration", "Wait for the session's compaction lock",
            LOCK_WAIT_BUCKETS)
        self.buffered = meter.create_counter(
            "session_guard.compaction.messages_buffered", unit="{message}",
            description="Messages held back while their session compacted")

    def tracer(self) -> Any:
        return self.trace.get_tracer(SCOPE, self.version)


def _histogram(meter: Any, name: str, description: str, buckets: tuple[float, ...]) -> Any:
    """A histogram in seconds, with bucket advice where the installed API takes it (1.23+)."""
    advice = "explicit_bucket_boundaries_advisory" in inspect.signature(meter.create_histogram).parameters
    extra = {"explicit_bucket_boundaries_advisory": list(buckets)} if advice else {}
    return meter.create_histogram(name, unit="s", description=description, **extra)


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
        SESSION_ID: event.session_id,
        "session_guard.op_id": event.op_id,
        "session_guard.strategy": event.strategy,
        "session_guard.messages_in": event.messages_before,
    }
    if event.release:
        attrs["session_guard.hermes_release"] = event.release
    optional = {
        "session_guard.messages_out": event.messages_after,
        "session_guard.summary.duration": _seconds(event.summary_ms),
        "session_guard.lock_wait.duration": _seconds(event.lock_wait_ms),
        OUTCOME: event.outcome,
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
        span = otel.tracer().start_span(SPAN_NAME, attributes=_attributes(event))
        token = otel.context.attach(otel.trace.set_span_in_context(span))
        with _lock:
            _open[event.op_id] = (span, token)
        return
    with _lock:
        span, token = _open.pop(event.op_id, (None, None))
    outcome = event.outcome or "failed"
    otel.compactions.add(1, {OUTCOME: outcome})
    if event.duration_ms is not None:
        otel.duration.record(event.duration_ms / 1000.0, {OUTCOME: outcome})
    if event.lock_wait_ms is not None:
        otel.lock_wait.record(event.lock_wait_ms / 1000.0)
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
