"""Read-only SQL over state.db for recall: the compression lineage, stored
turns and single messages, through one shared read-only connection per database."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from pathlib import Path
from typing import Any

from ..store.connection import connect, database_key

log = logging.getLogger("hermes_session_guard")


class _ReadOnly:
    """A shared read-only connection per state.db (one query at a time)."""

    def __init__(self, db_path: Path) -> None:
        self.conn = connect(db_path, read_only=True, any_thread=True)
        self.conn.execute("PRAGMA busy_timeout=5000")
        self.lock = threading.Lock()
        self._columns: dict[str, tuple[int, frozenset[str]]] = {}  # table -> (schema version, its columns)

    def columns(self, table: str) -> frozenset[str]:
        """The table's column names, read again only after a schema change (Hermes migrates
        state.db when it opens it; a compaction asks on every read)."""
        with self.lock:
            version = int(self.conn.execute("PRAGMA schema_version").fetchone()[0])
            known = self._columns.get(table)
            if known is None or known[0] != version:
                names = frozenset(r[1] for r in self.conn.execute(f"PRAGMA table_info({table})"))
                known = self._columns[table] = (version, names)
            return known[1]

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        with self.lock:
            return _Rows(self.conn.execute(sql, params).fetchall())


class _Rows(list[Any]):
    def fetchone(self) -> Any:
        return self[0] if self else None

    def fetchall(self) -> list[Any]:
        return list(self)


_readers: dict[Path, _ReadOnly] = {}
_readers_lock = threading.Lock()


def _read_only(db_path: Path) -> _ReadOnly:
    key = database_key(db_path)
    reader = _readers.get(key)
    if reader is not None:
        return reader
    with _readers_lock:
        reader = _readers.get(key)
        if reader is None:
            if not key.exists():
                raise sqlite3.OperationalError(f"no database at {key}")
            reader = _readers[key] = _ReadOnly(key)
        return reader


def close_readers() -> None:
    with _readers_lock:
        for reader in _readers.values():
            reader.conn.close()
        _readers.clear()


def compression_ancestors(db_path: Path, sid: str, limit: int = 64) -> list[str]:
    """Sessions this one continues after a host compression that rotated the id
    (before the guard was installed): parent links whose parent ended with
    ``end_reason = 'compression'``. Branches and other parents are not the same
    conversation and are not followed."""
    out: list[str] = []
    try:
        conn = _read_only(db_path)
    except sqlite3.Error:
        return out
    try:
        current = sid
        for _ in range(limit):
            row = conn.execute("SELECT parent_session_id FROM sessions WHERE id = ?", (current,)).fetchone()
            parent = row[0] if row else None
            if not parent or parent in out or parent == sid:
                break
            ended = conn.execute("SELECT end_reason FROM sessions WHERE id = ?", (parent,)).fetchone()
            if not ended or ended[0] != "compression":
                break
            out.append(parent)
            current = parent
    except sqlite3.Error as exc:
        log.debug("session guard: reading the session lineage failed: %s", exc)
    return out


def stored_turns(db_path: Path, sid: str, after_id: int, *, archived_only: bool) -> list[tuple[int, int, str, str]]:
    """``(host_row_id, turn, role, content)`` of a session's stored messages with an id
    above ``after_id``; ``turn`` is the 1-based position among all of the session's rows.
    With ``archived_only`` only rows the host compacted away in place are returned
    (``active = 0`` and ``compacted = 1``; rows the user rewound stay out)."""
    try:
        conn = _read_only(db_path)
    except sqlite3.Error:
        return []
    try:
        cols = conn.columns("messages")
        if archived_only and "active" not in cols:
            return []
        active = "active" if "active" in cols else "1"
        compacted = "compacted" if "compacted" in cols else "0"
        rows = conn.execute(
            f"SELECT id, role, content, {active}, {compacted} FROM messages WHERE session_id = ? ORDER BY id", (sid,)
        ).fetchall()
    except sqlite3.Error as exc:
        log.debug("session guard: reading stored turns failed: %s", exc)
        return []
    out = []
    for turn, (row_id, role, content, is_active, was_compacted) in enumerate(rows, 1):
        if row_id <= after_id or (archived_only and (is_active or not was_compacted)):
            continue
        out.append((row_id, turn, role or "", content if isinstance(content, str) else str(content or "")))
    return out


def last_row_id(db_path: Path, sid: str) -> int:
    try:
        row = _read_only(db_path).execute("SELECT MAX(id) FROM messages WHERE session_id = ?", (sid,)).fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0] or 0)


def stored_message(db_path: Path, row_id: int) -> str | None:
    return stored_messages(db_path, [row_id]).get(row_id)


def stored_messages(db_path: Path, row_ids: list[int]) -> dict[int, str]:
    """The stored ``content`` of these rows by id, in one read (rows that are gone, or a
    state.db that cannot be read, are missing from it)."""
    if not row_ids:
        return {}
    marks = ",".join("?" for _ in row_ids)
    try:
        rows = _read_only(db_path).execute(f"SELECT id, content FROM messages WHERE id IN ({marks})", tuple(row_ids))
    except sqlite3.Error:
        return {}
    return {int(row_id): content for row_id, content in rows}


def live_row_ranges(db_path: Path, sid: str) -> list[tuple[int, int]]:
    """The ids of a session's live (``active = 1``) rows as ``(first, last)`` runs; empty
    when it has none or the read fails. Native mode (0.20+) reads it when the context
    engine returns, after Hermes took its lock and watermark: the rows its commit
    summarises away or carries over, i.e. the transcript before this compaction."""
    try:
        # sorted here: without ORDER BY, SQLite reads the (session_id, active) index alone
        # (0.18.2+) instead of each row, whose ``active`` lies after its content
        ids = sorted(int(r[0]) for r in _read_only(db_path).execute(
            "SELECT id FROM messages WHERE session_id = ? AND active = 1", (sid,)))
    except sqlite3.Error as exc:
        log.debug("session guard: reading the live rows failed: %s", exc)
        return []
    return runs_of(ids)


def runs_of(ids: list[int]) -> list[tuple[int, int]]:
    """Ascending row ids as inclusive ``(first, last)`` runs of consecutive ids."""
    runs: list[tuple[int, int]] = []
    for row_id in ids:
        if runs and row_id == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], row_id)
        else:
            runs.append((row_id, row_id))
    return runs


def live_rows_brief(db_path: Path, sid: str, leave_out: tuple[str, ...]) -> list[tuple[Any, ...]] | None:
    """``(id, role, content, tool_call_id, display_metadata)`` of each of a session's live rows
    in id order: the columns that identify a message, straight from the table (no JSON
    decoded, no dict built). A row whose role is in ``leave_out`` comes with its id and role
    only (its text is not read). None when the read fails or the table lacks one of those
    columns (Hermes's loader is the way then)."""
    try:
        conn = _read_only(db_path)
        cols = conn.columns("messages")
        if not {"role", "content", "tool_call_id"} <= cols:
            return None
        meta = "display_metadata" if "display_metadata" in cols else "NULL"
        live = "AND active = 1" if "active" in cols else ""  # 0.13-0.17 keep no inactive rows
        marks = ",".join("?" for _ in leave_out) or "''"
        return sorted(conn.execute(  # by id: see live_row_ranges
            f"SELECT id, role, CASE WHEN role IN ({marks}) THEN NULL ELSE content END, tool_call_id, "
            f"CASE WHEN role IN ({marks}) THEN NULL ELSE {meta} END FROM messages WHERE session_id = ? {live}",
            (*leave_out, *leave_out, sid)))
    except sqlite3.Error as exc:
        log.debug("session guard: reading the live rows failed: %s", exc)
        return None


_ARCHIVED_COLUMNS = ("role", "content", "tool_call_id", "tool_calls", "tool_name")


def referenced_messages(db_path: Path, sid: str, runs: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """The session's rows with ids in ``runs`` (inclusive ``(first, last)`` pairs) as
    message dicts in id order: what a snapshot by reference holds (``role``, ``content``
    and, where set, the tool call fields Hermes stores). After the compaction Hermes
    keeps them inactive (summarised: ``compacted = 1``; carried over: a new copy is live).
    Raises ``sqlite3.Error`` when state.db cannot be read."""
    if not runs:
        return []
    return rows_by_runs(_read_only(db_path), sid, runs)


def rows_by_runs(conn: Any, sid: str, runs: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """:func:`referenced_messages` through any open connection to state.db (``doctor``'s)."""
    if not runs:
        return []
    cols = {r[1] for r in conn.execute("PRAGMA table_info(messages)").fetchall()}
    wanted = [c for c in _ARCHIVED_COLUMNS if c in cols]
    where = " OR ".join("id BETWEEN ? AND ?" for _ in runs)
    rows = conn.execute(
        f"SELECT {', '.join(wanted)} FROM messages WHERE session_id = ? AND ({where}) ORDER BY id",
        (sid, *[n for run in runs for n in run]),
    ).fetchall()
    out: list[dict[str, Any]] = []
    for row in rows:
        msg: dict[str, Any] = {}
        for name, value in zip(wanted, row, strict=True):
            if name in ("role", "content"):
                msg[name] = value
            elif value not in (None, ""):
                if name == "tool_calls" and isinstance(value, str):
                    try:
                        value = json.loads(value)
                    except ValueError:
                        pass
                msg["name" if name == "tool_name" else name] = value
        out.append(msg)
    return out
