"""Hand-off records (``session_guard_handoffs``): automatic hand-offs numbered and
bounded per lineage, and packets written on request."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from .connection import StoreConnection


@dataclass(frozen=True)
class HandoffRecord:
    """One row of ``session_guard_handoffs``. ``seq`` numbers the automatic
    hand-offs of a lineage (1..max_auto_handoffs); manual packets have none."""

    handoff_id: str
    lineage_root: str
    seq: int | None
    parent_session_id: str
    child_session_id: str | None
    mode: str
    status: str  # "reserved" | "done"
    packet_path: str | None
    op_id: str | None
    created_at: float
    finished_at: float | None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


_HANDOFF_COLUMNS = (
    "handoff_id, lineage_root, seq, parent_session_id, child_session_id, mode, status, packet_path, op_id,"
    " created_at, finished_at"
)


class HandoffRepository(StoreConnection):
    """Reservations, completions and the lineage of hand-offs."""

    def lineage_root(self, session_id: str) -> str:
        """The first session of the hand-off chain ``session_id`` belongs to."""
        with self.reading() as conn:
            return self._lineage_root_locked(conn, session_id)

    def last_auto_handoff_at(self, parent_session_id: str) -> float | None:
        row = self.read_one("SELECT MAX(created_at) FROM session_guard_handoffs WHERE parent_session_id = ?"
                            " AND seq IS NOT NULL AND status = 'done'", (parent_session_id,))
        return None if row is None or row[0] is None else float(row[0])

    def reserve_handoff(
        self,
        *,
        handoff_id: str,
        lineage_root: str,
        parent_session_id: str,
        mode: str,
        limit: int,
        op_id: str | None = None,
        stale_after: float = 300.0,
        once_per_parent: bool = False,
    ) -> int | None:
        """Claim the next automatic hand-off of a lineage, atomically across processes.

        Returns its sequence number, or ``None`` when ``limit`` hand-offs are
        already reserved or done (or, with ``once_per_parent``, when this parent
        was already handed off). A reservation that was never completed or
        released (a crashed process) expires after ``stale_after`` seconds."""
        now = time.time()
        with self.transaction() as conn:
            conn.execute(
                "DELETE FROM session_guard_handoffs WHERE lineage_root = ? AND status = 'reserved'"
                " AND created_at < ?",
                (lineage_root, now - stale_after),
            )
            used = conn.execute(
                "SELECT COUNT(*), COALESCE(MAX(seq), 0) FROM session_guard_handoffs"
                " WHERE lineage_root = ? AND seq IS NOT NULL",
                (lineage_root,),
            ).fetchone()
            if int(used[0]) >= limit:
                return None
            if once_per_parent and conn.execute(
                "SELECT 1 FROM session_guard_handoffs WHERE parent_session_id = ? AND seq IS NOT NULL"
                " AND mode = ?",
                (parent_session_id, mode),
            ).fetchone():
                return None
            seq = int(used[1]) + 1
            conn.execute(
                f"INSERT INTO session_guard_handoffs({_HANDOFF_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (handoff_id, lineage_root, seq, parent_session_id, None, mode, "reserved", None, op_id, now, None),
            )
        return seq

    def complete_handoff(self, handoff_id: str, *, child_session_id: str | None, packet_path: str | None) -> None:
        with self.transaction() as conn:
            conn.execute(
                "UPDATE session_guard_handoffs SET status = 'done', child_session_id = ?, packet_path = ?,"
                " finished_at = ? WHERE handoff_id = ?",
                (child_session_id, packet_path, time.time(), handoff_id),
            )

    def release_handoff(self, handoff_id: str) -> None:
        """Give a claimed hand-off back, recorded or not: it was rolled back and did not
        happen, so the count is not consumed."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM session_guard_handoffs WHERE handoff_id = ?", (handoff_id,))

    def record_packet(
        self, *, handoff_id: str, session_id: str, mode: str, packet_path: str, op_id: str | None = None
    ) -> None:
        """A packet written on request (slash command, CLI): no sequence number, no bound."""
        now = time.time()
        with self.transaction() as conn:
            conn.execute(
                f"INSERT INTO session_guard_handoffs({_HANDOFF_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (handoff_id, self._lineage_root_locked(conn, session_id), None, session_id, None, mode, "done",
                 packet_path, op_id, now, now),
            )

    @staticmethod
    def _lineage_root_locked(conn: sqlite3.Connection, session_id: str) -> str:
        row = conn.execute(
            "SELECT lineage_root FROM session_guard_handoffs WHERE child_session_id = ? AND status = 'done'",
            (session_id,),
        ).fetchone()
        return str(row[0]) if row else session_id

    def handoffs(self, *, lineage_root: str | None = None, session_id: str | None = None) -> list[HandoffRecord]:
        """Hand-off rows of a lineage, or those naming ``session_id`` as parent or child."""
        query = f"SELECT {_HANDOFF_COLUMNS} FROM session_guard_handoffs"
        params: tuple[Any, ...] = ()
        if lineage_root is not None:
            query += " WHERE lineage_root = ?"
            params = (lineage_root,)
        elif session_id is not None:
            query += " WHERE parent_session_id = ? OR child_session_id = ?"
            params = (session_id, session_id)
        return [HandoffRecord(*row) for row in self.read_all(query + " ORDER BY created_at, handoff_id", params)]
