"""The recall index: passages of snapshots and of Hermes's archived rows
(``session_guard_recall_docs``, ``_recall_indexed``, ``_recall_sources`` and the
contentless FTS5 table ``session_guard_recall_fts`` with its vocabulary).

The text itself is never copied here: it stays in the snapshot tables or in
Hermes's rows, which the caller reads (see :mod:`hermes_session_guard.summaries.search_index`)
and hands in as ``(host_row_id, turn, role, content)``.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..safe_text import searchable
from .connection import StoreConnection, connect
from .rows import _row_message, text_hash


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
                    conn = connect(":memory:", any_thread=True)
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


class RecallIndexRepository(StoreConnection):
    """The recall index's tables, with a short-lived cache of document frequencies."""

    def __init__(self, db_path: Path | str, *, timeout: float = 30.0) -> None:
        super().__init__(db_path, timeout=timeout)
        # Document frequencies change only when passages are indexed; other processes
        # indexing the same file are picked up after a short while.
        self._df: dict[str, int] = {}
        self._df_at = 0.0

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
        where, params = "", tuple[str, ...]()
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
            referenced = self._referenced_rows(snapshot_id)  # Hermes's rows, read outside the write
            if referenced == []:
                continue  # Hermes no longer holds them as they were: nothing true to index
            with self.transaction() as conn:
                if conn.execute("SELECT 1 FROM session_guard_recall_indexed WHERE snapshot_id = ?",
                                (snapshot_id,)).fetchone():
                    continue  # another process's recall indexed it meanwhile
                rows = referenced if referenced is not None else conn.execute(
                    "SELECT role, content, message_json FROM session_guard_snapshot_messages WHERE snapshot_id = ?"
                    " ORDER BY position", (snapshot_id,),
                ).fetchall()
                self._index_snapshot(conn, session_id, snapshot_id, first, rows, index_text)
            done += 1
        return done

    def _referenced_rows(self, snapshot_id: str) -> list[tuple[str | None, str | None, str]] | None:
        """``(role, content, message_json)`` of a snapshot by reference (native mode: the
        rows are Hermes's own), ``[]`` when they cannot be read as recorded, ``None`` for a
        snapshot the guard copied. The snapshot repository reads them."""
        return None

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
            RecallDoc(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7],
                      message=None if row[8] is None else _row_message(row[8], row[9]))
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
