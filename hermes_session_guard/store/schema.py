"""The DDL of the guard's own ``session_guard_*`` tables: all of it, here (most created
if missing on connect; a few where they are first needed, below).

Only tables whose names start with ``session_guard_`` are created here; Hermes's
own tables are never altered.
"""

from __future__ import annotations

import sqlite3

# 1: snapshots, compressions, repairs, hand-offs (a snapshot message's string
#    content is stored once, in ``content``; older rows also carry it in
#    ``message_json``, and both read back the same).
# 2: two independent layouts carried this number: one added summaries and the
#    recall index, the other the compression leases and compaction generations.
# 3: all of them.
# 4: adds the inbox of messages buffered while a session compresses
#    (``session_guard_inbox``; a layout that already had it carried 1).
# 5: adds snapshots by reference (``session_guard_snapshot_refs``): on hosts that keep
#    the pre-compaction rows themselves (native mode, 0.20+) a snapshot names the ids of
#    Hermes's own rows (``row_ranges``: ``first-last`` runs) instead of holding a copy.
# 6: adds the phase times of each compression to ``session_guard_compressions``
#    (``ADDED_COLUMNS``: who ran it, its strategy, when the lock was taken and the
#    summary call ran, the summary's length), so ``status --session`` lists each
#    compaction after the fact, one that crashed midway included.
# 7: one full-text index over the text the guard keeps (``session_guard_text_*``), serving
#    recall and Hermes's search seam, replaces the recall index and the search index
#    (``LEGACY_INDEX``, dropped on connect; the first search or recall builds the new one).
# Every table is created if missing on connect, and every column of ``ADDED_COLUMNS``
# added if missing, so a file from any earlier layout gains what it lacks.
SCHEMA_VERSION = 7

LOCK_TABLE = "session_guard_locks"  # the guard's own compression leases (see session_lock)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS session_guard_meta (
    key TEXT PRIMARY KEY,
    value TEXT
);
CREATE TABLE IF NOT EXISTS session_guard_snapshots (
    snapshot_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    op_id TEXT,
    created_at REAL NOT NULL,
    message_count INTEGER NOT NULL,
    first_turn INTEGER,
    last_turn INTEGER,
    reason TEXT,
    host_version TEXT,
    host_mode TEXT
);
CREATE INDEX IF NOT EXISTS idx_session_guard_snapshots_session
    ON session_guard_snapshots(session_id, created_at);
CREATE TABLE IF NOT EXISTS session_guard_snapshot_messages (
    snapshot_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    role TEXT,
    content TEXT,
    message_json TEXT NOT NULL,
    PRIMARY KEY (snapshot_id, position)
);
CREATE TABLE IF NOT EXISTS session_guard_snapshot_refs (
    snapshot_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    row_ranges TEXT NOT NULL,
    row_count INTEGER NOT NULL,
    content_digest TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS session_guard_compressions (
    op_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    snapshot_id TEXT,
    phase TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL,
    messages_before INTEGER,
    messages_after INTEGER,
    detail TEXT
);
CREATE INDEX IF NOT EXISTS idx_session_guard_compressions_session
    ON session_guard_compressions(session_id, started_at);
CREATE TABLE IF NOT EXISTS session_guard_locks (
    session_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS session_guard_generations (
    session_id TEXT PRIMARY KEY,
    generation INTEGER NOT NULL,
    block_len INTEGER NOT NULL,
    block_digest TEXT NOT NULL,
    op_id TEXT,
    snapshot_id TEXT,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS session_guard_repairs (
    op_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    backup_path TEXT,
    record_json TEXT NOT NULL,
    PRIMARY KEY (op_id, session_id)
);
CREATE TABLE IF NOT EXISTS session_guard_handoffs (
    handoff_id TEXT PRIMARY KEY,
    lineage_root TEXT NOT NULL,
    seq INTEGER,
    parent_session_id TEXT NOT NULL,
    child_session_id TEXT,
    mode TEXT NOT NULL,
    status TEXT NOT NULL,
    packet_path TEXT,
    op_id TEXT,
    created_at REAL NOT NULL,
    finished_at REAL,
    UNIQUE (lineage_root, seq)
);
CREATE INDEX IF NOT EXISTS idx_session_guard_handoffs_parent
    ON session_guard_handoffs(parent_session_id, created_at);
CREATE INDEX IF NOT EXISTS idx_session_guard_handoffs_child
    ON session_guard_handoffs(child_session_id);
CREATE TABLE IF NOT EXISTS session_guard_summaries (
    session_id TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    snapshot_id TEXT,
    position INTEGER,
    first_turn INTEGER,
    last_turn INTEGER,
    created_at REAL NOT NULL,
    PRIMARY KEY (session_id, content_hash)
);
CREATE TABLE IF NOT EXISTS session_guard_text_docs (
    doc_id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL,
    source TEXT NOT NULL,
    ref TEXT NOT NULL,
    position INTEGER NOT NULL,
    role TEXT,
    content_hash INTEGER NOT NULL,
    recall INTEGER NOT NULL,
    host_row_id INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS idx_session_guard_text_docs_recall
    ON session_guard_text_docs(session_id, content_hash) WHERE recall = 1;
CREATE TABLE IF NOT EXISTS session_guard_text_indexed (
    snapshot_id TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS session_guard_text_sources (
    session_id TEXT NOT NULL,
    host_session_id TEXT NOT NULL,
    seen_row_id INTEGER NOT NULL,
    PRIMARY KEY (session_id, host_session_id)
);
CREATE TABLE IF NOT EXISTS session_guard_inbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_key TEXT NOT NULL,
    session_id TEXT,
    op_id TEXT,
    position INTEGER NOT NULL,
    state TEXT NOT NULL,
    text TEXT,
    user_id TEXT,
    payload TEXT NOT NULL,
    buffered_at REAL NOT NULL,
    dispatched_at REAL,
    delivered_at REAL,
    owner TEXT
);
CREATE INDEX IF NOT EXISTS idx_session_guard_inbox_pending
    ON session_guard_inbox(session_key, state, seq);
"""

# The one full-text index over the text the guard keeps (text_index): every message of a
# snapshot copy, and for recall Hermes's own rows a snapshot names or the conversation's
# archived rows. Contentless (the text stays in the snapshot tables / Hermes's rows), the
# default tokenizer of Hermes's own ``messages_fts`` (unicode61). ``content`` is the text
# (the first column: its positions need no column marker, most of the index's bytes);
# ``scope`` holds one token of the conversation for a document recall may return (its
# first occurrence in that conversation), so a recall query can only ever match documents
# of the sessions it names; Hermes's search seam matches ``content`` alone.
TEXT_DOCS = "session_guard_text_docs"
TEXT_FTS = "session_guard_text_fts"
TEXT_VOCAB = "session_guard_text_vocab"
_FTS_SCHEMA = f"""
CREATE VIRTUAL TABLE IF NOT EXISTS {TEXT_FTS} USING fts5(content, scope, content='');
CREATE VIRTUAL TABLE IF NOT EXISTS {TEXT_VOCAB} USING fts5vocab({TEXT_FTS}, 'row');
"""

# The two indexes layout 6 and earlier kept over the same snapshot text (recall's, with a
# porter tokenizer, and one behind Hermes's search seam); dropped on connect, in this order.
LEGACY_INDEX = (
    ("table", "session_guard_recall_vocab"), ("table", "session_guard_recall_fts"),
    ("table", "session_guard_recall_docs"), ("table", "session_guard_recall_indexed"),
    ("table", "session_guard_recall_sources"), ("view", "session_guard_search_content"),
    ("table", "session_guard_search_fts"), ("table", "session_guard_search_docs"),
    ("table", "session_guard_search_indexed"),
)


# Columns added to a table after its first layout: (table, column, SQL type). Added on
# connect where missing (``ALTER TABLE ... ADD COLUMN``); readers treat them as optional.
ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("session_guard_compressions", "holder", "TEXT"),  # the process identity (locks.liveness) that ran it
    ("session_guard_compressions", "strategy", "TEXT"),
    ("session_guard_compressions", "lock_acquired_at", "REAL"),
    ("session_guard_compressions", "summary_started_at", "REAL"),  # Hermes's compression called
    ("session_guard_compressions", "summary_finished_at", "REAL"),  # its context engine returned
    ("session_guard_compressions", "summary_chars", "INTEGER"),  # total length of the new summaries
)


# Tables created where they are first needed, on a connection of their own, not on the
# store's connect: each is written by a process that may hold no store connection.

# One row per running guard process (locks.presence): what repair checks before it writes.
PROCESSES_TABLE = "session_guard_processes"
PROCESSES_DDL = (
    "CREATE TABLE IF NOT EXISTS session_guard_processes (identity TEXT PRIMARY KEY, pid INTEGER NOT NULL,"
    " kind TEXT NOT NULL, started_at REAL NOT NULL, heartbeat_at REAL NOT NULL)"
)

# The one ``repair --apply`` slot of a state.db (locks.repair_lock).
REPAIR_LOCK_DDL = (
    "CREATE TABLE IF NOT EXISTS session_guard_repair_lock (slot INTEGER PRIMARY KEY CHECK (slot = 1),"
    " holder TEXT NOT NULL, acquired_at REAL NOT NULL)"
)

# The guard's cross-process turn leases on 0.13-0.19 (locks.turn_lock).
TURN_TABLE = "session_guard_turn_locks"
TURN_DDL = """
CREATE TABLE IF NOT EXISTS session_guard_turn_locks (
    session_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
)"""


def add_missing_columns(conn: sqlite3.Connection) -> None:
    """Add the columns of ``ADDED_COLUMNS`` a file from an earlier layout lacks."""
    present: dict[str, set[str]] = {}
    for table, column, sql_type in ADDED_COLUMNS:
        if table not in present:
            present[table] = {str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")}
        if column not in present[table]:
            try:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}")
            except sqlite3.OperationalError as exc:
                if "duplicate column" not in str(exc):  # another process added it meanwhile
                    raise
            present[table].add(column)


def _has_table(conn: sqlite3.Connection, table: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
    return row is not None
