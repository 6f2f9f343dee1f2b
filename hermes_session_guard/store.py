"""The guard's own storage: ``session_guard_*`` tables inside Hermes's state.db.

Hermes's own tables are never altered: the guard only creates and writes tables
whose names start with ``session_guard_``. It opens its own connection (WAL is
already on for state.db), so it works whether or not an agent has a SessionDB.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1

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


def _row_parts(message: Any) -> tuple[Any, str | None, str]:
    """(role, text, json of the rest). A string ``content`` is stored once, in the
    ``content`` column (searchable), and left out of ``message_json``."""
    if not isinstance(message, dict):
        message = {"role": getattr(message, "role", None), "content": getattr(message, "content", None)}
    content = message.get("content")
    if isinstance(content, str):
        rest = {k: v for k, v in message.items() if k != "content"}
        return message.get("role"), content, json.dumps(rest, ensure_ascii=False, default=str)
    return message.get("role"), message_text(message), json.dumps(message, ensure_ascii=False, default=str)


def _row_message(message_json: str, content: str | None) -> dict[str, Any]:
    msg = json.loads(message_json)
    if "content" not in msg:
        msg["content"] = content
    return msg


class GuardStore:
    """Thread-safe access to the ``session_guard_*`` tables of one state.db."""

    def __init__(self, db_path: Path | str, *, timeout: float = 30.0) -> None:
        self.db_path = Path(db_path)
        self._timeout = timeout
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None

    # -- connection -----------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self.db_path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                str(self.db_path), timeout=self._timeout, check_same_thread=False, isolation_level=None
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA busy_timeout={int(self._timeout * 1000)}")
            conn.executescript(_SCHEMA)
            conn.execute(
                "INSERT OR IGNORE INTO session_guard_meta(key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
            self._conn = conn
        return self._conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connect()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            else:
                conn.execute("COMMIT")

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
    ) -> SnapshotInfo:
        """Store ``messages`` verbatim under ``snapshot_id``. Snapshots are immutable:
        writing an existing id raises ``sqlite3.IntegrityError``."""
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
        return info

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

    # -- repairs --------------------------------------------------------------------
    def record_repair(self, *, op_id: str, session_id: str, record: dict[str, Any],
                      backup_path: str | None = None) -> None:
        """Remember what ``repair --apply`` did to one lineage (the original session
        rows it re-marked, the snapshots it wrote, where routing pointed)."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO session_guard_repairs(op_id, session_id, created_at, backup_path, record_json)"
                " VALUES (?,?,?,?,?)",
                (op_id, session_id, time.time(), backup_path, json.dumps(record, ensure_ascii=False, default=str)),
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
