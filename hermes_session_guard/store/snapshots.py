"""The guard's own storage: ``session_guard_*`` tables inside Hermes's state.db.

Hermes's own tables are never altered: the guard only creates and writes tables
whose names start with ``session_guard_``. It opens its own connection (WAL is
already on for state.db), so it works whether or not an agent has a SessionDB.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..file_modes import create_private, make_private_dirs
from ..safe_text import encodable, json_text, searchable, utf8_bytes

log = logging.getLogger("hermes_session_guard")

# 1: snapshots, compressions, repairs, hand-offs (a snapshot message's string
#    content is stored once, in ``content``; older rows also carry it in
#    ``message_json``, and both read back the same).
# 2: two independent layouts carried this number: one added summaries and the
#    recall index, the other the compression leases and compaction generations.
# 3: all of them.
# 4: adds the inbox of messages buffered while a session compresses
#    (``session_guard_inbox``; a layout that already had it carried 1).
# Every table is created if missing on connect, so a file from any earlier layout
# gains what it lacks.
SCHEMA_VERSION = 4

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
CREATE TABLE IF NOT EXISTS session_guard_recall_docs (
    doc_id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL,
    source TEXT NOT NULL,
    ref TEXT NOT NULL,
    position INTEGER NOT NULL,
    role TEXT,
    content_hash TEXT NOT NULL,
    host_row_id INTEGER,
    UNIQUE (session_id, content_hash)
);
CREATE TABLE IF NOT EXISTS session_guard_recall_indexed (
    snapshot_id TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS session_guard_recall_sources (
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

# Contentless full-text index over the recall documents (the text itself stays in
# the snapshot tables / Hermes's rows). ``scope`` holds one token per session so a
# query can only ever match documents of the sessions it names.
_FTS_SCHEMA = """
CREATE VIRTUAL TABLE IF NOT EXISTS session_guard_recall_fts USING fts5(
    scope, body, content='', tokenize='porter unicode61'
);
CREATE VIRTUAL TABLE IF NOT EXISTS session_guard_recall_vocab USING fts5vocab(session_guard_recall_fts, 'row');
"""


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


def message_text(message: dict[str, Any]) -> str | None:
    """The text of a message's content (list-of-parts content joined)."""
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p]
        return "\n".join(parts)
    return str(content)


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def text_hash(text: str | None) -> str:
    """Stable identity of a message text (surrounding whitespace ignored: the host
    strips some rows when it loads them)."""
    return hashlib.sha256(utf8_bytes((text or "").strip())).hexdigest()[:32]


def scope_token(session_id: str) -> str:
    """The full-text token standing for one session (letters and digits only, so
    no tokenizer splits or stems it into something another session shares)."""
    return "sg" + hashlib.sha256(session_id.encode("utf-8")).hexdigest()[:20] + "z"


@dataclass(frozen=True)
class RecallDoc:
    """One indexed passage: where its first occurrence in the conversation is."""

    doc_id: int
    session_id: str
    source: str  # "snapshot" | "archived"
    ref: str  # snapshot id, or the Hermes session id for archived rows
    position: int  # 1-based turn within ``ref``
    role: str | None
    host_row_id: int | None
    score: float = 0.0
    message: dict[str, Any] | None = None  # the snapshot message, fetched with the match


IndexText = Callable[[dict[str, Any]], str | None]

_stem_lock = threading.Lock()
_stem_conn: sqlite3.Connection | None = None
_stem_cache: dict[str, str] = {}


def porter_stems(words: Iterable[str]) -> dict[str, str]:
    """``word -> term`` as the recall index's tokenizer (porter unicode61) stores it,
    computed by SQLite itself so lookups in the vocabulary table line up."""
    global _stem_conn
    words = [w for w in words if w]
    missing = [w for w in dict.fromkeys(words) if w not in _stem_cache]
    if missing:
        with _stem_lock:
            try:
                if _stem_conn is None:
                    conn = sqlite3.connect(":memory:", check_same_thread=False)
                    conn.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize='porter unicode61')")
                    conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
                    _stem_conn = conn
                for w in missing:
                    _stem_conn.execute("INSERT INTO t(rowid, x) VALUES (1, ?)", (w,))
                    row = _stem_conn.execute("SELECT term FROM v LIMIT 1").fetchone()
                    _stem_conn.execute("DELETE FROM t")
                    _stem_cache[w] = row[0] if row else w.lower()
            except sqlite3.Error:
                for w in missing:
                    _stem_cache.setdefault(w, w.lower())
    return {w: _stem_cache[w] for w in words}


def _has_table(conn: sqlite3.Connection, table: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
    return row is not None


def read_snapshot_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Snapshots per session through any (read-only) connection; empty when the
    guard never wrote to this database."""
    if not _has_table(conn, "session_guard_snapshots"):
        return {}
    rows = conn.execute("SELECT session_id, COUNT(*) FROM session_guard_snapshots GROUP BY session_id")
    return {str(sid): int(n) for sid, n in rows}


def _row_parts(message: Any) -> tuple[str | None, str | None, str]:
    """(role, text, json of the rest). A string ``content`` is stored once, in the
    ``content`` column (searchable), and left out of ``message_json``."""
    if not isinstance(message, dict):
        message = {"role": getattr(message, "role", None), "content": getattr(message, "content", None)}
    content = message.get("content")
    role = _text_or_none(message.get("role"))
    role = None if role is None else searchable(role)
    if isinstance(content, str) and encodable(content):
        rest = {k: v for k, v in message.items() if k != "content"}
        return role, content, json_text(rest)
    # Not a plain UTF-8 string (list-of-parts content, or text holding lone surrogates):
    # the whole message goes into the JSON, verbatim (escaped where UTF-8 cannot carry
    # it, see safe_text); the content column keeps a searchable copy.
    text = message_text(message)
    return role, None if text is None else searchable(text), json_text(message)


def _row_message(message_json: str, content: str | None) -> dict[str, Any]:
    msg = json.loads(message_json)
    if "content" not in msg:
        msg["content"] = content
    return msg


def _use_wal(conn: sqlite3.Connection, timeout: float) -> str:
    """Switch the file to WAL (a no-op once it is) and return the journal mode it
    has now. The switch needs the file to itself and SQLite answers "database is
    locked" at once, without its busy handler, while another connection opens a
    fresh file at the same moment; so retry within the connection's own timeout."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            row = conn.execute("PRAGMA journal_mode=WAL").fetchone()
            return str(row[0]) if row else ""
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def _read_only_error(exc: BaseException) -> bool:
    """SQLITE_READONLY: the file (or the connection) cannot be written."""
    return "readonly" in str(exc).lower() or "read-only" in str(exc).lower()


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


class GuardStore:
    """Thread-safe access to the ``session_guard_*`` tables of one state.db."""

    def __init__(self, db_path: Path | str, *, timeout: float = 30.0) -> None:
        self.db_path = Path(db_path)
        self._timeout = timeout
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self.fts = True
        # Document frequencies change only when passages are indexed; other processes
        # indexing the same file are picked up after a short while.
        self._df: dict[str, int] = {}
        self._df_at = 0.0
        self._wal = False
        self._synchronous = 2  # the connection's own level once set up (see _connect)
        self._opened_read_only = False  # the connection was opened while the file was read-only

    # -- connection -----------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            make_private_dirs(self.db_path.parent)
            if not self.db_path.exists():  # a state.db the guard creates is 0600 (its -wal/-shm follow)
                try:
                    create_private(self.db_path)
                except OSError:
                    pass  # created meanwhile, or not creatable: SQLite says which below
            conn = sqlite3.connect(
                str(self.db_path), timeout=self._timeout, check_same_thread=False, isolation_level=None
            )
            conn.execute(f"PRAGMA busy_timeout={int(self._timeout * 1000)}")
            self._wal = _use_wal(conn, self._timeout).lower() == "wal"
            if sys.platform != "darwin" and self._wal:
                # No fsync per commit: leases and generation records are short-lived, and a
                # snapshot is always committed before the Hermes write that replaces the rows
                # it keeps, whose own (synchronous) commit makes the earlier WAL frames durable.
                # A power cut can lose at most the latest bookkeeping rows (summary tags,
                # recall index, hand-off records, inbox state changes the startup replay
                # re-derives), never a snapshot of rows Hermes replaced. A commit that must be
                # on disk before the guard tells anyone (a buffered message's receipt) asks
                # for it: see transaction(). macOS keeps FULL, as Hermes does there.
                conn.execute("PRAGMA synchronous=NORMAL")
            self._synchronous = int(conn.execute("PRAGMA synchronous").fetchone()[0])
            conn.executescript(_SCHEMA)
            try:
                conn.executescript(_FTS_SCHEMA)
                self.fts = True
            except sqlite3.OperationalError as exc:  # an SQLite built without FTS5
                log.warning("session guard: SQLite has no FTS5 (%s); recall falls back to a slower scan", exc)
                self.fts = False
            try:
                conn.execute(
                    "INSERT INTO session_guard_meta(key, value) VALUES ('schema_version', ?)"
                    " ON CONFLICT(key) DO UPDATE SET value = excluded.value"
                    " WHERE CAST(value AS INTEGER) < CAST(excluded.value AS INTEGER)",
                    (str(SCHEMA_VERSION),),
                )
            except sqlite3.OperationalError as exc:
                if not _read_only_error(exc):
                    conn.close()
                    raise
                # Opened on a read-only file: the guard's tables can still be read
                # (recall, status). Every write fails on its own (its caller reports it)
                # and drops this connection, so the guard writes again once the file is
                # writable.
                log.debug("session guard: %s opened read-only (%s)", self.db_path, exc)
                self._opened_read_only = True
            else:
                self._opened_read_only = False
            self._conn = conn
        return self._conn

    def _rollback(self, conn: sqlite3.Connection) -> None:
        """Roll back what is left of a failed transaction. SQLite may already have
        rolled it back itself (a full disk, an I/O error); a rollback that fails
        leaves the connection unusable, so it is dropped and reopened on next use."""
        if not conn.in_transaction:
            return
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            log.debug("session guard: rollback failed (%s); reopening the connection", exc)
            self._drop_connection()

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except sqlite3.Error:
                pass

    @contextmanager
    def transaction(self, *, wait_for_disk: bool | None = None) -> Iterator[sqlite3.Connection]:
        """One write transaction, committed at the connection's own level (see _connect).
        ``wait_for_disk=True`` makes this commit wait until the data is on disk
        (``synchronous=FULL`` for it): for a promise made right after it, such as a
        buffered message's receipt. ``wait_for_disk=False`` (WAL only,
        ``synchronous=NORMAL`` for it) survives a process crash but a power loss may
        roll it back; only for changes the guard can re-derive (the next synchronous
        commit or checkpoint makes it durable too)."""
        with self._lock:
            if self._opened_read_only:
                self._drop_connection()  # the file may be writable again: a fresh connection can tell
            conn = self._connect()
            level = self._synchronous
            if wait_for_disk is True and level < 2:
                level = 2
            elif wait_for_disk is False and self._wal and level > 1:
                level = 1
            changed = level != self._synchronous
            if changed:
                conn.execute(f"PRAGMA synchronous={level}")
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    # The error that failed the transaction is the one to report,
                    # never a rollback's "no transaction is active".
                    self._rollback(conn)
                    raise
            except sqlite3.Error as exc:
                if _read_only_error(exc):
                    # A connection opened on a read-only file never writes again.
                    self._drop_connection()
                raise
            finally:
                if changed and self._conn is conn:
                    try:
                        conn.execute(f"PRAGMA synchronous={self._synchronous}")
                    except sqlite3.Error:
                        self._drop_connection()

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._connect()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- snapshots ------------------------------------------------------------------
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

    def _index_snapshot(
        self, conn: sqlite3.Connection, session_id: str, snapshot_id: str, first_turn: int,
        rows: list[tuple[str | None, str | None, str]], index_text: IndexText,
    ) -> None:
        """Index ``(role, content, message_json)`` rows of one snapshot."""
        docs = []
        for pos, (role, content, raw) in enumerate(rows):
            text = index_text(_row_message(raw, content))
            if text:
                docs.append((first_turn + pos, role, text, None))
        self._index(conn, session_id, "snapshot", snapshot_id, docs)
        conn.execute("INSERT OR IGNORE INTO session_guard_recall_indexed(snapshot_id) VALUES (?)", (snapshot_id,))

    def index_missing_snapshots(self, session_ids: Iterable[str] | None, index_text: IndexText) -> int:
        """Index snapshots that never entered the recall index (written without
        ``index_text``: by a compression, which leaves indexing to the first recall, or
        by an older guard), of these sessions or, with ``None``, of every session.
        Returns how many were indexed."""
        where, params = "", ()
        if session_ids is not None:
            ids = list(session_ids)
            if not ids:
                return 0
            where, params = f"session_id IN ({','.join('?' for _ in ids)}) AND ", tuple(ids)
        with self.reading() as conn:
            todo = conn.execute(
                "SELECT snapshot_id, session_id, COALESCE(first_turn, 1) FROM session_guard_snapshots"
                f" WHERE {where}snapshot_id NOT IN"
                " (SELECT snapshot_id FROM session_guard_recall_indexed) ORDER BY created_at, snapshot_id",
                params,
            ).fetchall()
        done = 0
        for snapshot_id, session_id, first in todo:
            with self.transaction() as conn:
                if conn.execute("SELECT 1 FROM session_guard_recall_indexed WHERE snapshot_id = ?",
                                (snapshot_id,)).fetchone():
                    continue  # another process's recall indexed it meanwhile
                rows = conn.execute(
                    "SELECT role, content, message_json FROM session_guard_snapshot_messages WHERE snapshot_id = ?"
                    " ORDER BY position", (snapshot_id,),
                ).fetchall()
                self._index_snapshot(conn, session_id, snapshot_id, first, rows, index_text)
            done += 1
        return done

    # -- recall index -----------------------------------------------------------------
    def _index(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        source: str,
        ref: str,
        docs: Iterable[tuple[int, str | None, str, int | None]],
    ) -> int:
        """Add ``(position, role, text, host_row_id)`` passages of ``session_id``; a text
        already indexed for that session keeps its first occurrence."""
        scope = scope_token(session_id)
        added = 0
        for position, role, text, host_row_id in docs:
            cur = conn.execute(
                "INSERT OR IGNORE INTO session_guard_recall_docs(session_id, source, ref, position, role,"
                " content_hash, host_row_id) VALUES (?,?,?,?,?,?,?)",
                (session_id, source, ref, position, role, text_hash(text), host_row_id),
            )
            if cur.rowcount and self.fts:
                conn.execute(
                    "INSERT INTO session_guard_recall_fts(rowid, scope, body) VALUES (?,?,?)",
                    (cur.lastrowid, scope, searchable(text)),
                )
            added += cur.rowcount or 0
        if added:
            self._df.clear()
        return added

    def index_archived(
        self, session_id: str, host_session_id: str, turns: Iterable[tuple[int, int, str, str]],
        index_text: Callable[[str], str | None], seen_row_id: int,
    ) -> int:
        """Index Hermes rows ``(host_row_id, turn, role, content)`` of ``host_session_id``
        (the session itself or a compression ancestor) for ``session_id``'s recall."""
        docs = []
        for row_id, turn, role, content in turns:
            text = index_text(content)
            if text:
                docs.append((turn, role, text, row_id))
        with self.transaction() as conn:
            added = self._index(conn, host_session_id, "archived", host_session_id, docs)
            conn.execute(
                "INSERT INTO session_guard_recall_sources(session_id, host_session_id, seen_row_id) VALUES (?,?,?)"
                " ON CONFLICT(session_id, host_session_id) DO UPDATE SET seen_row_id = excluded.seen_row_id",
                (session_id, host_session_id, seen_row_id),
            )
        return added

    def archived_seen(self, session_id: str, host_session_id: str) -> int:
        with self.reading() as conn:
            row = conn.execute(
                "SELECT seen_row_id FROM session_guard_recall_sources WHERE session_id = ? AND host_session_id = ?",
                (session_id, host_session_id),
            ).fetchone()
        return int(row[0]) if row else 0

    _DF_TTL = 30.0

    def _df_fresh(self) -> None:
        if time.monotonic() - self._df_at > self._DF_TTL:
            self._df.clear()
            self._df_at = time.monotonic()

    def doc_count(self) -> int:
        self._df_fresh()
        if " docs" not in self._df:
            with self.reading() as conn:
                row = conn.execute("SELECT MAX(doc_id) FROM session_guard_recall_docs").fetchone()
            self._df[" docs"] = int(row[0] or 0)
        return self._df[" docs"]

    def term_document_counts(self, terms: Iterable[str]) -> dict[str, int]:
        """How many indexed passages (all sessions) contain each already-stemmed term."""
        terms = [t for t in dict.fromkeys(terms) if t and not t.startswith(" ")]
        if not terms or not self.fts:
            return {}
        self._df_fresh()
        missing = [t for t in terms if t not in self._df]
        if missing:
            with self.reading() as conn:
                for term in missing:
                    row = conn.execute(
                        "SELECT doc FROM session_guard_recall_vocab WHERE term = ?", (term,)
                    ).fetchone()
                    self._df[term] = int(row[0]) if row else 0
        return {t: self._df[t] for t in terms if self._df[t]}

    def search_docs(
        self, session_ids: list[str], match_body: str, limit: int, exclude: set[int] | None = None
    ) -> list[RecallDoc]:
        """Passages of ``session_ids`` matching the FTS5 body expression ``match_body``
        (built by the caller from sanitised words), best first, with their snapshot
        message. ``exclude`` are doc ids the caller already has."""
        if not session_ids or not match_body:
            return []
        scopes = " OR ".join(f'"{scope_token(s)}"' for s in session_ids)
        expr = f"scope:({scopes}) AND body:({match_body})"
        skip = len(exclude or ())
        with self.reading() as conn:
            rows = conn.execute(
                "SELECT d.doc_id, d.session_id, d.source, d.ref, d.position, d.role, d.host_row_id, f.score,"
                " m.message_json, m.content"
                " FROM (SELECT rowid AS id, bm25(session_guard_recall_fts, 0.0, 1.0) AS score"
                "       FROM session_guard_recall_fts WHERE session_guard_recall_fts MATCH ?"
                "       ORDER BY score LIMIT ?) AS f"
                " JOIN session_guard_recall_docs d ON d.doc_id = f.id"
                " LEFT JOIN session_guard_snapshots s ON d.source = 'snapshot' AND s.snapshot_id = d.ref"
                " LEFT JOIN session_guard_snapshot_messages m"
                "   ON m.snapshot_id = s.snapshot_id AND m.position = d.position - COALESCE(s.first_turn, 1)"
                " ORDER BY f.score",
                (expr, limit + skip),
            ).fetchall()
        allowed = set(session_ids)
        docs = [
            RecallDoc(*row[:8], message=None if row[8] is None else _row_message(row[8], row[9]))
            for row in rows if row[1] in allowed and row[0] not in (exclude or ())
        ]
        return docs[:limit]

    def scan_docs(self, session_ids: list[str], words: list[str], limit: int) -> list[RecallDoc]:
        """The no-FTS5 fallback: snapshot passages containing any of ``words``."""
        if not session_ids or not words:
            return []
        marks = ",".join("?" for _ in session_ids)
        like = " OR ".join("lower(m.content) LIKE ?" for _ in words)
        with self.reading() as conn:
            rows = conn.execute(
                "SELECT d.doc_id, d.session_id, d.source, d.ref, d.position, d.role, d.host_row_id, 0.0"
                " FROM session_guard_recall_docs d JOIN session_guard_snapshot_messages m"
                " ON d.source = 'snapshot' AND m.snapshot_id = d.ref AND m.position = d.position - 1"
                f" WHERE d.session_id IN ({marks}) AND ({like}) LIMIT ?",
                (*session_ids, *[f"%{w}%" for w in words], limit),
            ).fetchall()
        return [RecallDoc(*row) for row in rows]

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

    # -- summaries -----------------------------------------------------------------
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
        with self.reading() as conn:
            rows = conn.execute(
                "SELECT snapshot_id, MIN(first_turn), MAX(last_turn) FROM session_guard_summaries"
                f" WHERE session_id IN ({marks}) AND snapshot_id IS NOT NULL AND first_turn IS NOT NULL"
                " GROUP BY snapshot_id", ids,
            ).fetchall()
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

    # -- compression operations (for crash recovery and status) ---------------------
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

    def clear_expired_lock(self, *, table: str, session_column: str, expires_column: str, session_id: str,
                           now: float) -> bool:
        """Delete one expired row of one of the guard's own lock tables."""
        if not table.startswith("session_guard_"):
            raise ValueError(f"{table} is not a session guard table")
        with self.transaction() as conn:
            cur = conn.execute(
                f"DELETE FROM {table} WHERE {session_column} = ? AND {expires_column} < ?", (session_id, now)
            )
        return cur.rowcount > 0

    def clear_lock_of(self, *, table: str, session_column: str, holder_column: str, session_id: str,
                      holder: str) -> bool:
        """Delete one row of one of the guard's own lock tables, only while ``holder`` holds it."""
        if not table.startswith("session_guard_"):
            raise ValueError(f"{table} is not a session guard table")
        with self.transaction() as conn:
            cur = conn.execute(
                f"DELETE FROM {table} WHERE {session_column} = ? AND {holder_column} = ?", (session_id, holder)
            )
        return cur.rowcount > 0

    def compression_count(self, session_id: str, since: float | None = None) -> int:
        """Compressions of ``session_id`` that stored a snapshot (after ``since``)."""
        with self.reading() as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM session_guard_snapshots WHERE session_id = ? AND reason = 'compression'"
                " AND created_at > ?",
                (session_id, -1.0 if since is None else since),
            ).fetchone()
        return int(row[0])

    # -- hand-offs ------------------------------------------------------------------
    def lineage_root(self, session_id: str) -> str:
        """The first session of the hand-off chain ``session_id`` belongs to."""
        with self.reading() as conn:
            row = conn.execute(
                "SELECT lineage_root FROM session_guard_handoffs WHERE child_session_id = ? AND status = 'done'",
                (session_id,),
            ).fetchone()
        return str(row[0]) if row else session_id

    def last_auto_handoff_at(self, parent_session_id: str) -> float | None:
        with self.reading() as conn:
            row = conn.execute(
                "SELECT MAX(created_at) FROM session_guard_handoffs WHERE parent_session_id = ?"
                " AND seq IS NOT NULL AND status = 'done'",
                (parent_session_id,),
            ).fetchone()
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
        with self.reading() as conn:
            rows = conn.execute(query + " ORDER BY created_at, handoff_id", params).fetchall()
        return [HandoffRecord(*row) for row in rows]

    # -- compression leases (cross-process, see session_lock) -----------------------
    def try_acquire_lease(self, session_id: str, holder: str, ttl_seconds: float, now: float | None = None) -> bool:
        """Take the lease on ``session_id`` for ``holder`` unless someone else holds an
        unexpired one; an expired lease (its holder crashed) is taken over."""
        now = time.time() if now is None else now
        with self.transaction() as conn:
            conn.execute(
                "DELETE FROM session_guard_locks WHERE session_id = ? AND expires_at < ?", (session_id, now)
            )
            conn.execute(
                "INSERT OR IGNORE INTO session_guard_locks(session_id, holder, acquired_at, expires_at)"
                " VALUES (?,?,?,?)",
                (session_id, holder, now, now + ttl_seconds),
            )
            row = conn.execute(
                "SELECT holder FROM session_guard_locks WHERE session_id = ?", (session_id,)
            ).fetchone()
        return row is not None and row[0] == holder

    def refresh_lease(self, session_id: str, holder: str, ttl_seconds: float, now: float | None = None) -> bool:
        """Extend ``holder``'s lease; False if it expired or belongs to someone else now."""
        now = time.time() if now is None else now
        with self.transaction() as conn:
            cur = conn.execute(
                "UPDATE session_guard_locks SET expires_at = ?"
                " WHERE session_id = ? AND holder = ? AND expires_at >= ?",
                (now + ttl_seconds, session_id, holder, now),
            )
        return cur.rowcount > 0

    def release_lease(self, session_id: str, holder: str) -> bool:
        """Drop the lease if ``holder`` still owns it (a late holder never frees a successor's)."""
        with self.transaction() as conn:
            cur = conn.execute(
                "DELETE FROM session_guard_locks WHERE session_id = ? AND holder = ?", (session_id, holder)
            )
        return cur.rowcount > 0

    def lease_holder(self, session_id: str, now: float | None = None) -> str | None:
        """Who holds an unexpired lease on ``session_id``, if anyone."""
        now = time.time() if now is None else now
        with self.reading() as conn:
            row = conn.execute(
                "SELECT holder FROM session_guard_locks WHERE session_id = ? AND expires_at >= ?",
                (session_id, now),
            ).fetchone()
        return row[0] if row else None

    # -- compaction generations -----------------------------------------------------
    def generation(self, session_id: str) -> GenerationRecord | None:
        with self.reading() as conn:
            row = conn.execute(
                "SELECT session_id, generation, block_len, block_digest, op_id, snapshot_id, updated_at"
                " FROM session_guard_generations WHERE session_id = ?",
                (session_id,),
            ).fetchone()
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
            row = conn.execute(
                "SELECT session_id, generation, block_len, block_digest, op_id, snapshot_id, updated_at"
                " FROM session_guard_generations WHERE session_id = ?",
                (session_id,),
            ).fetchone()
        return GenerationRecord(*row)
