"""Each compaction of a session after the fact, from ``session_guard_compressions``
(``status --session``): op id, outcome, phase times, messages, snapshot, reason.

A row still in phase ``started`` is read by who ran it: its process provably gone
(:mod:`..locks.liveness`) -> ``interrupted`` (killed midway; the next compression of the
session records that durably), alive -> ``running``, unknown (another machine, a row
written before the guard recorded its process) -> ``running`` while younger than the
lease, else ``unfinished``. Ids, counts, times and reasons only; no message text.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..locks.liveness import DEAD, holder_liveness
from .state_inspection import readonly_connection

TABLE = "session_guard_compressions"


def _iso(ts: Any) -> str | None:
    return datetime.fromtimestamp(float(ts), UTC).isoformat(timespec="milliseconds") if ts is not None else None


def _ms(start: Any, end: Any) -> float | None:
    if start is None or end is None:
        return None
    return round((float(end) - float(start)) * 1000, 1)


def outcome_of(row: dict[str, Any], now: float, lease_seconds: float) -> str:
    """The recorded phase, or for an unfinished row what its process says (module docstring)."""
    phase = str(row.get("phase") or "")
    if phase != "started" or row.get("finished_at") is not None:
        return phase
    liveness = holder_liveness(row.get("holder"))
    if liveness == DEAD:
        return "interrupted"
    if liveness == "alive" or now - float(row.get("started_at") or 0.0) < lease_seconds:
        return "running"
    return "unfinished"


def record_of(row: dict[str, Any], now: float, lease_seconds: float) -> dict[str, Any]:
    started, finished = row.get("started_at"), row.get("finished_at")
    lock_at, summary_at, summary_end = (row.get("lock_acquired_at"), row.get("summary_started_at"),
                                        row.get("summary_finished_at"))
    outcome = outcome_of(row, now, lease_seconds)
    reason = row.get("detail")
    if outcome == "interrupted" and not reason:
        reason = "the process running it is gone; it never recorded an outcome"
    return {
        "op_id": row.get("op_id"),
        "outcome": outcome,
        "strategy": row.get("strategy"),
        "started_at": _iso(started),
        "lock_acquired_at": _iso(lock_at),
        "summary_started_at": _iso(summary_at),
        "summary_finished_at": _iso(summary_end),
        "finished_at": _iso(finished),
        "lock_wait_ms": _ms(started, lock_at),
        "summary_ms": _ms(summary_at, summary_end),
        "duration_ms": _ms(started, finished),
        "messages_before": row.get("messages_before"),
        "messages_after": row.get("messages_after"),
        "summary_chars": row.get("summary_chars"),
        "snapshot_id": row.get("snapshot_id"),
        "reason": reason,
    }


def compaction_records(db_path: Path, session_id: str, now: float, lease_seconds: float) -> list[dict[str, Any]]:
    """Every recorded compaction of ``session_id``, oldest first ([] before the guard's tables exist)."""
    with readonly_connection(db_path) as conn:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)).fetchone():
            return []
        conn.row_factory = sqlite3.Row
        rows = [dict(r) for r in conn.execute(
            f"SELECT * FROM {TABLE} WHERE session_id = ? ORDER BY started_at, op_id", (session_id,))]
    return [record_of(r, now, lease_seconds) for r in rows]
