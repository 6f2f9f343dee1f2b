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


def _jsonable(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict):
        message = {"role": getattr(message, "role", None), "content": getattr(message, "content", None)}
    return json.loads(json.dumps(message, default=str))


class GuardStore:
    """Thread-safe access to the ``session_guard_*`` tables of one state.db."""

    def __init__(self, db_path: Path | str, *, timeout: float = 30.0) -> None:
        self.db_path = Path(db_path)
        self._timeout = timeout
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._wal = False
        self._synchronous = 2

    # -- connection -----------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self.db_path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                str(self.db_path), timeout=self._timeout, check_same_thread=False, isolation_level=None
            )
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
            self._wal = bool(mode) and str(mode[0]).lower() == "wal"
            self._synchronous = int(conn.execute("PRAGMA synchronous").fetchone()[0])
            conn.execute(f"PRAGMA busy_timeout={int(self._timeout * 1000)}")
            conn.executescript(_SCHEMA)
            conn.execute(
                "INSERT OR IGNORE INTO session_guard_meta(key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
            self._conn = conn
        return self._conn

    @contextmanager
    def transaction(self, *, wait_for_disk: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction. By default the commit waits until the data is on disk.
        ``wait_for_disk=False`` (WAL only, ``synchronous=NORMAL`` for this commit) survives a
        process crash but a power loss may roll it back; use it only for changes the guard
        can re-derive (the next full commit or checkpoint makes it durable too)."""
        with self._lock:
            conn = self._connect()
            relaxed = not wait_for_disk and self._wal and self._synchronous > 1
            if relaxed:
                conn.execute("PRAGMA synchronous=NORMAL")
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                else:
                    conn.execute("COMMIT")
            finally:
                if relaxed:
                    conn.execute(f"PRAGMA synchronous={self._synchronous}")

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
        rows = []
        for pos, msg in enumerate(messages):
            data = _jsonable(msg)
            rows.append(
                (snapshot_id, pos, data.get("role"), message_text(data), json.dumps(data, ensure_ascii=False))
            )
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
            "SELECT m.message_json FROM session_guard_snapshot_messages m"
            " JOIN session_guard_snapshots s ON s.snapshot_id = m.snapshot_id"
            " WHERE m.snapshot_id = ?"
        )
        params: tuple[Any, ...] = (snapshot_id,)
        if session_id is not None:
            query += " AND s.session_id = ?"
            params += (session_id,)
        with self.reading() as conn:
            rows = conn.execute(query + " ORDER BY m.position", params).fetchall()
        return [json.loads(r[0]) for r in rows]

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
