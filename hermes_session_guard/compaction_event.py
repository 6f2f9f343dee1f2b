"""The compaction event: what clients, traces and metrics are told about one guarded
compaction (docs/events.md). At the bottom layer: the seams that raise it, the hook that
passes it on (``hooks/specs.py`` re-exports it for extensions), the host's client streams
and telemetry all read it, and it imports nothing of the guard's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The names of the compaction events (docs/events.md): one at the start of each guarded
# compaction, one at its end.
COMPACTION_STARTED = "compaction.started"
COMPACTION_COMPLETED = "compaction.completed"
COMPACTION_FAILED = "compaction.failed"
COMPACTION_SKIPPED = "compaction.skipped"
COMPACTION_EVENTS = (COMPACTION_STARTED, COMPACTION_COMPLETED, COMPACTION_FAILED, COMPACTION_SKIPPED)


@dataclass(frozen=True)
class CompactionEvent:
    """What clients, traces and metrics are told about one guarded compaction: ids,
    counts, durations and reasons, never message text. ``name`` is one of
    ``COMPACTION_EVENTS``; ``outcome`` the recorded one at the end (``done``,
    ``adopted``, ``skipped``, ``failed``), None at the start. Durations in ms."""

    name: str
    session_id: str
    op_id: str
    strategy: str
    release: str | None
    messages_before: int
    messages_after: int | None = None
    summary_chars: int | None = None
    snapshot_id: str | None = None
    outcome: str | None = None
    reason: str | None = None
    error_type: str | None = None
    duration_ms: float | None = None
    summary_ms: float | None = None
    lock_wait_ms: float | None = None
    messages_buffered: int | None = None  # messages that arrived meanwhile and were held back (end)

    @property
    def ended(self) -> bool:
        return self.name != COMPACTION_STARTED

    def fields(self) -> dict[str, Any]:
        """The event as a dict without the fields that do not apply (None)."""
        return {k: v for k, v in self.__dict__.items() if v is not None}
