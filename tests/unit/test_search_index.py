"""The snapshot search index without Hermes: Hermes's filters and row shape, the
session a hit belongs to, snapshots written later (by this connection or
another process) found by the next search, the window around a hit."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from hermes_session_guard.seams.legacy import search_index
from hermes_session_guard.store import GuardStore
from hermes_session_guard.summaries import snapshot_export

from .hermes_like_db import HermesLikeHome

TOKEN = "quokkalantern"


@pytest.fixture
def home(tmp_path: Path) -> HermesLikeHome:
    h = HermesLikeHome(tmp_path / "home")
    h.session("a", 1.0, source="cli")
    h.session("b", 2.0, source="tool")
    yield h
    h.close()


def _snapshot(store: GuardStore, sid: str, snap: str, words: list[str]) -> None:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} {w}"}
                for i, w in enumerate(words)]
    store.write_snapshot(snapshot_id=snap, session_id=sid, messages=messages)


def test_hits_carry_the_session_id_filters_and_a_negative_id(home: HermesLikeHome) -> None:
    store = GuardStore(home.db_path)
    _snapshot(store, "a", "a.snapshot.1", ["alpha", TOKEN, "gamma"])
    _snapshot(store, "b", "b.snapshot.1", [TOKEN])
    (hit, other) = sorted(search_index.search(store, TOKEN), key=lambda h: h["session_id"])
    assert (hit["session_id"], hit["role"], hit["source"], hit["snapshot_position"]) == ("a", "assistant", "cli", 1)
    assert hit["id"] < 0 and ">>>" + TOKEN + "<<<" in hit["snippet"]
    assert [c["content"] for c in hit["context"]] == ["turn 0 alpha", f"turn 1 {TOKEN}", "turn 2 gamma"]
    assert other["session_id"] == "b"
    assert [h["session_id"] for h in search_index.search(store, TOKEN, exclude_sources=["tool"])] == ["a"]
    assert [h["session_id"] for h in search_index.search(store, TOKEN, source_filter=["tool"])] == ["b"]
    assert [h["session_id"] for h in search_index.search(store, TOKEN, role_filter=["user"])] == ["b"]
    assert search_index.search(store, "nothinglikethis") == []
    assert search_index.search(store, 'unbalanced "quote') == []  # an FTS5 syntax error answers nothing
    store.close()


def test_a_snapshot_written_after_a_search_is_found_by_the_next(home: HermesLikeHome) -> None:
    store = GuardStore(home.db_path)
    assert search_index.search(store, TOKEN) == []
    _snapshot(store, "a", "a.snapshot.1", [TOKEN])  # this process, same connection
    assert [h["session_id"] for h in search_index.search(store, TOKEN)] == ["a"]
    other = GuardStore(home.db_path)  # another process's connection
    _snapshot(other, "b", "b.snapshot.1", [TOKEN])
    other.close()
    assert sorted(h["session_id"] for h in search_index.search(store, TOKEN)) == ["a", "b"]
    assert search_index.index_pending(store) == 0
    store.close()


def test_the_index_holds_no_copy_of_the_text(home: HermesLikeHome) -> None:
    store = GuardStore(home.db_path)
    _snapshot(store, "a", "a.snapshot.1", ["the quick brown fox jumps over the lazy dog"])
    search_index.index_pending(store)
    conn = sqlite3.connect(str(home.db_path))
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE name LIKE 'session_guard_text%'")]
    assert f"{search_index.FTS}_data" in tables
    assert f"{search_index.FTS}_content" not in tables  # contentless: the text stays in the snapshot
    for table in tables:
        if table.startswith(f"{search_index.FTS}_"):
            dump = " ".join(str(row) for row in conn.execute(f"SELECT * FROM {table}"))
            assert "quick brown" not in dump, table
    conn.close()
    assert [h["session_id"] for h in search_index.search(store, '"brown fox jumps"')] == ["a"]
    store.close()


def test_a_window_opens_only_in_the_session_the_snapshot_belongs_to(home: HermesLikeHome) -> None:
    store = GuardStore(home.db_path)
    _snapshot(store, "a", "a.snapshot.1", ["w0", "w1", TOKEN, "w3", "w4"])
    (hit,) = search_index.search(store, TOKEN)
    view = search_index.snapshot_window(store, "a", hit["id"], 1)
    assert view is not None
    assert [m["content"] for m in view["window"]] == ["turn 1 w1", f"turn 2 {TOKEN}", "turn 3 w3"]
    assert [m["id"] for m in view["window"]][1] == hit["id"]
    assert (view["messages_before"], view["messages_after"]) == (1, 1)
    assert search_index.snapshot_window(store, "b", hit["id"], 1) is None  # not b's
    store.close()


def test_export_lists_each_sessions_snapshots_verbatim_and_marked(home: HermesLikeHome) -> None:
    store = GuardStore(home.db_path)
    _snapshot(store, "a", "a.snapshot.1", ["one"])
    _snapshot(store, "a", "a.snapshot.2", ["two", "three"])
    found = snapshot_export.snapshots_for_export(store, ["a", "b"])
    assert list(found) == ["a"]
    assert [s["snapshot_id"] for s in found["a"]] == ["a.snapshot.1", "a.snapshot.2"]
    assert all(s["kind"] == "session_guard_snapshot" for s in found["a"])
    assert [m["content"] for m in found["a"][1]["messages"]] == ["turn 0 two", "turn 1 three"]
    store.close()


def test_merge_orders_by_rank_or_time_and_keeps_unranked_host_rows_first() -> None:
    from hermes_session_guard.seams.legacy.search import merge

    host = [{"id": 1, "timestamp": 10.0}, {"id": 2, "timestamp": 30.0}, {"id": 3, "timestamp": 5.0}]
    guard = [{"id": -1, "_rank": -5.0, "timestamp": 20.0}, {"id": -2, "_rank": -1.0, "timestamp": 1.0}]
    ranks = {1: -4.0, 2: -6.0}  # row 3's rank unknown
    assert [r["id"] for r in merge(host, guard, ranks, None)] == [3, 2, -1, 1, -2]
    assert [r["id"] for r in merge(host, guard, {}, None)] == [1, 2, 3, -1, -2]
    assert [r["id"] for r in merge(host, guard, ranks, "newest")] == [2, -1, 1, 3, -2]
    assert [r["id"] for r in merge(host, guard, ranks, "oldest")] == [-2, 3, 1, -1, 2]


# -- a query no snapshot can match -----------------------------------------------------------


@pytest.mark.parametrize(("query", "terms"), [
    ("quokkalantern", (("quokkalantern", False),)),
    ("Quokka AND lantern", (("quokka", False), ("lantern", False))),
    ('"assistant line 7"', (("assistant", False), ("line", False), ("7", False))),
    ('"chat-send" deploy*', (("chat", False), ("send", False), ("deploy", True))),
    ('"exact phrase"*', (("exact", False), ("phrase", True))),
    ("snake_case", (("snake", False), ("case", False))),
    ("café lantern", (("lantern", False),)),  # a non-ASCII unit is left out: it proves nothing
    ("docker OR kubernetes", None),
    ("python NOT java", None),
    ("NEAR(a b)", None),
    ("content:lantern", None),
    ('"star*inside"', None),
])
def test_the_terms_every_match_must_hold(query: str, terms: tuple[tuple[str, bool], ...] | None) -> None:
    assert search_index.required_terms(query) == terms


def test_cannot_match_only_when_a_needed_term_is_in_no_snapshot(home: HermesLikeHome) -> None:
    store = GuardStore(home.db_path)
    assert search_index.cannot_match(store, (("anything", False),))  # no snapshot at all
    _snapshot(store, "a", "a.snapshot.1", ["alpha", TOKEN])  # this connection
    assert not search_index.cannot_match(store, ((TOKEN, False),))
    assert not search_index.cannot_match(store, (("quokka", True),))
    assert search_index.cannot_match(store, (("quokka", False),))  # only a prefix of an indexed term
    assert search_index.cannot_match(store, (("alpha", False), ("zebra", False)))
    assert search_index.cannot_match(store, (("zeb", True),))
    assert not search_index.cannot_match(store, ())
    other = GuardStore(home.db_path)  # another process writes a snapshot with a new word
    _snapshot(other, "b", "b.snapshot.1", ["zebra"])
    other.close()
    assert not search_index.cannot_match(store, (("zebra", False),))
    assert [h["session_id"] for h in search_index.search(store, "zebra")] == ["b"]
    store.close()


def test_cannot_match_never_hides_a_hit_the_full_search_finds(home: HermesLikeHome) -> None:
    store = GuardStore(home.db_path)
    words = ["alpha", "alphabet", "beta", "gamma42", "delta", TOKEN, "snake_case", "chat-send", "P2.2"]
    _snapshot(store, "a", "a.snapshot.1", words)
    quoted = [f'"{w}"' if "-" in w or "." in w else w for w in words]  # as Hermes's sanitizer quotes them
    queries = [*quoted, "alp*", "alphab*", "zzz*", "gamma", "gamma4*", "missing", "alpha missing", "alpha beta",
               '"turn 1"', '"turn 1 alphabet"', '"turn 9"', "p2", '"p2 2"', "snake", "send", "chat*",
               "alpha AND delta", "alpha AND nothing"]
    checked = 0
    for query in queries:
        terms = search_index.required_terms(query)
        if terms is None:
            continue
        checked += 1
        if search_index.cannot_match(store, terms):
            assert search_index.search(store, query) == [], query
        else:
            across_messages = {"alpha beta", "alpha AND delta"}  # words of different messages
            assert query in across_messages or search_index.search(store, query), query
    assert checked == len(queries)
    store.close()


# -- one index for search and recall ---------------------------------------------------------


def test_one_index_serves_hermess_search_and_recall(home: HermesLikeHome) -> None:
    """A snapshot indexed for a search is not indexed again for recall; each message of
    the copy is one document, and a text repeated in a later snapshot is a search hit in
    both but recall's only at its first occurrence."""
    from hermes_session_guard.summaries.recall import Recall, recall_text

    store = GuardStore(home.db_path)
    _snapshot(store, "a", "a.snapshot.1", ["alpha", TOKEN])
    _snapshot(store, "a", "a.snapshot.2", ["alpha", TOKEN, "gamma"])
    hits = search_index.search(store, TOKEN)
    assert sorted(h["snapshot_id"] for h in hits) == ["a.snapshot.1", "a.snapshot.2"]
    assert store.index_missing_snapshots(None, recall_text) == 0
    assert store.doc_count() == 5
    answer = Recall(store=store, session_id="a", lineage=["a"], max_chars=4000).run({"query": TOKEN})
    assert answer.count(f"turn 1 {TOKEN}") == 1 and "snapshot a.snapshot.1" in answer
    assert "a.snapshot.2" not in answer
    store.close()


@pytest.mark.parametrize("query", [TOKEN, '"brown fox"', "quick*", "fox NOT zebra", "NEAR(brown lazy, 5)"])
def test_a_snippet_is_fts5s_own_over_hermess_text(home: HermesLikeHome, query: str) -> None:
    """The snippet of a hit is what FTS5 gives for the same text in a table like
    Hermes's ``messages_fts``."""
    store = GuardStore(home.db_path)
    long_text = " ".join(["filler"] * 60 + [f"the quick brown fox {TOKEN} jumps over the lazy dog"] + ["tail"] * 60)
    message = {"role": "assistant", "content": long_text, "tool_calls": [{"function": {"name": "fox_tool"}}]}
    store.write_snapshot(snapshot_id="a.snapshot.1", session_id="a", messages=[message])
    (hit,) = search_index.search(store, query)
    hermes = sqlite3.connect(":memory:")
    hermes.execute("CREATE VIRTUAL TABLE messages_fts USING fts5(content)")
    hermes.execute("INSERT INTO messages_fts(rowid, content) VALUES (1, ?)",
                   (f"{long_text}  {json.dumps(message['tool_calls'], separators=(',', ':'))}",))
    (expected,) = hermes.execute("SELECT snippet(messages_fts, 0, '>>>', '<<<', '...', 40) FROM messages_fts"
                                 " WHERE messages_fts MATCH ?", (query,)).fetchone()
    assert hit["snippet"] == expected and ">>>" in expected
    store.close()


def test_an_earlier_layouts_two_indexes_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    conn = sqlite3.connect(str(path))
    conn.executescript(
        "CREATE TABLE session_guard_recall_docs (doc_id INTEGER PRIMARY KEY);"
        "CREATE VIRTUAL TABLE session_guard_recall_fts USING fts5(scope, body, content='', tokenize='porter');"
        "CREATE VIRTUAL TABLE session_guard_recall_vocab USING fts5vocab(session_guard_recall_fts, 'row');"
        "CREATE TABLE session_guard_search_docs (doc_id INTEGER PRIMARY KEY, snapshot_id TEXT, position INT);"
        "CREATE VIEW session_guard_search_content AS"
        " SELECT doc_id, snapshot_id AS content FROM session_guard_search_docs;"
        "CREATE VIRTUAL TABLE session_guard_search_fts USING fts5(content, content='session_guard_search_content',"
        " content_rowid='doc_id');"
        "CREATE TABLE messages (id INTEGER PRIMARY KEY);")
    conn.close()
    store = GuardStore(path)
    assert not store.has_snapshots("a")  # the first use connects
    store.close()
    conn = sqlite3.connect(str(path))
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    assert not {n for n in names if n.startswith(("session_guard_recall", "session_guard_search"))}
    assert {"session_guard_text_docs", "session_guard_text_fts", "messages"} <= names


def _fts_tables(conn: sqlite3.Connection, schema: str = "main") -> set[str]:
    """The full-text (FTS5) tables of one schema of the connection."""
    return {str(r[0]) for r in conn.execute(
        f"SELECT name FROM {schema}.sqlite_master WHERE type = 'table'"
        " AND sql LIKE 'CREATE VIRTUAL TABLE%USING fts5(%'")}


def test_recall_and_search_query_the_one_index_and_no_other(home: HermesLikeHome) -> None:
    """The guard keeps one full-text index over the snapshot text (ADR 0025): state.db holds
    no other guard FTS5 table, and every full-text query of Hermes's search seam and of
    recall names that table. A second index (a table of its own, or a query of another)
    fails here. The one other table a search matches is the per-connection ``temp`` table
    holding only the hits' text while FTS5's ``snippet()`` reads it, empty afterwards."""
    from hermes_session_guard.store.schema import TEXT_FTS, TEXT_VOCAB
    from hermes_session_guard.summaries.recall import Recall

    store = GuardStore(home.db_path)
    _snapshot(store, "a", "a.snapshot.1", ["alpha", TOKEN, "gamma"])
    with store.reading() as conn:
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        try:
            assert [h["session_id"] for h in search_index.search(store, TOKEN)] == ["a"]
            # (FTS5's own statements inside a query are traced too, as "-- ...")
            searched = [s for s in statements if " MATCH " in s and not s.startswith("--")]
            statements.clear()
            answer = Recall(store=store, session_id="a", lineage=["a"], max_chars=4000).run({"query": TOKEN})
            recalled = [s for s in statements if " MATCH " in s and not s.startswith("--")]
        finally:
            conn.set_trace_callback(None)
        guard_fts = {t for t in _fts_tables(conn) if t.startswith("session_guard_")}
        vocabularies = {str(r[0]) for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE sql LIKE 'CREATE VIRTUAL TABLE%USING fts5vocab(%'")}
        snippets = _fts_tables(conn, "temp")
        leftover = [conn.execute(f"SELECT COUNT(*) FROM temp.{t}").fetchone()[0] for t in snippets]
    assert f"turn 1 {TOKEN}" in answer
    assert guard_fts == {TEXT_FTS} and vocabularies == {TEXT_VOCAB}
    assert snippets == {"session_guard_snippets"} and leftover == [0]
    assert searched and recalled
    for sql in searched + recalled:
        matched = set(re.findall(r"(\w+) MATCH ", sql))
        assert matched <= {TEXT_FTS, "session_guard_snippets"}, sql
    assert any(f"{TEXT_FTS} MATCH" in sql for sql in searched)
    assert all(f"{TEXT_FTS} MATCH" in sql for sql in recalled), recalled
    store.close()
