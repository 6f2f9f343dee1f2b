"""The recall engine over the guard's own tables: exact text, turn numbers, budget, isolation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hermes_session_guard import host
from hermes_session_guard.store import GuardStore
from hermes_session_guard.summaries.recall import OUTPUT_MARKER, Query, Recall, fts_expression, recall_text

PREFIX = host.summary_prefixes()[0]
SECRET_B = "sk-live-B0B-7781-do-not-leak"


def _conversation(tag: str, planted: dict[int, str], n: int = 40) -> list[dict]:
    out = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        text = f"{tag} turn {i}: routine progress on the deployment checklist."
        if i in planted:
            text += f"\n{planted[i]}"
        out.append({"role": role, "content": text})
    return out


@pytest.fixture
def store(tmp_path: Path) -> GuardStore:
    st = GuardStore(tmp_path / "state.db")
    a = _conversation("A", {
        5: "The migration failed with ERROR 1215 (HY000): Cannot add foreign key constraint",
        9: "I edited /etc/nginx/sites-available/api.conf and set proxy_read_timeout 75s",
        13: "Run `kubectl rollout restart deployment/api -n staging` after the config change",
    })
    st.write_snapshot(snapshot_id="A.snapshot.1", session_id="A", messages=a, index_text=recall_text,
                      created_at=1.0)
    b = _conversation("B", {5: f"The billing API key for staging is {SECRET_B}"})
    st.write_snapshot(snapshot_id="B.snapshot.1", session_id="B", messages=b, index_text=recall_text,
                      created_at=1.0)
    yield st
    st.close()


def recall(store: GuardStore, session: str = "A", max_chars: int = 4000, **args: object) -> str:
    return Recall(store=store, session_id=session, lineage=[session], max_chars=max_chars).run(dict(args))


def test_query_returns_the_exact_text_with_its_turn(store: GuardStore) -> None:
    out = recall(store, query="foreign key error during the migration")
    assert out.startswith(OUTPUT_MARKER)
    assert "ERROR 1215 (HY000): Cannot add foreign key constraint" in out
    assert "--- turn 6 · assistant · snapshot A.snapshot.1" in out
    assert "/etc/nginx/sites-available/api.conf" in recall(store, query="nginx config file for the api")
    assert "kubectl rollout restart deployment/api -n staging" in recall(store, query="command to restart the api")


def test_turn_range_returns_those_turns_verbatim(store: GuardStore) -> None:
    out = recall(store, turn_start=10, turn_end=11)
    assert "--- turn 10 · assistant" in out and "--- turn 11 · user" in out
    assert "proxy_read_timeout 75s" in out
    assert "turn 12 ·" not in out


def test_output_is_bounded(store: GuardStore) -> None:
    out = recall(store, max_chars=300, turn_start=1, turn_end=40)
    assert len(out) <= 300
    assert out.startswith(OUTPUT_MARKER)


def test_summaries_and_recall_answers_are_not_indexed() -> None:
    assert recall_text({"role": "user", "content": f"{PREFIX}\nbody"}) is None
    assert recall_text({"role": "tool", "content": f"{OUTPUT_MARKER} 1 verbatim passage"}) is None
    assert recall_text({"role": "user", "content": "hello"}) == "hello"


@pytest.mark.parametrize("args", [
    {"query": SECRET_B},
    {"query": "billing API key staging", "session_id": "B"},
    {"query": "billing key", "snapshot_id": "B.snapshot.1"},
    {"turn_start": 1, "turn_end": 40, "snapshot_id": "B.snapshot.1"},
    {"query": "' OR 1=1; DROP TABLE session_guard_snapshots; --"},
    {"query": 'scope:* OR body:"sk" OR "B0B"*'},
    {"query": "billing) OR (key", "lineage": ["A", "B"], "session_ids": ["B"]},
])
def test_another_conversation_is_never_read(store: GuardStore, args: dict) -> None:
    out = recall(store, **args)
    body = out.split("\n", 1)[1] if "\n" in out else ""  # the first line echoes the query
    assert SECRET_B not in body
    assert "billing API key for staging is" not in out and "B turn" not in out
    assert store.list_snapshots("B")  # nothing was dropped either


def test_a_foreign_snapshot_id_is_refused_by_name(store: GuardStore) -> None:
    out = recall(store, query="billing", snapshot_id="B.snapshot.1")
    assert "is not part of this conversation" in out


def test_the_fts_expression_only_holds_quoted_words() -> None:
    q = Query.parse('error "exact phrase" scope:x OR) NEAR(a b) *')
    expr = fts_expression(q.words)
    term = r'"[a-z0-9]+"\*?'
    match = rf"(?:{term}|\({term}(?: OR {term})+\))"
    assert re.fullmatch(rf"{match}(?: OR {match})*", expr), expr
    assert "scope" not in re.sub(term, "", expr)


def test_a_word_matches_the_forms_the_index_holds_of_it(tmp_path: Path) -> None:
    st = GuardStore(tmp_path / "state.db")
    words = "deploy deploys deploying deployed deployment deplorable happy happiness e1215 e12150 go gone"
    st.write_snapshot(snapshot_id="A.snapshot.1", session_id="A",
                      messages=[{"role": "user", "content": w} for w in words.split()] * 2, index_text=recall_text)
    assert st.word_forms("deploying") == {"deploy": 2, "deploys": 2, "deploying": 2, "deployed": 2}
    assert set(st.word_forms("deployments")) == {"deployment"}
    assert set(st.word_forms("happy")) == {"happy", "happiness"}
    assert set(st.word_forms("deplore")) == {"deplorable"}
    assert st.word_forms("e1215") == {"e1215": 2}  # a digit: the word alone
    assert st.word_forms("go") == {"go": 2}  # a stem shorter than three letters: the word alone
    assert st.word_forms("zebra") == {}
    st.close()


def test_a_word_finds_other_forms_of_it(store: GuardStore) -> None:
    assert "ERROR 1215 (HY000)" in recall(store, query="migrating failures")
    assert "proxy_read_timeout 75s" in recall(store, query="edit nginx")


def test_snapshots_written_without_the_index_are_indexed_on_first_recall(tmp_path: Path) -> None:
    """Snapshots from an older guard (no recall index yet) become searchable."""
    st = GuardStore(tmp_path / "state.db")
    st.write_snapshot(snapshot_id="A.snapshot.old", session_id="A",
                      messages=_conversation("A", {7: "legacy detail: vault path secret/data/ledgerly/prod"}))
    assert "secret/data/ledgerly/prod" not in recall(st, query="vault path")
    assert st.index_missing_snapshots(["A"], recall_text) == 1
    assert "secret/data/ledgerly/prod" in recall(st, query="vault path")
    assert st.index_missing_snapshots(["A"], recall_text) == 0
    st.close()


def test_unindexed_snapshots_of_every_session_enter_the_index_once(tmp_path: Path) -> None:
    """A compression writes its snapshot without indexing it; the first recall indexes every
    snapshot of the file (so document statistics are those of an index built eagerly),
    and a snapshot another connection already indexed is not indexed again."""
    eager, lazy = GuardStore(tmp_path / "eager.db"), GuardStore(tmp_path / "lazy.db")
    a = _conversation("A", {7: "vault path secret/data/ledgerly/prod"})
    b = _conversation("B", {3: "vault path secret/data/other"})
    for st, index in ((eager, recall_text), (lazy, None)):
        st.write_snapshot(snapshot_id="A.snapshot.1", session_id="A", messages=a, index_text=index, created_at=1.0)
        st.write_snapshot(snapshot_id="B.snapshot.1", session_id="B", messages=b, index_text=index, created_at=2.0)
    assert lazy.doc_count() == 0
    other = GuardStore(tmp_path / "lazy.db")  # a second process's connection
    assert other.index_missing_snapshots(["B"], recall_text) == 1
    assert lazy.index_missing_snapshots(None, recall_text) == 1  # only A was left
    assert lazy.index_missing_snapshots(None, recall_text) == 0
    assert lazy.doc_count() == eager.doc_count() > 0
    assert lazy.document_counts(["vault"]) == eager.document_counts(["vault"]) == {"vault": 2}
    assert recall(lazy, query="vault path") == recall(eager, query="vault path")
    for st in (eager, lazy, other):
        st.close()
