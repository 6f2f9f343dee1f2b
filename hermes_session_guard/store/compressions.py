"""Compression operations (``session_guard_compressions``: for crash recovery and
status) and what ``repair --apply`` did (``session_guard_repairs``)."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from ..safe_text import json_text
from .connection import StoreConnection


class CompressionRepository(StoreConnection):
    """Phases of each compression, and repair records."""

    def begin_compression(self, op_id: str, session_id: str, messages_before: int) -> None:
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO session_guard_compressions(op_id, session_id, phase, started_at,"
                " messages_before) VALUES (?,?,?,?,?)",
                (op_id, session_id, "started", time.time(), messages_before),
            )

    def set_compression_phase(
        self,
        op_id: str,
        phase: str,
        *,
        snapshot_id: str | None = None,
        messages_after: int | None = None,
        detail: str | None = None,
        finished: bool = False,
    ) -> None:
        with self.transaction() as conn:
            conn.execute(
                "UPDATE session_guard_compressions SET phase = ?,"
                " snapshot_id = COALESCE(?, snapshot_id), messages_after = COALESCE(?, messages_after),"
                " detail = COALESCE(?, detail), finished_at = CASE WHEN ? THEN ? ELSE finished_at END"
                " WHERE op_id = ?",
                (phase, snapshot_id, messages_after, detail, finished, time.time(), op_id),
            )

    def compressions(self, session_id: str) -> list[dict[str, Any]]:
        with self.reading() as conn:
            conn.row_factory = sqlite3.Row
            try:
                rows = conn.execute(
                    "SELECT * FROM session_guard_compressions WHERE session_id = ? ORDER BY started_at",
                    (session_id,),
                ).fetchall()
            finally:
                conn.row_factory = None
        return [dict(r) for r in rows]

    def compression_in_flight(self, session_id: str, max_age: float) -> str | None:
        """The op id of a compression of ``session_id`` that started less than ``max_age``
        seconds ago and has not finished (any process sharing this state.db), else None."""
        with self.reading() as conn:
            row = conn.execute(
                "SELECT op_id FROM session_guard_compressions WHERE session_id = ? AND phase = 'started'"
                " AND finished_at IS NULL AND started_at >= ? ORDER BY started_at DESC LIMIT 1",
                (session_id, time.time() - max_age),
            ).fetchone()
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
