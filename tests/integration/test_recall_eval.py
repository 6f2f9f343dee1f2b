"""The recall eval on the real host: every planted specific of the fixture conversation
is compacted away, and recall brings back the exact string for at least 98 % of the
queries a model would send."""

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
    assert result.outside == []  # the host compacted every planted turn
    misses = [(r["id"], r["query"]) for r in result.rows if not r["hit"]]
    assert result.score >= recall_eval.TARGET, misses
