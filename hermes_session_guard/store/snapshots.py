"""Snapshots: the verbatim messages a compression replaced, immutable once written.

Two forms, read through the same methods: a copy (``session_guard_snapshot_messages``,
every release before native mode and every snapshot written by earlier versions) and a
reference (``session_guard_snapshot_refs``: the ids of the session's rows that were live
when the compaction ran, which Hermes itself keeps after it, inactive; with the row count
and a digest taken when it was written). A reference is read through the archived-rows reader the package
root binds (:func:`bind_archived_reader`); ``store/`` itself names only its own tables.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .connection import connect
from .rows import _row_message, _row_parts
from .schema import _has_table
from .text_index import IndexText, TextIndexRepository


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


_INFO_COLUMNS = ("snapshot_id, session_id, op_id, created_at, message_count, first_turn, last_turn, reason,"
                 " host_version, host_mode")


def read_snapshot_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Snapshots per session through any (read-only) connection; empty when the
    guard never wrote to this database."""
    if not _has_table(conn, "session_guard_snapshots"):
        return {}
    rows = conn.execute("SELECT session_id, COUNT(*) FROM session_guard_snapshots GROUP BY session_id")
    return {str(sid): int(n) for sid, n in rows}


def read_snapshot_infos(conn: sqlite3.Connection, session_id: str) -> list[SnapshotInfo]:
    """The snapshots of ``session_id``, oldest first, through any (read-only) connection;
    empty when the guard never wrote to this database."""
    if not _has_table(conn, "session_guard_snapshots"):
        return []
    rows = conn.execute(f"SELECT {_INFO_COLUMNS} FROM session_guard_snapshots WHERE session_id = ?"
                        " ORDER BY created_at, snapshot_id", (session_id,)).fetchall()
    return [SnapshotInfo(*row) for row in rows]


def read_snapshot_references(conn: sqlite3.Connection) -> list[tuple[str, str, list[tuple[int, int]], int, str]]:
    """``(snapshot_id, session_id, row runs, row count, digest)`` of every snapshot by
    reference, through any (read-only) connection; empty when there are none."""
    if not _has_table(conn, "session_guard_snapshot_refs"):
        return []
    rows = conn.execute("SELECT snapshot_id, session_id, row_ranges, row_count, content_digest"
                        " FROM session_guard_snapshot_refs ORDER BY snapshot_id")
    return [(str(a), str(b), parse_runs(str(c)), int(d), str(e)) for a, b, c, d, e in rows]


def snapshots_recorded(db_path: Path, session_id: str) -> bool:
    """Whether the guard recorded a snapshot of ``session_id`` in ``db_path``, read
    through a short-lived read-only connection (nothing created, nothing kept open;
    False when the guard's table is not there or the file cannot be read)."""
    try:
        conn = connect(db_path, read_only=True)
    except sqlite3.Error:
        return False
    try:
        if not _has_table(conn, "session_guard_snapshots"):
            return False
        return conn.execute("SELECT 1 FROM session_guard_snapshots WHERE session_id = ? LIMIT 1",
                            (session_id,)).fetchone() is not None
    except sqlite3.Error:
        return False
    finally:
        conn.close()

#: ``(state.db path, session id, [(first id, last id), ...]) -> messages`` (host/reads.referenced_messages)
ArchivedReader = Callable[[Path, str, list[tuple[int, int]]], list[dict[str, Any]]]
_archived_reader: ArchivedReader | None = None


def bind_archived_reader(reader: ArchivedReader) -> None:
    """Hand ``store/`` the reader of Hermes's archived rows (the package root does, once)."""
    global _archived_reader
    _archived_reader = reader


class SnapshotGone(RuntimeError):
    """A snapshot by reference whose rows Hermes no longer holds as they were."""


def format_runs(runs: list[tuple[int, int]]) -> str:
    return ",".join(f"{a}-{b}" for a, b in runs)


def parse_runs(text: str) -> list[tuple[int, int]]:
    runs = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        runs.append((int(first), int(last or first)))
    return runs


_CRC_FORM = "crc32:"  # content_digest's form; a digest without it is an earlier version's SHA-256


def _digest_stream(messages: Iterable[dict[str, Any]]) -> Iterator[bytes]:
    """``<role>\x1f<content>\x1e`` of each message, the text encoded without a joined copy."""
    for msg in messages:
        content = msg.get("content")
        yield f"{msg.get('role')}\x1f".encode("utf-8", "surrogatepass")
        yield (content if isinstance(content, str) else repr(content)).encode("utf-8", "surrogatepass")
        yield b"\x1e"


def content_digest(messages: Iterable[dict[str, Any]]) -> str:
    """A checksum of the messages' roles and texts, to notice rows rewritten after the fact
    (with their count: a check of accidents, not of an adversary who can write state.db,
    the guard's tables included). CRC-32, a third of SHA-256's time (0.12 against 0.37 ms
    for a 48-turn transcript of 0.67 MB, read at every compaction and every reader)."""
    crc = 0
    for chunk in _digest_stream(messages):
        crc = zlib.crc32(chunk, crc)
    return f"{_CRC_FORM}{crc:08x}"


def _sha256_digest(messages: Iterable[dict[str, Any]]) -> str:
    """The digest references written by earlier versions hold (no form prefix)."""
    h = hashlib.sha256()
    for chunk in _digest_stream(messages):
        h.update(chunk)
    return h.hexdigest()


def reference_problem(messages: list[dict[str, Any]], count: int, digest: str) -> str | None:
    """Why the rows a snapshot by reference names are no longer as recorded, or None (the one check
    behind every reader: the store, ``snapshots --show`` and ``doctor``)."""
    check = content_digest if digest.startswith(_CRC_FORM) else _sha256_digest
    if len(messages) == count and check(messages) == digest:
        return None
    changed = ", with changed content" if len(messages) == count else ""
    return f"{len(messages)} of its {count} rows are there{changed}"


def _new_info(snapshot_id: str, session_id: str, op_id: str | None, count: int, first_turn: int | None,
              reason: str, host_version: str | None, host_mode: str | None, created_at: float | None) -> SnapshotInfo:
    first = 1 if first_turn is None else first_turn
    return SnapshotInfo(snapshot_id, session_id, op_id, time.time() if created_at is None else created_at, count,
                        first, first + count - 1, reason, host_version, host_mode)


def _insert_info(conn: sqlite3.Connection, info: SnapshotInfo) -> None:
    conn.execute(f"INSERT INTO session_guard_snapshots({_INFO_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                 tuple(info.__dict__.values()))


class SnapshotRepository(TextIndexRepository):
    """Writes and reads snapshots; a snapshot written with ``index_text`` enters the
    text index in the same transaction."""

    def snapshot_exists(self, snapshot_id: str) -> bool:
        return self.read_one("SELECT 1 FROM session_guard_snapshots WHERE snapshot_id = ?", (snapshot_id,)) is not None

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
        (what recall reads of a message) the messages also enter the text index."""
        rows = [(snapshot_id, pos, *_row_parts(msg)) for pos, msg in enumerate(messages)]
        info = _new_info(snapshot_id, session_id, op_id, len(rows), first_turn, reason, host_version, host_mode,
                         created_at)
        with self.transaction() as conn:
            _insert_info(conn, info)
            conn.executemany(
                "INSERT INTO session_guard_snapshot_messages(snapshot_id, position, role, content,"
                " message_json) VALUES (?,?,?,?,?)",
                rows,
            )
            if index_text is not None:
                self._index_snapshot(conn, session_id, snapshot_id,
                                     [(role, content, raw) for _sid, _p, role, content, raw in rows], index_text,
                                     copy=True)
        return info
    def write_snapshot_reference(
        self,
        *,
        snapshot_id: str,
        session_id: str,
        row_runs: list[tuple[int, int]],
        op_id: str | None = None,
        first_turn: int | None = None,
        host_version: str | None = None,
        host_mode: str | None = None,
        created_at: float | None = None,
        matching: list[Any] | None = None,
        read: tuple[int, str] | None = None,
    ) -> SnapshotInfo | None:
        """Record a snapshot that names Hermes's own rows ``row_runs`` of ``session_id``
        (read now, to count and digest them, unless ``read`` gives their count and
        :func:`content_digest` as the caller just read them) instead of copying them. With
        ``matching`` (the transcript the compaction replaces) nothing is written, and None
        returned, unless those rows hold exactly these messages (roles and texts, in
        order): the caller then stores a copy."""
        count, digest = self.rows_digest(session_id, row_runs) if read is None else read
        if matching is not None and (len(matching) != count or not all(isinstance(m, dict) for m in matching)
                                     or content_digest(matching) != digest):
            return None
        info = _new_info(snapshot_id, session_id, op_id, count, first_turn, "compression", host_version, host_mode,
                         created_at)
        with self.transaction() as conn:
            _insert_info(conn, info)
            conn.execute(
                "INSERT INTO session_guard_snapshot_refs(snapshot_id, session_id, row_ranges, row_count,"
                " content_digest) VALUES (?,?,?,?,?)",
                (snapshot_id, session_id, format_runs(row_runs), count, digest),
            )
        return info

    def rows_digest(self, session_id: str, row_runs: list[tuple[int, int]]) -> tuple[int, str]:
        """The count and :func:`content_digest` of Hermes's rows ``row_runs`` as they are now
        (read on a connection of the guard's: never inside a transaction of Hermes's)."""
        messages = self._archived(session_id, row_runs)
        return len(messages), content_digest(messages)

    def _archived(self, session_id: str, runs: list[tuple[int, int]]) -> list[dict[str, Any]]:
        if _archived_reader is None:
            raise SnapshotGone("no reader of Hermes's rows is bound (import hermes_session_guard)")
        return _archived_reader(Path(self.db_path), session_id, runs)

    def _reference(self, snapshot_id: str) -> tuple[str, list[tuple[int, int]], int, str] | None:
        row = self.read_one("SELECT session_id, row_ranges, row_count, content_digest"
                            " FROM session_guard_snapshot_refs WHERE snapshot_id = ?", (snapshot_id,))
        return (str(row[0]), parse_runs(str(row[1])), int(row[2]), str(row[3])) if row else None

    def referenced_messages(self, snapshot_id: str) -> list[dict[str, Any]] | None:
        """The messages of a snapshot by reference (None for a copied snapshot). Raises
        :class:`SnapshotGone` when Hermes no longer holds the rows as they were (deleted,
        rewritten, or the session pruned): never a silent partial transcript."""
        ref = self._reference(snapshot_id)
        if ref is None:
            return None
        session_id, runs, count, digest = ref
        messages = self._archived(session_id, runs)
        problem = reference_problem(messages, count, digest)
        if problem is not None:
            raise SnapshotGone(f"snapshot {snapshot_id} names rows {format_runs(runs)} of session {session_id} that "
                               f"Hermes no longer holds as they were ({problem})")
        return messages

    def _referenced_rows(self, snapshot_id: str) -> list[tuple[str | None, str | None, str]] | None:
        try:
            messages = self.referenced_messages(snapshot_id)
        except (SnapshotGone, sqlite3.Error):
            return []
        if messages is None:
            return None
        return [(m.get("role"), m.get("content") if isinstance(m.get("content"), str) else None,
                 json.dumps(m, ensure_ascii=False)) for m in messages]

    def snapshot_message(self, snapshot_id: str, position: int) -> dict[str, Any] | None:
        """Message at 1-based ``position`` of a snapshot."""
        found = self.snapshot_turns(snapshot_id, position, position)
        return found[0][1] if found else None

    def snapshot_turns(self, snapshot_id: str, first: int, last: int) -> list[tuple[int, dict[str, Any]]]:
        """``(turn, message)`` for turns ``first..last`` of a snapshot."""
        referenced = self.referenced_messages(snapshot_id)
        if referenced is not None:
            info = self.snapshot_info(snapshot_id)
            start = (info.first_turn if info else None) or 1
            return [(start + i, m) for i, m in enumerate(referenced) if first <= start + i <= last]
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
        row = self.read_one(f"SELECT {_INFO_COLUMNS} FROM session_guard_snapshots WHERE snapshot_id = ?",
                            (snapshot_id,))
        return SnapshotInfo(*row) if row else None

    def has_snapshots(self, session_id: str) -> bool:
        return self.read_one("SELECT 1 FROM session_guard_snapshots WHERE session_id = ? LIMIT 1",
                             (session_id,)) is not None

    def list_snapshots(self, session_id: str) -> list[SnapshotInfo]:
        with self.reading() as conn:
            return read_snapshot_infos(conn, session_id)

    def snapshot_messages(self, snapshot_id: str, session_id: str | None = None) -> list[dict[str, Any]]:
        """The messages of one snapshot, in order. With ``session_id`` the snapshot
        must belong to that session (else an empty list)."""
        referenced = self.referenced_messages(snapshot_id)
        if referenced is not None:
            ref = self._reference(snapshot_id)
            return referenced if session_id is None or (ref and ref[0] == session_id) else []
        query = (
            "SELECT m.message_json, m.content FROM session_guard_snapshot_messages m"
            " JOIN session_guard_snapshots s ON s.snapshot_id = m.snapshot_id"
            " WHERE m.snapshot_id = ?"
        )
        params: tuple[Any, ...] = (snapshot_id,)
        if session_id is not None:
            query += " AND s.session_id = ?"
            params += (session_id,)
        return [_row_message(r[0], r[1]) for r in self.read_all(query + " ORDER BY m.position", params)]
    def compression_count(self, session_id: str, since: float | None = None) -> int:
        """Compressions of ``session_id`` that stored a snapshot (after ``since``)."""
        row = self.read_one("SELECT COUNT(*) FROM session_guard_snapshots WHERE session_id = ?"
                            " AND reason = 'compression' AND created_at > ?",
                            (session_id, -1.0 if since is None else since))
        return int(row[0])
