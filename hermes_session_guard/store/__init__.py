"""The guard's own storage: ``session_guard_*`` tables inside Hermes's state.db.

Hermes's own tables are never altered, nor named: the guard only creates, writes
and reads tables whose names start with ``session_guard_`` (a unit test checks
every SQL string here). It opens its own connection (in the journal mode Hermes
gave state.db), so it works whether or not an agent has a SessionDB.

- :mod:`.connection`: the connection, write transactions, reads, pragmas, file mode;
- :mod:`.schema`: the DDL and the schema version;
- one repository per table family, each a :class:`~.connection.StoreConnection`
  working through ``transaction()``/``reading()``: :mod:`.snapshots`,
  :mod:`.text_index` (the one full-text index, for recall and search), :mod:`.summaries`, :mod:`.compressions`
  (compressions and repairs), :mod:`.handoffs`, :mod:`.leases`, :mod:`.generations`;
  :mod:`.compaction` (one compaction's summaries, generation and outcome rows, in one commit);
  the inbox's queries live in :mod:`hermes_session_guard.inbox` over the same
  ``transaction()``;
- :mod:`.rows`: how a message is stored in a row, and text hashes.

:class:`GuardStore` is all of them over one connection.
"""

from __future__ import annotations

from .compaction import CompactionRepository, CompactionRows
from .compressions import CompressionEnd, CompressionStart
from .connection import database_key
from .generations import GenerationRecord
from .handoffs import HandoffRepository
from .leases import LeaseRepository
from .rows import _row_message, message_text, text_hash
from .schema import LOCK_TABLE
from .snapshots import (
    SnapshotGone,
    SnapshotInfo,
    SnapshotRepository,
    content_digest,
    read_snapshot_counts,
    read_snapshot_infos,
    read_snapshot_references,
    reference_problem,
    snapshots_recorded,
)
from .text_index import RecallDoc, index_body


class GuardStore(
    SnapshotRepository,
    CompactionRepository,
    HandoffRepository,
    LeaseRepository,
):
    """Thread-safe access to the ``session_guard_*`` tables of one state.db: every
    repository over one :class:`StoreConnection` (one connection, one lock)."""


__all__ = [
    "LOCK_TABLE",
    "CompactionRows",
    "CompressionEnd",
    "CompressionStart",
    "GenerationRecord",
    "GuardStore",
    "RecallDoc",
    "SnapshotGone",
    "SnapshotInfo",
    "_row_message",
    "content_digest",
    "database_key",
    "index_body",
    "message_text",
    "read_snapshot_counts",
    "read_snapshot_infos",
    "read_snapshot_references",
    "reference_problem",
    "snapshots_recorded",
    "text_hash",
]
