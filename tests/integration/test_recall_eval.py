"""The recall eval on the real host: the planted specifics of the fixture conversation are
compacted away (all of them on most releases; 0.22.2 keeps a longer tail live), and recall
brings back the exact string for at least 98 % of the queries a model would send, over every
planted item and over the compacted ones (``recall_eval.verdict``, as scripts/eval_recall.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hermes_session_guard.selftest import recall_eval
from hermes_session_guard.selftest.fake_llm import FakeLLMServer


def test_fixture_plants_at_least_fifty_specifics_in_the_compacted_part() -> None:
    fixture = recall_eval.load_fixture()
    planted = fixture["planted"]
    assert len(planted) >= 50
    assert len({p["text"] for p in planted}) == len(planted)
    assert {p["kind"] for p in planted} >= {"error", "path", "config", "command", "number"}
    for p in planted:
        assert p["text"] in fixture["messages"][p["turn"] - 1]["content"]
        assert p["text"] not in p["query"]  # queries describe the detail, they do not quote it


def test_recall_returns_the_exact_planted_string(guard: Any, llm: FakeLLMServer, home: Path) -> None:
    fixture = recall_eval.load_fixture()
    recall_eval.write_eval_config(home, llm.base_url, fixture)

    result = recall_eval.run_recall_eval(home, llm.base_url, fixture)

    assert result.compacted is not None
    # Recall over every planted turn and over the ones the host compacted; turns a release
    # leaves outside its compacted span (0.22.2 keeps a longer tail) are not held against it.
    ok, why = recall_eval.verdict(result)
    misses = [(r["id"], r["query"]) for r in result.rows if not r["hit"]]
    assert ok, (why, misses)
