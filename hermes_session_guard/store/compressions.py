"""Compression operations (``session_guard_compressions``: for crash recovery and
status) and what ``repair --apply`` did (``session_guard_repairs``).

One row per compression: ``phase`` is ``started`` while it runs, then its outcome
(``done``, ``adopted``, ``skipped``, ``failed``), or ``interrupted`` once a later
compression of the session found the process that ran it gone (killed midway).
The phase times (``STEP_COLUMNS``) say where the time went."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..safe_text import json_text
from .connection import StoreConnection

# The phase times a running compression records (columns of session_guard_compressions).
STEP_COLUMNS = ("lock_acquired_at", "summary_started_at", "summary_finished_at")


def _step_assignments(steps: Mapping[str, float | None]) -> str:
    """``", col = ?"`` for each step, after checking they are ``STEP_COLUMNS``."""
    unknown = sorted(set(steps) - set(STEP_COLUMNS))
    if unknown:
        raise ValueError(f"unknown compression step(s) {unknown!r}; known: {', '.join(STEP_COLUMNS)}")
    return "".join(f", {k} = ?" for k in steps)


@dataclass(frozen=True)
class CompressionStart:
    """A compression's row as it starts (:meth:`CompressionRepository.begin_compression`)."""

    op_id: str
    session_id: str
    messages_before: int
    holder: str | None = None
    strategy: str | None = None
    started_at: float | None = None


@dataclass(frozen=True)
class CompressionEnd:
    """A compression's outcome on its row (:meth:`CompressionRepository.end_compression`):
    ``phase``, what the outcome knows, the step times (``STEP_COLUMNS``) not written yet;
    ``start`` when the row was never written (it is inserted first, in the same write)."""

    op_id: str
    phase: str
    snapshot_id: str | None = None
    messages_after: int | None = None
    detail: str | None = None
    summary_chars: int | None = None
    steps: Mapping[str, float] = field(default_factory=dict)
    start: CompressionStart | None = None


class CompressionRepository(StoreConnection):
    """Phases of each compression, and repair records."""

    def begin_compression(self, op_id: str, session_id: str, messages_before: int, *,
                          holder: str | None = None, strategy: str | None = None, started_at: float | None = None,
                          steps: dict[str, float] | None = None) -> None:
        """The row of a compression started at ``started_at`` (now if None), with the step
        times (``STEP_COLUMNS``) already known, in one write."""
        steps = steps or {}
        _step_assignments(steps)  # checks the names
        columns = "".join(f", {k}" for k in steps)
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO session_guard_compressions(op_id, session_id, phase, started_at,"
                f" messages_before, holder, strategy{columns}) VALUES (?,?,?,?,?,?,?{', ?' * len(steps)})",
                (op_id, session_id, "started", time.time() if started_at is None else started_at, messages_before,
                 holder, strategy, *steps.values()),
            )

    def mark_compression_steps(self, op_id: str, **steps: float | None) -> None:
        """Record when ``steps`` (``STEP_COLUMNS``: their times, None for now) of a running
        compression happened, in one write."""
        if not steps:
            raise ValueError(f"no compression step named; known: {', '.join(STEP_COLUMNS)}")
        assignments = _step_assignments(steps)
        now = time.time()
        with self.transaction() as conn:
            conn.execute(f"UPDATE session_guard_compressions SET {assignments[2:]} WHERE op_id = ?",
                         (*(now if at is None else at for at in steps.values()), op_id))

    def unfinished_compressions(self, session_id: str) -> list[tuple[str, str | None]]:
        """(op id, holder) of each compression of ``session_id`` still in phase ``started``."""
        rows = self.read_all("SELECT op_id, holder FROM session_guard_compressions WHERE session_id = ?"
                             " AND phase = 'started' AND finished_at IS NULL", (session_id,))
        return [(str(r[0]), r[1]) for r in rows]

    def mark_interrupted(self, op_id: str, detail: str) -> None:
        """A compression whose process is gone: it never recorded an outcome."""
        with self.transaction() as conn:
            conn.execute(
                "UPDATE session_guard_compressions SET phase = 'interrupted', detail = COALESCE(detail, ?)"
                " WHERE op_id = ? AND phase = 'started' AND finished_at IS NULL", (detail, op_id),
            )

    def set_compression_phase(
        self,
        op_id: str,
        phase: str,
        *,
        snapshot_id: str | None = None,
        messages_after: int | None = None,
        detail: str | None = None,
        summary_chars: int | None = None,
        finished: bool = False,
        steps: dict[str, float] | None = None,
    ) -> None:
        """Set the phase (and what the outcome knows); ``steps``: step times (``STEP_COLUMNS``)
        not written yet, in the same write."""
        steps = steps or {}
        assignments = _step_assignments(steps)
        with self.transaction() as conn:
            conn.execute(
                "UPDATE session_guard_compressions SET phase = ?,"
                " snapshot_id = COALESCE(?, snapshot_id), messages_after = COALESCE(?, messages_after),"
                " detail = COALESCE(?, detail), summary_chars = COALESCE(?, summary_chars),"
                " finished_at = CASE WHEN ? THEN ? ELSE finished_at END"
                + assignments + " WHERE op_id = ?",
                (phase, snapshot_id, messages_after, detail, summary_chars, finished, time.time(), *steps.values(),
                 op_id),
            )

    def end_compression(self, end: CompressionEnd) -> None:
        """The row's end (finished now), inserted first when ``end.start`` says it was never
        written; one write, in the caller's transaction when there is one."""
        with self.transaction():
            if end.start is not None:
                s = end.start
                self.begin_compression(s.op_id, s.session_id, s.messages_before, holder=s.holder,
                                       strategy=s.strategy, started_at=s.started_at)
            self.set_compression_phase(end.op_id, end.phase, snapshot_id=end.snapshot_id,
                                       messages_after=end.messages_after, detail=end.detail,
                                       summary_chars=end.summary_chars, finished=True, steps=dict(end.steps))

    def _compression_rows(self, where: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        with self.reading() as conn:
            cur = conn.execute(f"SELECT * FROM session_guard_compressions {where}", params)
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def compressions(self, session_id: str) -> list[dict[str, Any]]:
        return self._compression_rows("WHERE session_id = ? ORDER BY started_at", (session_id,))

    def latest_compressions(self, limit: int) -> list[dict[str, Any]]:
        """The ``limit`` latest compressions of any session, newest first."""
        return self._compression_rows("ORDER BY started_at DESC, op_id LIMIT ?", (limit,))

    def compression_in_flight(self, session_id: str, max_age: float) -> str | None:
        """The op id of a compression of ``session_id`` that started less than ``max_age``
        seconds ago and has not finished (any process sharing this state.db), else None."""
        row = self.read_one("SELECT op_id FROM session_guard_compressions WHERE session_id = ? AND phase = 'started'"
                            " AND finished_at IS NULL AND started_at >= ? ORDER BY started_at DESC LIMIT 1",
                            (session_id, time.time() - max_age))
        return row[0] if row else None
    # -- repairs --------------------------------------------------------------------
    def record_repair(self, *, op_id: str, session_id: str, record: dict[str, Any],
                      backup_path: str | None = None) -> None:
        """Remember what ``repair --apply`` did to one lineage (the original session
        rows it re-marked, the snapshots it wrote, where routing pointed)."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO session_guard_repairs(op_id, session_id, created_at, backup_path, record_json)"
                " VALUES (?,?,?,?,?)",
                (op_id, session_id, time.time(), backup_path, json_text(record)),
            )
