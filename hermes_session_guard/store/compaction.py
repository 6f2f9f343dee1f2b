"""What one compaction that stands records, in one commit: the summary marks
(``session_guard_summaries``), the session's generation (``session_guard_generations``)
and the compression's outcome on its phase row (``session_guard_compressions``).

The core hands one :class:`CompactionRows` to :meth:`CompactionRepository.record_compaction`:
the three rows are committed together, or (any of them failing) none of them is."""

from __future__ import annotations

from dataclasses import dataclass

from .compressions import CompressionEnd, CompressionRepository
from .generations import GenerationRecord, GenerationRepository
from .summaries import SummaryRepository


@dataclass(frozen=True)
class CompactionRows:
    """One compaction's row set. ``summaries``: ``(position, content_hash, first_turn,
    last_turn)`` of each summary in the live transcript; ``block_len`` and ``block_digest``:
    the compacted block the live transcript now starts with; ``end``: the phase row's outcome
    (its ``op_id`` is the compaction's)."""

    session_id: str
    snapshot_id: str | None
    created_at: float
    summaries: tuple[tuple[int, str, int | None, int | None], ...]
    block_len: int
    block_digest: str
    end: CompressionEnd


class CompactionRepository(SummaryRepository, GenerationRepository, CompressionRepository):
    """The one writer of a compaction's rows."""

    def record_compaction(self, rows: CompactionRows) -> GenerationRecord:
        """Write ``rows`` in one transaction; returns the session's generation record."""
        with self.transaction():
            self.record_summaries(rows.session_id, rows.snapshot_id, rows.summaries, rows.created_at)
            generation = self.record_generation(rows.session_id, block_len=rows.block_len,
                                                block_digest=rows.block_digest, op_id=rows.end.op_id,
                                                snapshot_id=rows.snapshot_id)
            self.end_compression(rows.end)
        return generation
