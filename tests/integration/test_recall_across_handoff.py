"""session_guard_recall across a ``fresh_session`` hand-off: the child reaches the
snapshots of the parent its hand-off record (and packet) names, through Hermes's own
tool dispatch, and nothing of any other conversation of the same state.db."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.config import GuardConfig, parse_config
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import iter_message_text
from hermes_session_guard.summaries.recall import OUTPUT_MARKER
from hermes_session_guard.summaries.recall_tool import RECALL_TOOL, SYSTEM_RULE, calling_session, handler, lineage

from ..fake_llm import ScriptedLLMServer, ToolCallReply
from .conftest import MODE_PARAMS, new_agent
from .test_recall_tool import _reachable, recall_call, turn_requests

SYSTEM = "You are a test agent."
PARENT = "20260602_090000_aaaaaa"
OTHER = "20260602_090000_bbbbbb"
BRANCH = "20260602_090500_cccccc"
FACT = "ERROR 1215 (HY000): Cannot add foreign key constraint on orders.customer_id"
SECRET = "STAGING_BILLING_KEY=sk-live-b0b-7781-never-leak"


@pytest.fixture
def fresh_session(guard: Any) -> Iterator[Callable[[], Any]]:
    import hermes_session_guard

    def apply() -> Any:
        return hermes_session_guard.install(parse_config(
            {"handoff": {"enabled": True, "mode": "fresh_session", "after_compressions": 1}}))

    yield apply
    hermes_session_guard.install(GuardConfig())


def _conversation(tag: str, fact: str) -> list[dict[str, Any]]:
    messages = probe.seed_messages(tag=tag)
    messages[9]["content"] += f"\n{fact}\n"
    return messages


def _compacted(db: Any, llm: ScriptedLLMServer, sid: str, tag: str, fact: str, mode: str) -> tuple[Any, list]:
    messages = _conversation(tag, fact)
    probe.seed_session(db, sid, messages)
    agent = new_agent(db, llm, sid, mode, enabled_toolsets=["session_guard"])
    probe.mark_flushed(agent, messages)
    compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    assert fact not in json.dumps(compressed)
    return agent, compressed


def _recall_results(body: dict) -> list[str]:
    return [t for m in body.get("messages", []) for t in iter_message_text(m.get("content"))
            if t.startswith(OUTPUT_MARKER)]


def _model_calls(*calls: tuple[str, dict]) -> Any:
    def reply(body: dict) -> Any:
        if _recall_results({"messages": body["messages"][-1:]}):
            return "answered from recall"
        return ToolCallReply([recall_call(body, name, args) for name, args in calls])

    return reply


def _tool_names(body: dict) -> set[str]:
    return {t.get("function", {}).get("name") or t.get("name") for t in body.get("tools") or []}


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_a_fresh_session_child_recalls_its_parents_snapshots_and_nothing_else(
    fresh_session: Any, db: Any, llm: ScriptedLLMServer, home: Path, mode: str
) -> None:
    runtime = fresh_session()
    store = runtime.store_for(home / "state.db")
    # another conversation of the same state.db, compacted without a hand-off
    import hermes_session_guard

    hermes_session_guard.install(GuardConfig())
    _compacted(db, llm, OTHER, "b", SECRET, mode)
    (snap_other,) = store.list_snapshots(OTHER)
    runtime = fresh_session()

    agent, seeded = _compacted(db, llm, PARENT, "a", FACT, mode)
    child = agent.session_id
    assert child != PARENT  # the hand-off forked
    (snap_parent,) = store.list_snapshots(PARENT)
    assert store.list_snapshots(child) == []
    assert lineage(home / "state.db", child, store) == [child, PARENT]
    # a session that claims the parent in state.db without a hand-off record (a branch) is not its lineage
    db.create_session(session_id=BRANCH, source="cli", model="fake-model", parent_session_id=PARENT)
    assert lineage(home / "state.db", BRANCH, store) == [BRANCH]

    attacks = [
        {"query": "foreign key constraint error"},  # the parent's compacted turn: answered
        {"query": SECRET},
        {"query": "staging billing key", "session_id": OTHER},
        {"query": "billing", "snapshot_id": snap_other.snapshot_id},
        {"turn_start": 1, "turn_end": 48, "snapshot_id": snap_other.snapshot_id},
        {"query": "billing", "lineage": [child, PARENT, OTHER], "session_ids": [OTHER]},
        {"turn_start": 10, "turn_end": 10, "snapshot_id": snap_parent.snapshot_id},  # the parent's: answered
        {"query": "foreign key", "snapshot_id": snap_parent.snapshot_id},  # the parent's: answered
    ]
    llm.configure(reply_fn=_model_calls(*[(RECALL_TOOL, args) for args in attacks]))
    agent.run_conversation("what was the exact migration error?", conversation_history=seeded)

    first = turn_requests(llm)[-2].body  # the child's request that called the tool
    assert _reachable(first)  # offered to the child: its lineage has compacted history
    assert any(SYSTEM_RULE in str(m.get("content")) for m in first["messages"] if m.get("role") == "system") \
        or SYSTEM_RULE in " ".join(iter_message_text(first.get("system")))
    answers = _recall_results(turn_requests(llm)[-1].body)
    assert len(answers) == len(attacks)
    assert FACT in answers[0] and f"snapshot {snap_parent.snapshot_id}" in answers[0]
    assert f"--- turn 10 · assistant · snapshot {snap_parent.snapshot_id}" in answers[-2]
    assert FACT in answers[-1]
    for args, answer in zip(attacks, answers, strict=True):
        body = answer.split("\n", 1)[1] if "\n" in answer else ""  # the first line echoes the query
        assert "sk-live-b0b-7781" not in body and "b-9:" not in answer, (args, answer)
    assert "is not part of this conversation" in answers[3] and "is not part of this conversation" in answers[4]

    # the unrelated conversation and the branch reach nothing of the parent or the child
    for caller in (OTHER, BRANCH):
        with calling_session(caller):
            assert FACT not in handler({"query": "foreign key constraint error"})
            assert FACT not in handler({"turn_start": 10, "turn_end": 10, "snapshot_id": snap_parent.snapshot_id})
