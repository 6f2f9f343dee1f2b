"""The one full-text index over the text the guard keeps (``session_guard_text_docs``,
``_text_indexed``, ``_text_sources`` and the contentless FTS5 table
``session_guard_text_fts`` with its vocabulary), serving recall and Hermes's search seam.

A document is one message:

* every message of a snapshot copy (``source = 'snapshot'``, ``position`` its 0-based
  place in the snapshot), indexed with the text Hermes's ``messages_fts`` trigger joins
  for a row (content, tool name, tool calls), so Hermes's search seam finds in a snapshot
  what Hermes would have found in its own rows;
* for recall only, Hermes's own rows a snapshot by reference names (same source) and the
  conversation's archived rows (``source = 'archived'``, ``position`` the 1-based turn in
  that Hermes session).

The text is never copied here: it stays in the snapshot tables or in Hermes's rows. The
tokenizer is Hermes's (``unicode61``); recall reads a word as the forms of it the index
holds (:meth:`TextIndexRepository.word_forms`, by :func:`porter_stems`). A document recall
may return carries its conversation's :func:`scope_token` in the ``scope`` column: only a
message's first occurrence in that conversation (by text; a unique index holds it), and
only text recall reads (summaries removed, recall's own answers left out), so a recall
query names the sessions it may match inside the index.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..safe_text import searchable
from .connection import StoreConnection, connect
from .rows import _row_message, message_text, text_hash
from .schema import TEXT_FTS, TEXT_VOCAB


def scope_token(session_id: str) -> str:
    """The full-text token standing for one session (letters and digits only, so
    no tokenizer splits it into something another session shares)."""
    return "sg" + hashlib.sha256(session_id.encode("utf-8")).hexdigest()[:20] + "z"


def index_body(message: dict[str, Any]) -> str:
    """The text Hermes's ``messages_fts`` trigger indexes for a row, for a stored message:
    ``content || ' ' || tool_name || ' ' || tool_calls``."""
    calls = message.get("tool_calls")
    if calls is not None and not isinstance(calls, str):
        calls = json.dumps(calls, ensure_ascii=False, separators=(",", ":"), default=str)
    return f"{message_text(message) or ''} {message.get('tool_name') or ''} {calls or ''}"


@dataclass(frozen=True)
class RecallDoc:
    """One document recall found: where in the conversation it is."""

    doc_id: int
    session_id: str
    source: str  # "snapshot" | "archived"
    ref: str  # snapshot id, or the Hermes session id for archived rows
    position: int  # 1-based turn within ``ref``
    role: str | None
    host_row_id: int | None
    score: float = 0.0
    message: dict[str, Any] | None = None  # the snapshot message, fetched with the match


#: The text recall reads in a stored message (None: nothing recall returns).
IndexText = Callable[[dict[str, Any]], str | None]

_stem_lock = threading.Lock()
_stem_conn: sqlite3.Connection | None = None
_stem_cache: dict[str, str] = {}


def porter_stems(words: Iterable[str]) -> dict[str, str]:
    """``word -> stem`` as SQLite's ``porter`` tokenizer computes it (which terms of the
    index are forms of a word: :meth:`TextIndexRepository.word_forms`)."""
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


# (position, role, indexed text, recall's text or None, Hermes row id)
_Doc = tuple[int, str | None, str, str | None, int | None]


class TextIndexRepository(StoreConnection):
    """The text index's tables, with a short-lived cache of document frequencies."""

    def __init__(self, db_path: Path | str, *, timeout: float = 30.0) -> None:
        super().__init__(db_path, timeout=timeout)
        # Document frequencies change only when documents are indexed; other processes
        # indexing the same file are picked up after a short while.
        self._df: dict[str, int] = {}
        self._df_at = 0.0
        self._forms: dict[str, dict[str, int]] = {}  # word -> its forms in the index (word_forms)
        self._unchanged_since: tuple[int, int] | None = None  # write mark of the last full pass

    # -- building ---------------------------------------------------------------------
    def _index_snapshot(
        self, conn: sqlite3.Connection, session_id: str, snapshot_id: str,
        rows: list[tuple[str | None, str | None, str]], index_text: IndexText, *, copy: bool,
    ) -> None:
        """Index ``(role, content, message_json)`` rows of one snapshot: every message of a
        copy, only what recall reads of a snapshot by reference."""
        docs: list[_Doc] = []
        for pos, (role, content, raw) in enumerate(rows):
            message = _row_message(raw, content)
            recalled = index_text(message)
            if copy:
                docs.append((pos, role, index_body(message), recalled, None))
            elif recalled:
                docs.append((pos, role, recalled, recalled, None))
        self._index(conn, session_id, "snapshot", snapshot_id, docs, every=copy)
        conn.execute("INSERT OR IGNORE INTO session_guard_text_indexed(snapshot_id) VALUES (?)", (snapshot_id,))

    def write_mark(self, conn: sqlite3.Connection) -> tuple[int, int]:
        """Changes since the last look: other connections' commits (``data_version``) and
        this connection's own (``total_changes``)."""
        return int(conn.execute("PRAGMA data_version").fetchone()[0]), conn.total_changes

    def index_missing_snapshots(self, session_ids: Iterable[str] | None, index_text: IndexText) -> int:
        """Index snapshots that never entered the index (a compression leaves indexing to
        the first search or recall; an older guard kept another index), of these sessions
        or, with ``None``, of every session, oldest first. Returns how many were indexed.
        With ``None`` and nothing written to the file since the last such call, nothing is
        looked up."""
        where, params = "", tuple[str, ...]()
        if session_ids is not None:
            ids = list(session_ids)
            if not ids:
                return 0
            where, params = f"s.session_id IN ({','.join('?' for _ in ids)}) AND ", tuple(ids)
        with self.reading() as conn:
            mark = self.write_mark(conn)
            if session_ids is None and self._unchanged_since == mark:
                return 0
            todo = conn.execute(
                "SELECT s.snapshot_id, s.session_id, r.snapshot_id IS NULL FROM session_guard_snapshots s"
                " LEFT JOIN session_guard_snapshot_refs r ON r.snapshot_id = s.snapshot_id"
                f" WHERE {where}s.snapshot_id NOT IN (SELECT snapshot_id FROM session_guard_text_indexed)"
                " ORDER BY s.created_at, s.snapshot_id",
                params,
            ).fetchall()
        done = 0
        for snapshot_id, session_id, copy in todo:
            referenced = None if copy else self._referenced_rows(snapshot_id)  # read outside the write
            if referenced == []:
                continue  # Hermes no longer holds them as they were: nothing true to index
            with self.transaction() as conn:
                if conn.execute("SELECT 1 FROM session_guard_text_indexed WHERE snapshot_id = ?",
                                (snapshot_id,)).fetchone():
                    continue  # another process indexed it meanwhile
                rows = referenced if referenced is not None else conn.execute(
                    "SELECT role, content, message_json FROM session_guard_snapshot_messages WHERE snapshot_id = ?"
                    " ORDER BY position", (snapshot_id,),
                ).fetchall()
                self._index_snapshot(conn, session_id, snapshot_id, rows, index_text, copy=bool(copy))
            done += 1
        if session_ids is None:
            with self.reading() as conn:
                # Another connection's commit after ``mark`` was read changes it: looked at next time.
                self._unchanged_since = (mark[0], conn.total_changes)
        return done

    def _referenced_rows(self, snapshot_id: str) -> list[tuple[str | None, str | None, str]] | None:
        """``(role, content, message_json)`` of a snapshot by reference (the rows are
        Hermes's own), ``[]`` when they cannot be read as recorded, ``None`` for a
        snapshot the guard copied. The snapshot repository reads them."""
        return None

    def _index(self, conn: sqlite3.Connection, session_id: str, source: str, ref: str, docs: Iterable[_Doc],
               *, every: bool = False) -> int:
        """Add documents of ``session_id``. A text recall reads is recall's (carries the
        session's scope) at its first occurrence in that session only; the other documents
        are added only with ``every`` (a snapshot copy: Hermes's search seam reads them all)."""
        scope = scope_token(session_id)
        insert = ("INSERT {} INTO session_guard_text_docs(session_id, source, ref, position, role, content_hash,"
                  " recall, host_row_id) VALUES (?,?,?,?,?,?,?,?)")
        added = 0
        for position, role, body, recalled, host_row_id in docs:
            digest = int(text_hash(recalled or body)[:15], 16)  # 60 bits: an integer column
            row = (session_id, source, ref, position, role, digest)
            # recall's at its first occurrence: the unique index on (session_id, content_hash)
            # of recall's documents ignores a repeat
            cur = conn.execute(insert.format("OR IGNORE"), (*row, 1, host_row_id)) if recalled else None
            first = cur is not None and cur.rowcount == 1
            if cur is None or not first:
                if not every:
                    continue
                cur = conn.execute(insert.format(""), (*row, 0, host_row_id))
            if self.fts:
                conn.execute(f"INSERT INTO {TEXT_FTS}(rowid, scope, content) VALUES (?,?,?)",
                             (cur.lastrowid, scope if first else "", searchable(body)))
            added += 1
        if added:
            self._df.clear()
            self._forms.clear()
        return added

    def index_archived(
        self, session_id: str, host_session_id: str, turns: Iterable[tuple[int, int, str, str]],
        index_text: Callable[[str], str | None], seen_row_id: int,
    ) -> int:
        """Index Hermes rows ``(host_row_id, turn, role, content)`` of ``host_session_id``
        (the session itself or a session its conversation continues) for ``session_id``'s
        recall."""
        docs: list[_Doc] = []
        for row_id, turn, role, content in turns:
            text = index_text(content)
            if text:
                docs.append((turn, role, text, text, row_id))
        with self.transaction() as conn:
            added = self._index(conn, host_session_id, "archived", host_session_id, docs)
            conn.execute(
                "INSERT INTO session_guard_text_sources(session_id, host_session_id, seen_row_id) VALUES (?,?,?)"
                " ON CONFLICT(session_id, host_session_id) DO UPDATE SET seen_row_id = excluded.seen_row_id",
                (session_id, host_session_id, seen_row_id),
            )
        return added

    def archived_seen(self, session_id: str, host_session_id: str) -> int:
        row = self.read_one("SELECT seen_row_id FROM session_guard_text_sources WHERE session_id = ?"
                            " AND host_session_id = ?", (session_id, host_session_id))
        return int(row[0]) if row else 0

    # -- statistics -------------------------------------------------------------------
    _DF_TTL = 30.0

    def _df_fresh(self) -> None:
        if time.monotonic() - self._df_at > self._DF_TTL:
            self._df.clear()
            self._forms.clear()
            self._df_at = time.monotonic()

    def doc_count(self) -> int:
        self._df_fresh()
        if " docs" not in self._df:
            self._df[" docs"] = int(self.read_one("SELECT MAX(doc_id) FROM session_guard_text_docs")[0] or 0)
        return self._df[" docs"]

    def document_counts(self, terms: Iterable[str]) -> dict[str, int]:
        """How many documents (all sessions) hold each term, as the index's tokenizer
        stores it (terms no document holds are left out)."""
        terms = [t for t in dict.fromkeys(terms) if t and not t.startswith(" ")]
        if not terms or not self.fts:
            return {}
        self._df_fresh()
        missing = [t for t in terms if t not in self._df]
        if missing:
            with self.reading() as conn:
                for term in missing:
                    row = conn.execute(f"SELECT doc FROM {TEXT_VOCAB} WHERE term = ?", (term,)).fetchone()
                    self._df[term] = int(row[0]) if row else 0
        return {t: self._df[t] for t in terms if self._df[t]}

    _MAX_FORMS_SCANNED = 2000

    def word_forms(self, word: str) -> dict[str, int]:
        """The index's terms that are forms of ``word``, each with its document count: terms
        whose Porter stem begins with the word's (``deploy``, ``deploys``, ``deployed`` for
        ``deploying``; ``recovery`` for ``recovered``). The index's tokenizer is Hermes's (no
        stemmer); recall reads the forms as one word. The word alone when it holds a digit,
        its stem or the stem's common start with it is shorter than three letters, or too
        many terms begin that way to read. Empty when no document holds any of them."""
        stem = porter_stems([word])[word]
        base = os.path.commonprefix([word, stem])  # forms of "deploying" (stem "deploi") begin "deplo"
        if any(c.isdigit() for c in word) or len(stem) < 3 or len(base) < 3 or not self.fts:
            return self.document_counts([word])
        self._df_fresh()
        if word not in self._forms:
            rows = self.read_all(f"SELECT term, doc FROM {TEXT_VOCAB} WHERE term >= ? AND term < ? LIMIT ?",
                                 (base, base + "\U0010ffff", self._MAX_FORMS_SCANNED + 1))
            if len(rows) > self._MAX_FORMS_SCANNED:
                self._forms[word] = self.document_counts([word])
            else:
                stems = porter_stems(str(t) for t, _ in rows)
                forms = {str(t): int(n) for t, n in rows if stems[str(t)].startswith(stem)}
                forms.update(self.document_counts([word]))
                self._forms[word] = forms
        return self._forms[word]

    # -- recall's queries -------------------------------------------------------------
    _DOC_COLUMNS = (
        "d.doc_id, d.session_id, d.source, d.ref,"
        " CASE WHEN d.source = 'snapshot' THEN d.position + COALESCE(s.first_turn, 1) ELSE d.position END,"
        " d.role, d.host_row_id"
    )
    _DOC_JOINS = (
        " LEFT JOIN session_guard_snapshots s ON d.source = 'snapshot' AND s.snapshot_id = d.ref"
        " LEFT JOIN session_guard_snapshot_messages m"
        "   ON d.source = 'snapshot' AND m.snapshot_id = d.ref AND m.position = d.position"
    )

    def search_docs(
        self, session_ids: list[str], match_content: str, limit: int, exclude: set[int] | None = None
    ) -> list[RecallDoc]:
        """Recall's documents of ``session_ids`` matching the FTS5 expression
        ``match_content`` (built by the caller from sanitised words), best first, with their
        snapshot message. ``exclude`` are doc ids the caller already has."""
        if not session_ids or not match_content:
            return []
        scopes = " OR ".join(f'"{scope_token(s)}"' for s in session_ids)
        expr = f"scope:({scopes}) AND content:({match_content})"
        skip = len(exclude or ())
        rows = self.read_all(
            f"SELECT {self._DOC_COLUMNS}, f.score, m.message_json, m.content"
            f" FROM (SELECT rowid AS id, bm25({TEXT_FTS}, 1.0, 0.0) AS score"
            f"       FROM {TEXT_FTS} WHERE {TEXT_FTS} MATCH ?"
            "       ORDER BY score LIMIT ?) AS f"
            " JOIN session_guard_text_docs d ON d.doc_id = f.id" + self._DOC_JOINS +
            " ORDER BY f.score, d.doc_id",
            (expr, limit + skip),
        )
        allowed = set(session_ids)
        docs = [
            RecallDoc(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7],
                      message=None if row[8] is None else _row_message(row[8], row[9]))
            for row in rows if row[1] in allowed and row[0] not in (exclude or ())
        ]
        return docs[:limit]

    def scan_docs(self, session_ids: Sequence[str], words: list[str], limit: int) -> list[RecallDoc]:
        """The no-FTS5 fallback: recall's snapshot documents containing any of ``words``."""
        if not session_ids or not words:
            return []
        marks = ",".join("?" for _ in session_ids)
        like = " OR ".join("lower(m.content) LIKE ?" for _ in words)
        return [RecallDoc(*row) for row in self.read_all(
            f"SELECT {self._DOC_COLUMNS}, 0.0 FROM session_guard_text_docs d" + self._DOC_JOINS +
            f" WHERE d.recall = 1 AND d.session_id IN ({marks}) AND ({like}) ORDER BY d.doc_id LIMIT ?",
            (*session_ids, *[f"%{w}%" for w in words], limit))]
