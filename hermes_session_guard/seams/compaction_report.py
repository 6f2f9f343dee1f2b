"""What one guarded compression reports: its phase row in ``session_guard_compressions``
(written before the operation waits or calls Hermes, step times as they happen, the outcome
on every exit path), its compaction events for clients, traces and metrics (hook
``session_guard_compaction_event``: one at the start, one at the end) and its outcome's audit
line (``compression.<status>``).

:class:`CompactionReport` is the part of the operation (:class:`.compression._Operation`) that
reports; the operation itself runs the sequence. A failure to write the phase row never fails
the compression: it is said once per operation (:meth:`CompactionReport.record_phase`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .. import host
from ..fail_open import failing_open
from ..hooks.specs import (
    COMPACTION_COMPLETED,
    COMPACTION_FAILED,
    COMPACTION_SKIPPED,
    COMPACTION_STARTED,
    CompactionEvent,
)
from ..inbox.repository import Inbox
from ..locks.session_lock import holder_id
from ..redaction_core import mask_secrets
from ..runtime import Runtime
from ..store import CompressionEnd, CompressionStart, GuardStore

log = logging.getLogger("hermes_session_guard")


@dataclass
class CompressionOutcome:
    session_id_after: str
    status: str  # "done" | "adopted" | "skipped" | "failed"
    snapshot_id: str | None
    messages_after: int
    reason: str = ""
    summary_chars: int | None = None  # total length of the summaries in the compacted list (done)


# The end event of each recorded outcome (an adoption compacts nothing: it is a skip).
_EVENT_OF = {"done": COMPACTION_COMPLETED, "adopted": COMPACTION_SKIPPED, "skipped": COMPACTION_SKIPPED,
             "failed": COMPACTION_FAILED}


class CompactionReport:
    """The reporting of one guarded compression: the state it keeps (its slots, set in the
    operation's ``__init__``) and what it reads of the operation."""

    __slots__ = ("phase_error", "phase_warned", "last", "begun", "outcome_written", "end_emitted")

    runtime: Runtime
    strategy: str
    agent: Any
    sid: str
    op_id: str
    audit: Any
    pm: Any
    before: list[Any]
    started: float
    started_wall: float
    store: GuardStore
    lock_fields: dict[str, Any]
    written_ahead: str | None
    phase_error: str | None
    phase_warned: bool
    last: CompressionOutcome | None
    begun: bool
    outcome_written: CompressionOutcome | None
    engine_returned_at: float | None
    lock_acquired_at: float | None
    summary_started_at: float | None
    summary_ended_at: float | None
    error_type: str | None
    end_emitted: bool

    def record_phase(self, write: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        """Write the durable op row; a failure here must not fail the compression. Said
        once per operation: in the outcome event when it is still to come and reports a
        problem itself, otherwise in one WARNING line."""
        with failing_open("recording the compression phase", "the compression goes on", level=None) as failed:
            write(*args, **kwargs)
        if failed and self.phase_error is None:
            self.phase_error = failed.reason

    def begin(self, **steps: float) -> None:
        """The phase row (``started``), written before the operation waits for anything or
        calls Hermes, with the step times known by then (one write); once written, later
        ``steps`` update it. An operation that ends before either writes it with its outcome
        (write_outcome)."""
        if self.begun:
            if steps:
                self.record_phase(self.store.mark_compression_steps, self.op_id, **steps)
            return
        self.record_phase(self._insert_row, steps)

    def _insert_row(self, steps: dict[str, float]) -> None:
        """The phase row, ``started`` at the operation's start (tried once: a failure is the caller's)."""
        self.write_row(steps)
        self.begun = True

    def start_row(self) -> CompressionStart:
        """The phase row as the operation started."""
        return CompressionStart(self.op_id, self.sid, len(self.before), holder=holder_id(self.op_id),
                                strategy=self.strategy, started_at=self.started_wall)

    def write_row(self, steps: dict[str, float]) -> None:
        row = self.start_row()
        self.store.begin_compression(row.op_id, row.session_id, row.messages_before, holder=row.holder,
                                     strategy=row.strategy, started_at=row.started_at, steps=steps)

    def summary_steps(self) -> dict[str, float]:
        """The step times known when Hermes's compression is called."""
        assert self.summary_started_at is not None
        return {"summary_started_at": self.summary_started_at,
                **({"lock_acquired_at": self.lock_acquired_at} if self.lock_acquired_at else {})}

    def final_steps(self) -> dict[str, float]:
        """The step times not written yet, written with the outcome."""
        steps: dict[str, float] = {}
        if self.lock_acquired_at and self.summary_started_at is None:  # ended before the summary
            steps["lock_acquired_at"] = self.lock_acquired_at
        if self.summary_ended_at is not None:
            steps["summary_finished_at"] = self.engine_returned_at or self.summary_ended_at
        return steps

    def outcome_row(self, last: CompressionOutcome | None) -> CompressionEnd:
        """The phase row's end: ``last``'s status and what it knows (``failed``, interrupted,
        when no outcome was recorded); the row itself too when it was never written."""
        return CompressionEnd(
            self.op_id, last.status if last else "failed",
            snapshot_id=last.snapshot_id if last else None,
            messages_after=last.messages_after if last else None,
            detail=(last.reason or None) if last else "interrupted",
            summary_chars=last.summary_chars if last else None, steps=self.final_steps(),
            start=None if self.begun else self.start_row(),
        )

    def write_outcome(self, last: CompressionOutcome | None) -> None:
        """The phase row's end on its own (a compaction that stands writes it with its other
        rows: settle)."""
        self.store.end_compression(self.outcome_row(last))
        self.begun, self.outcome_written = True, last

    def warn_phase(self) -> None:
        if self.phase_warned:
            if self.phase_error is not None:
                log.debug("session guard: compression phase not recorded (%s)", self.phase_error)
            return
        self.phase_warned = True
        log.warning("session guard: could not record the compression phase in session_guard_compressions "
                    "(%s); compression continues", self.phase_error)

    def finish(self, outcome: CompressionOutcome, level: str = "info", **extra: Any) -> None:
        self.last = outcome
        if level != "info":
            # This outcome reports a problem: a phase row that fails to record it is the
            # same fault, and is not said again.
            self.phase_warned = True
        if self.phase_error is not None:
            extra.setdefault("phase_row", f"not recorded: {self.phase_error}")
            self.warn_phase()  # no-op unless the outcome reports no problem
        if self.written_ahead is not None and outcome.snapshot_id != self.written_ahead:
            # Stored before the host's live write of an operation that then did not compact
            # (or whose outcome cannot name it): it stays, a verbatim copy of a transcript still live.
            extra.setdefault("snapshot_written_ahead", self.written_ahead)
        self.emit(outcome)
        getattr(self.audit, level)(
            f"compression.{outcome.status}",
            session_id_after=outcome.session_id_after,
            messages_before=len(self.before),
            messages_after=outcome.messages_after,
            snapshot_id=outcome.snapshot_id,
            summary_chars=outcome.summary_chars,
            duration_ms=round((time.perf_counter() - self.started) * 1000, 2),
            reason=outcome.reason or None,
            **self.lock_fields,
            **extra,
        )

    def emit(self, outcome: CompressionOutcome | None) -> None:
        """The compaction event for clients, traces and metrics (hook
        ``session_guard_compaction_event``): at the start (``outcome`` None) and once at the end."""
        if outcome is not None:
            if self.end_emitted:
                return
            self.end_emitted = True
        # a subscriber's failure never reaches the compaction
        with failing_open("a compaction event subscriber", "the compaction goes on", level=logging.DEBUG,
                          advice=None):
            event = CompactionEvent(name=COMPACTION_STARTED, session_id=self.sid, op_id=self.op_id,
                                    strategy=self.strategy, release=self.runtime.host_version,
                                    messages_before=len(self.before))
            if outcome is not None:
                summary_ms = None
                if self.summary_started_at is not None:
                    ended = self.engine_returned_at or self.summary_ended_at or time.time()
                    summary_ms = round((ended - self.summary_started_at) * 1000, 2)
                reason = outcome.reason
                if self.error_type and f"{self.error_type}:" in reason:
                    # an exception's message may quote anything: the event names its type only
                    reason = reason.split(f"{self.error_type}:", 1)[0] + self.error_type
                waited = self.lock_fields.get("waited_ms")
                event = replace(
                    event, name=_EVENT_OF.get(outcome.status, COMPACTION_FAILED), messages_after=outcome.messages_after,
                    summary_chars=outcome.summary_chars, snapshot_id=outcome.snapshot_id, outcome=outcome.status,
                    reason=mask_secrets(reason)[:300] if reason else None, error_type=self.error_type,
                    duration_ms=round((time.perf_counter() - self.started) * 1000, 2), summary_ms=summary_ms,
                    lock_wait_ms=float(waited) if isinstance(waited, int | float) else None,
                    messages_buffered=self.buffered_meanwhile(),
                )
            self.pm.hook.session_guard_compaction_event(event=event, agent=self.agent)

    def buffered_meanwhile(self) -> int | None:
        with failing_open("counting the messages buffered meanwhile", "the event leaves the count out",
                          level=logging.DEBUG, advice=None):
            return Inbox(self.store).buffered_during(self.op_id)
        return None

    def outcome(self, status: str, reason: str = "", *, after: int | None = None,
                snapshot_id: str | None = None, summary_chars: int | None = None) -> CompressionOutcome:
        return CompressionOutcome(host.session_id(self.agent), status, snapshot_id,
                                  len(self.before) if after is None else after, reason, summary_chars)
