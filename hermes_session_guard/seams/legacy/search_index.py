"""Hermes's own search over the guard's snapshots: the compacted turns of 0.13-0.17.

Unguarded 0.13-0.17 rotate on compression and leave the pre-compression rows in
the ended parent session, where ``SessionDB.search_messages`` (the
``session_search`` tool, the dashboard search) still finds them. The guard keeps
the id and moves those rows into its snapshots instead, so this module gives the
snapshots the same search Hermes gives its rows:

* the same full-text engine and tokenizer as Hermes's ``messages_fts`` (FTS5,
  default ``unicode61``) over the same text (content, tool name and tool calls,
  joined as Hermes's trigger joins them), queried with the query string Hermes's
  own sanitizer produced, ranked by FTS5 ``rank`` (bm25);
* the same filters, in SQL: session source (``source_filter``,
  ``exclude_sources``, joined on Hermes's ``sessions`` row of the snapshot's
  session) and message role;
* hits attributed to the snapshot's session id (the conversation's own id,
  which the guard never changes), in the row shape ``search_messages`` returns,
  with a negative ``id`` (no Hermes row has one) and ``snapshot_id`` /
  ``snapshot_position`` naming where the verbatim text is.

The index is the guard's one full-text index (:mod:`hermes_session_guard.store.text_index`),
which indexes every message of a snapshot copy with the text Hermes's trigger joins and
holds no copy of it; a snapshot enters it on the first search or recall after it was
written (whoever wrote it: a compression, a lineage repair, an older guard), so a
compression pays nothing for it. Snippets are FTS5's own ``snippet()`` over the hits'
text, in a per-connection table that holds only those hits.

Nothing here imports Hermes; it reads Hermes's ``sessions`` table (never writes it).

Why one module: the query, its filters, the row shape and the in-memory vocabulary that
answers "no snapshot can match" share the index's layout; a change to one is a change to all.
"""

from __future__ import annotations

import bisect
import json
import logging
import re
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ...safe_text import searchable
from ...store import GuardStore, _row_message, index_body
from ...store.schema import TEXT_DOCS, TEXT_FTS, TEXT_VOCAB
from ...summaries.recall import recall_text

log = logging.getLogger("hermes_session_guard")

DOCS, FTS = TEXT_DOCS, TEXT_FTS


class SearchIndexUnavailable(RuntimeError):
    """The index cannot be used here (an SQLite without FTS5)."""


def index_pending(store: GuardStore) -> int:
    """Index every snapshot of this state.db that is not indexed yet; returns how many."""
    if not store.fts:
        raise SearchIndexUnavailable("this SQLite has no FTS5")
    return store.index_missing_snapshots(None, recall_text)


def _in(column: str, values: Sequence[str], negate: bool = False) -> str:
    return f"{column} {'NOT ' if negate else ''}IN ({','.join('?' for _ in values)})"


def _filters(
    source_filter: Sequence[str] | None, exclude_sources: Sequence[str] | None, role_filter: Sequence[str] | None,
) -> tuple[list[str], list[Any]]:
    """Hermes's own filters, as Hermes writes them (``None`` means no filter; an
    empty role list too)."""
    where: list[str] = []
    params: list[Any] = []
    if source_filter is not None:
        where.append(_in("s.source", source_filter))
        params.extend(source_filter)
    if exclude_sources is not None:
        where.append(_in("s.source", exclude_sources, negate=True))
        params.extend(exclude_sources)
    if role_filter:
        where.append(_in("m.role", role_filter))
        params.extend(role_filter)
    return where, params


_SELECT = (
    "SELECT d.doc_id, sn.session_id, m.role, {snippet} AS snippet,"
    " COALESCE(json_extract(m.message_json, '$.timestamp'), sn.created_at) AS timestamp,"
    " json_extract(m.message_json, '$.tool_name') AS tool_name, s.source, s.model, s.started_at AS session_started,"
    " d.ref, d.position, {rank} AS rank, m.content, m.message_json"
)
_JOINS = (
    " JOIN session_guard_snapshot_messages m ON m.snapshot_id = d.ref AND m.position = d.position"
    " JOIN session_guard_snapshots sn ON sn.snapshot_id = d.ref"
    " JOIN sessions s ON s.id = sn.session_id"
)
# The text Hermes's messages_fts trigger indexes for a row, of a snapshot message in SQL
# (the substring route matches it; the full-text route indexed store.index_body's).
_BODY = (
    "(COALESCE(m.content, '') || ' ' || COALESCE(json_extract(m.message_json, '$.tool_name'), '') || ' ' ||"
    " COALESCE(json_extract(m.message_json, '$.tool_calls'), ''))"
)
_SNIPPETS = "session_guard_snippets"


def search(
    store: GuardStore,
    fts_query: str,
    *,
    source_filter: Sequence[str] | None = None,
    exclude_sources: Sequence[str] | None = None,
    role_filter: Sequence[str] | None = None,
    limit: int = 20,
    like_terms: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Snapshot rows matching ``fts_query`` (already sanitized the way Hermes does),
    best first, at most ``limit``. With ``like_terms`` (Hermes's route for CJK
    queries) a substring match on any of the terms instead, newest snapshot first."""
    index_pending(store)
    where, params = _filters(source_filter, exclude_sources, role_filter)
    where.append("d.source = 'snapshot'")
    if like_terms:
        likes = " OR ".join(f"{_BODY} LIKE ? ESCAPE '\\'" for _ in like_terms)
        escaped = [t.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") for t in like_terms]
        sql = (
            _SELECT.format(snippet=f"substr({_BODY}, max(1, instr({_BODY}, ?) - 40), 120)", rank="0.0")
            + f" FROM {DOCS} d" + _JOINS
            + f" WHERE ({likes})" + "".join(f" AND {w}" for w in where)
            + " ORDER BY timestamp DESC LIMIT ?"
        )
        args: list[Any] = [like_terms[0], *[f"%{e}%" for e in escaped], *params, limit]
    else:
        # ``content:`` keeps the query off the scope column (recall's session tokens).
        sql = (
            _SELECT.format(snippet="NULL", rank=f"bm25({FTS}, 1.0, 0.0)")
            + f" FROM {FTS} JOIN {DOCS} d ON d.doc_id = {FTS}.rowid" + _JOINS
            + f" WHERE {FTS} MATCH ?" + "".join(f" AND {w}" for w in where)
            + " ORDER BY rank, d.doc_id LIMIT ?"
        )
        args = [f"content:({fts_query})", *params, limit]
    with store.reading() as conn:
        try:
            rows = conn.execute(sql, args).fetchall()
            snippets = {} if like_terms else _snippets(conn, fts_query, rows)
        except sqlite3.OperationalError as exc:
            # Hermes answers [] to an FTS5 syntax error its sanitizer let through; so do we.
            log.debug("session guard: snapshot search query failed (%s)", exc)
            return []
        hits = [_hit(conn, row, snippets) for row in rows]
    return hits


def _snippets(conn: sqlite3.Connection, fts_query: str, rows: Sequence[Sequence[Any]]) -> dict[int, str]:
    """FTS5's ``snippet()`` of each hit, as Hermes's own index gives it: the hits' text
    (what the index holds for them) in a per-connection table, matched by the same query."""
    if not rows:
        return {}
    conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{_SNIPPETS} USING fts5(content)")
    try:
        conn.executemany(f"INSERT INTO temp.{_SNIPPETS}(rowid, content) VALUES (?, ?)",
                         [(row[0], searchable(index_body(_row_message(row[13], row[12])))) for row in rows])
        return {int(r[0]): str(r[1]) for r in conn.execute(
            f"SELECT rowid, snippet({_SNIPPETS}, 0, '>>>', '<<<', '...', 40) FROM temp.{_SNIPPETS}"
            f" WHERE {_SNIPPETS} MATCH ?", (fts_query,))}
    finally:
        conn.execute(f"DELETE FROM temp.{_SNIPPETS}")


def _hit(conn: sqlite3.Connection, row: Sequence[Any], snippets: dict[int, str]) -> dict[str, Any]:
    doc_id, session_id, role, snippet, timestamp, tool_name, source, model, started, snapshot_id, position, rank = (
        row[:12])
    snippet = snippets.get(int(doc_id), snippet)
    return {
        "id": -int(doc_id),  # no Hermes row has a negative id
        "session_id": session_id,
        "role": role,
        "snippet": snippet,
        "timestamp": timestamp,
        "tool_name": tool_name,
        "source": source,
        "model": model,
        "session_started": started,
        "context": _context(conn, snapshot_id, int(position)),
        "snapshot_id": snapshot_id,
        "snapshot_position": int(position),
        "_rank": float(rank or 0.0),
    }


def _context(conn: sqlite3.Connection, snapshot_id: str, position: int) -> list[dict[str, Any]]:
    """The message before, the hit and the message after, as Hermes's context
    previews them (text only, 200 characters)."""
    out = []
    for role, content, raw in conn.execute(
        "SELECT role, content, message_json FROM session_guard_snapshot_messages"
        " WHERE snapshot_id = ? AND position BETWEEN ? AND ? ORDER BY position",
        (snapshot_id, position - 1, position + 1),
    ):
        text = content
        if text is None:
            try:
                parts = json.loads(raw).get("content")
            except (ValueError, AttributeError):
                parts = None
            text = "[multimodal content]" if isinstance(parts, list) else ""
        out.append({"role": role, "content": text[:200]})
    return out


def host_ranks(store: GuardStore, fts_query: str, row_ids: Iterable[int]) -> dict[int, float]:
    """FTS5 ``rank`` of Hermes's own hits (read from Hermes's ``messages_fts``), so
    both lists merge in one order."""
    ids = [int(i) for i in row_ids if isinstance(i, int) and i > 0]
    if not ids:
        return {}
    rows = store.read_all("SELECT rowid, rank FROM messages_fts WHERE messages_fts MATCH ?"
                          f" AND rowid IN ({','.join('?' * len(ids))})", (fts_query, *ids))
    return {int(r[0]): float(r[1]) for r in rows}


def snapshot_window(store: GuardStore, session_id: str, anchor_id: int, window: int) -> dict[str, Any] | None:
    """``get_messages_around`` for a snapshot hit (``anchor_id`` is the negative id
    :func:`search` gave it): up to ``window`` messages either side, in conversation
    order, in Hermes's row shape. ``None`` when the anchor is no snapshot row of
    ``session_id`` (Hermes then answers its own empty window)."""
    doc_id = -int(anchor_id)
    window = max(int(window), 0)
    with store.reading() as conn:
        anchor = conn.execute(
            f"SELECT d.ref, d.position, sn.created_at FROM {DOCS} d"
            " JOIN session_guard_snapshots sn ON sn.snapshot_id = d.ref"
            " WHERE d.doc_id = ? AND d.source = 'snapshot' AND sn.session_id = ?", (doc_id, session_id),
        ).fetchone()
        if anchor is None:
            return None
        snapshot_id, position, created_at = anchor[0], int(anchor[1]), float(anchor[2])
        # A copy's messages are indexed in order in one transaction: consecutive doc ids.
        ids = dict(conn.execute(
            f"SELECT position, doc_id FROM {DOCS} WHERE doc_id BETWEEN ? AND ? AND ref = ?",
            (doc_id - min(position, window), doc_id + window, snapshot_id),
        ).fetchall())
        rows = conn.execute(
            "SELECT position, role, content, message_json FROM session_guard_snapshot_messages"
            " WHERE snapshot_id = ? AND position BETWEEN ? AND ? ORDER BY position",
            (snapshot_id, position - window, position + window),
        ).fetchall()
    out = []
    for pos, role, content, raw in rows:
        message = json.loads(raw)
        out.append({
            "id": -int(ids.get(pos, doc_id - position + pos)),
            "session_id": session_id,
            "role": role,
            "content": content if content is not None else message.get("content"),
            "tool_call_id": message.get("tool_call_id"),
            "tool_calls": message.get("tool_calls"),
            "tool_name": message.get("tool_name"),
            "timestamp": message.get("timestamp", created_at),
            "snapshot_id": snapshot_id,
            "snapshot_position": int(pos),
        })
    before = sum(1 for r in out if r["snapshot_position"] < position)
    return {"window": out, "messages_before": before, "messages_after": len(out) - before - 1}


# -- a query no snapshot can match ------------------------------------------------------------
#
# A search that matches nothing must cost about what Hermes's own costs: the guard answers
# it from the index's vocabulary, held in memory while nothing new was indexed, without a
# second full-text query. The answer is only ever "cannot match" when that is certain.

_VOCABULARY_CAP = 500_000  # more distinct terms than this: no in-memory vocabulary (full query)
_BAREWORD = re.compile(r"[A-Za-z0-9_\u0080-\U0010ffff]+\*?")
_TOKEN = re.compile(r"[A-Za-z0-9]+")
_UNIT = re.compile(r'"[^"]*"\*?|\S+')
_OPERATORS = frozenset({"OR", "NOT", "NEAR"})


def required_terms(fts_query: str) -> tuple[tuple[str, bool], ...] | None:
    """The terms every match of ``fts_query`` (an FTS5 query as Hermes's sanitizer
    leaves it) must contain, as ``(term, is_prefix)``, tokenized as the index's
    ``unicode61`` tokenizer does; only ASCII units are read (others are left out,
    which only makes the answer weaker). ``None`` when the query is not a plain
    conjunction (``OR``, ``NOT``, ``NEAR``, groups, column filters, anything unusual)."""
    terms: list[tuple[str, bool]] = []
    for unit in _UNIT.findall(fts_query):
        if unit == "AND":
            continue
        if unit in _OPERATORS or unit.startswith("NEAR("):
            return None
        prefix = unit.endswith("*")
        body = unit[:-1] if prefix else unit
        if len(body) >= 2 and body[0] == '"' and body[-1] == '"':
            body = body[1:-1]
            if "*" in body or "\x00" in body:
                return None
        elif not _BAREWORD.fullmatch(unit):
            return None
        if not body.isascii():
            continue
        tokens = [t.lower() for t in _TOKEN.findall(body)]
        if not tokens:
            continue
        terms.extend((t, False) for t in tokens[:-1])
        terms.append((tokens[-1], prefix))
    return tuple(terms)


@dataclass
class _Vocabulary:
    store: GuardStore
    mark: tuple[int, int]  # state.db's write mark when last looked at
    indexed: tuple[int, int]  # (count, last rowid) of the indexed snapshots
    terms: list[str] | None  # sorted; None: too many terms to hold


_vocabularies: dict[int, _Vocabulary] = {}


def _load_vocabulary(conn: sqlite3.Connection) -> list[str] | None:
    rows = conn.execute(f"SELECT term FROM {TEXT_VOCAB} LIMIT ?", (_VOCABULARY_CAP + 1,)).fetchall()
    return None if len(rows) > _VOCABULARY_CAP else sorted({r[0] for r in rows})


def _vocabulary(store: GuardStore) -> _Vocabulary:
    """Every term of the text index (snapshots written since the last look are
    indexed first). Reloaded only when the index itself grew; a write elsewhere in
    state.db costs one small count."""
    with store.reading() as conn:
        mark = store.write_mark(conn)
    cached = _vocabularies.get(id(store))
    if cached is not None and cached.store is store and cached.mark == mark:
        return cached
    # Other connections' commits after ``version`` was read make the next call look again.
    version = mark[0]
    index_pending(store)
    with store.reading() as conn:
        count, last = conn.execute(
            "SELECT COUNT(*), COALESCE(MAX(rowid), 0) FROM session_guard_text_indexed").fetchone()
        indexed = (int(count), int(last))
        if cached is not None and cached.store is store and cached.indexed == indexed:
            terms = cached.terms
        else:
            terms = _load_vocabulary(conn)
        mark = (version, conn.total_changes)
    found = _vocabularies[id(store)] = _Vocabulary(store, mark, indexed, terms)
    return found


def cannot_match(store: GuardStore, terms: Sequence[tuple[str, bool]]) -> bool:
    """True when no snapshot row can match a query needing all of ``terms``: one
    of them is in no indexed snapshot. False whenever that is not certain."""
    if not terms:
        return False
    ordered = _vocabulary(store).terms
    if ordered is None:
        return False
    for term, prefix in terms:
        # the first indexed term not before this one: the term itself, or one it begins
        at = bisect.bisect_left(ordered, term)
        if at == len(ordered) or not (ordered[at].startswith(term) if prefix else ordered[at] == term):
            return True
    return False
