"""Snapshots: the verbatim messages a compression replaced
(``session_guard_snapshots`` and ``session_guard_snapshot_messages``). Immutable once written."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .recall import IndexText, RecallIndexRepository
from .rows import _row_message, _row_parts
from .schema import _has_table


@dataclass(frozen=True)
class SnapshotInfo:
    snapshot_id: str
    session_id: str
    op_id: str | None
    created_at: float
    message_count: int
    first_turn: int | None
    last_turn: int | None
    reason: str | None
    host_version: str | None
    host_mode: str | None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

def read_snapshot_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Snapshots per session through any (read-only) connection; empty when the
    guard never wrote to this database."""
    if not _has_table(conn, "session_guard_snapshots"):
        return {}
    rows = conn.execute("SELECT session_id, COUNT(*) FROM session_guard_snapshots GROUP BY session_id")
    return {str(sid): int(n) for sid, n in rows}


def snapshots_recorded(db_path: Path, session_id: str) -> bool:
    """Whether the guard recorded a snapshot of ``session_id`` in ``db_path``, read
    through a short-lived read-only connection (nothing created, nothing kept open;
    False when the guard's table is not there or the file cannot be read)."""
    try:
        conn = sqlite3.connect(f"{Path(db_path).resolve().as_uri()}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return False
    try:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'session_guard_snapshots'"
                        ).fetchone() is None:
            return False
        return conn.execute("SELECT 1 FROM session_guard_snapshots WHERE session_id = ? LIMIT 1",
                            (session_id,)).fetchone() is not None
    except sqlite3.Error:
        return False
    finally:
        conn.close()

class SnapshotRepository(RecallIndexRepository):
    """Writes and reads snapshots; a snapshot written with ``index_text`` enters the
    recall index in the same transaction."""

    def snapshot_exists(self, snapshot_id: str) -> bool:
        with self.reading() as conn:
            row = conn.execute(
                "SELECT 1 FROM session_guard_snapshots WHERE snapshot_id = ?", (snapshot_id,)
            ).fetchone()
        return row is not None

    def write_snapshot(
        self,
        *,
        snapshot_id: str,
        session_id: str,
        messages: Iterable[Any],
        op_id: str | None = None,
        first_turn: int | None = None,
        reason: str = "compression",
        host_version: str | None = None,
        host_mode: str | None = None,
        created_at: float | None = None,
        index_text: IndexText | None = None,
    ) -> SnapshotInfo:
        """Store ``messages`` verbatim under ``snapshot_id``. Snapshots are immutable:
        writing an existing id raises ``sqlite3.IntegrityError``. With ``index_text``
        the messages also enter the recall index (the text it returns for each; a
        ``None`` keeps that message out)."""
        rows = [(snapshot_id, pos, *_row_parts(msg)) for pos, msg in enumerate(messages)]
        first = 1 if first_turn is None else first_turn
        info = SnapshotInfo(
            snapshot_id=snapshot_id,
            session_id=session_id,
            op_id=op_id,
            created_at=time.time() if created_at is None else created_at,
            message_count=len(rows),
            first_turn=first,
            last_turn=first + len(rows) - 1,
            reason=reason,
            host_version=host_version,
            host_mode=host_mode,
        )
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO session_guard_snapshots(snapshot_id, session_id, op_id, created_at,"
                " message_count, first_turn, last_turn, reason, host_version, host_mode)"
                " VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    info.snapshot_id,
                    info.session_id,
                    info.op_id,
                    info.created_at,
                    info.message_count,
                    info.first_turn,
                    info.last_turn,
                    info.reason,
                    info.host_version,
                    info.host_mode,
                ),
            )
            conn.executemany(
                "INSERT INTO session_guard_snapshot_messages(snapshot_id, position, role, content,"
                " message_json) VALUES (?,?,?,?,?)",
                rows,
            )
            if index_text is not None:
                self._index_snapshot(conn, session_id, snapshot_id, first,
                                     [(role, content, raw) for _sid, _p, role, content, raw in rows], index_text)
        return info
    def snapshot_message(self, snapshot_id: str, position: int) -> dict[str, Any] | None:
        """Message at 1-based ``position`` of a snapshot."""
        with self.reading() as conn:
            row = conn.execute(
                "SELECT m.message_json, m.content FROM session_guard_snapshot_messages m"
                " JOIN session_guard_snapshots s ON s.snapshot_id = m.snapshot_id"
                " WHERE m.snapshot_id = ? AND m.position = ? - COALESCE(s.first_turn, 1)",
                (snapshot_id, position),
            ).fetchone()
        return _row_message(row[0], row[1]) if row else None

    def snapshot_turns(self, snapshot_id: str, first: int, last: int) -> list[tuple[int, dict[str, Any]]]:
        """``(turn, message)`` for turns ``first..last`` of a snapshot."""
        with self.reading() as conn:
            base = conn.execute(
                "SELECT COALESCE(first_turn, 1) FROM session_guard_snapshots WHERE snapshot_id = ?", (snapshot_id,)
            ).fetchone()
            if not base:
                return []
            rows = conn.execute(
                "SELECT position, message_json, content FROM session_guard_snapshot_messages"
                " WHERE snapshot_id = ? AND position BETWEEN ? AND ? ORDER BY position",
                (snapshot_id, first - base[0], last - base[0]),
            ).fetchall()
        return [(pos + base[0], _row_message(raw, content)) for pos, raw, content in rows]

    def snapshot_info(self, snapshot_id: str) -> SnapshotInfo | None:
        with self.reading() as conn:
            row = conn.execute(
                "SELECT snapshot_id, session_id, op_id, created_at, message_count, first_turn, last_turn,"
                " reason, host_version, host_mode FROM session_guard_snapshots WHERE snapshot_id = ?",
                (snapshot_id,),
            ).fetchone()
        return SnapshotInfo(*row) if row else None

    def has_snapshots(self, session_id: str) -> bool:
        with self.reading() as conn:
            row = conn.execute(
                "SELECT 1 FROM session_guard_snapshots WHERE session_id = ? LIMIT 1", (session_id,)
            ).fetchone()
        return row is not None
    def list_snapshots(self, session_id: str) -> list[SnapshotInfo]:
        with self.reading() as conn:
            rows = conn.execute(
                "SELECT snapshot_id, session_id, op_id, created_at, message_count, first_turn, last_turn,"
                " reason, host_version, host_mode FROM session_guard_snapshots WHERE session_id = ?"
                " ORDER BY created_at, snapshot_id",
                (session_id,),
            ).fetchall()
        return [SnapshotInfo(*row) for row in rows]

    def snapshot_messages(self, snapshot_id: str, session_id: str | None = None) -> list[dict[str, Any]]:
        """The messages of one snapshot, in order. With ``session_id`` the snapshot
        must belong to that session (else an empty list)."""
        query = (
            "SELECT m.message_json, m.content FROM session_guard_snapshot_messages m"
            " JOIN session_guard_snapshots s ON s.snapshot_id = m.snapshot_id"
            " WHERE m.snapshot_id = ?"
        )
        params: tuple[Any, ...] = (snapshot_id,)
        if session_id is not None:
            query += " AND s.session_id = ?"
            params += (session_id,)
        with self.reading() as conn:
            rows = conn.execute(query + " ORDER BY m.position", params).fetchall()
        return [_row_message(r[0], r[1]) for r in rows]
    def compression_count(self, session_id: str, since: float | None = None) -> int:
        """Compressions of ``session_id`` that stored a snapshot (after ``since``)."""
        with self.reading() as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM session_guard_snapshots WHERE session_id = ? AND reason = 'compression'"
                " AND created_at > ?",
                (session_id, -1.0 if since is None else since),
            ).fetchone()
        return int(row[0])
