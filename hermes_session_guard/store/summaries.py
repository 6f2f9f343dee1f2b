"""Where summaries sit in a session's live transcript (``session_guard_summaries``),
so a later load can tag them again and recall can tell compacted turns."""

from __future__ import annotations

import time
from collections.abc import Iterable

from .connection import StoreConnection


class SummaryRepository(StoreConnection):
    """The summary marks of each session."""

    def record_summaries(
        self,
        session_id: str,
        snapshot_id: str | None,
        marks: Iterable[tuple[int, str, int | None, int | None]],
        created_at: float | None = None,
    ) -> None:
        """Remember ``(position, content_hash, first_turn, last_turn)`` of summaries in
        ``session_id``'s live transcript, so loads can tag them again."""
        now = time.time() if created_at is None else created_at
        with self.transaction() as conn:
            conn.executemany(
                "INSERT INTO session_guard_summaries(session_id, content_hash, snapshot_id, position,"
                " first_turn, last_turn, created_at) VALUES (?,?,?,?,?,?,?)"
                " ON CONFLICT(session_id, content_hash) DO NOTHING",
                [(session_id, h, snapshot_id, pos, a, b, now) for pos, h, a, b in marks],
            )

    def compacted_ranges(self, session_ids: Iterable[str]) -> dict[str, tuple[int, int]]:
        """``snapshot_id -> (first_turn, last_turn)``: the turns of each snapshot its summary replaced."""
        ids = list(session_ids)
        if not ids:
            return {}
        marks = ",".join("?" for _ in ids)
        rows = self.read_all("SELECT snapshot_id, MIN(first_turn), MAX(last_turn) FROM session_guard_summaries"
                             f" WHERE session_id IN ({marks}) AND snapshot_id IS NOT NULL AND first_turn IS NOT NULL"
                             " GROUP BY snapshot_id", ids)
        return {r[0]: (int(r[1]), int(r[2])) for r in rows}

    def summary_marks(self, session_ids: Iterable[str]) -> tuple[set[str], set[str]]:
        """``(content_hashes, snapshot_ids)`` recorded for summaries of these sessions."""
        ids = list(session_ids)
        if not ids:
            return set(), set()
        marks = ",".join("?" for _ in ids)
        with self.reading() as conn:
            rows = conn.execute(
                f"SELECT content_hash, snapshot_id FROM session_guard_summaries WHERE session_id IN ({marks})", ids
            ).fetchall()
            snaps = conn.execute(
                f"SELECT snapshot_id FROM session_guard_snapshots WHERE session_id IN ({marks})", ids
            ).fetchall()
        return {r[0] for r in rows}, {r[1] for r in rows if r[1]} | {r[0] for r in snaps}
