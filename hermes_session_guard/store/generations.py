"""Compaction generations (``session_guard_generations``): how often each session
was compacted and the block the latest compaction left at the start of its transcript."""

from __future__ import annotations

import time
from dataclasses import dataclass

from .connection import StoreConnection


@dataclass(frozen=True)
class GenerationRecord:
    """The latest guarded compaction of one session: its number and the compacted
    block (length and digest of its message keys) it made the live transcript start with."""

    session_id: str
    generation: int
    block_len: int
    block_digest: str
    op_id: str | None
    snapshot_id: str | None
    updated_at: float


_SELECT = ("SELECT session_id, generation, block_len, block_digest, op_id, snapshot_id, updated_at"
           " FROM session_guard_generations WHERE session_id = ?")


class GenerationRepository(StoreConnection):
    """One row per session, counted up by each guarded compaction."""

    def generation(self, session_id: str) -> GenerationRecord | None:
        row = self.read_one(_SELECT, (session_id,))
        return GenerationRecord(*row) if row else None

    def record_generation(
        self, session_id: str, *, block_len: int, block_digest: str, op_id: str | None, snapshot_id: str | None
    ) -> GenerationRecord:
        """Count one more compaction of ``session_id`` and remember the block it left live."""
        now = time.time()
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO session_guard_generations(session_id, generation, block_len, block_digest, op_id,"
                " snapshot_id, updated_at) VALUES (?, 1, ?, ?, ?, ?, ?)"
                " ON CONFLICT(session_id) DO UPDATE SET generation = generation + 1,"
                " block_len = excluded.block_len, block_digest = excluded.block_digest, op_id = excluded.op_id,"
                " snapshot_id = excluded.snapshot_id, updated_at = excluded.updated_at",
                (session_id, block_len, block_digest, op_id, snapshot_id, now),
            )
            row = conn.execute(_SELECT, (session_id,)).fetchone()
        return GenerationRecord(*row)
