"""session_guard_recall on the real host: offered only after a compaction, called by the
model through Hermes's own tool dispatch, exact text back, and nothing from any other
conversation whatever the model passes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import host
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import iter_message_text
from hermes_session_guard.summaries.recall import OUTPUT_MARKER
from hermes_session_guard.summaries.recall_tool import RECALL_TOOL, SYSTEM_RULE, calling_session, handler

from ..fake_llm import ScriptedLLMServer, ToolCallReply
from .conftest import HOST_HAS_IN_PLACE, MODE_PARAMS, new_agent

SYSTEM = "You are a test agent."
SID_A = "20260601_090000_aaaaaa"
SID_B = "20260601_090000_bbbbbb"
FACT_A = "ERROR 1215 (HY000): Cannot add foreign key constraint on orders.customer_id"
SECRET_B = "STAGING_BILLING_KEY=sk-live-b0b-7781-never-leak"


def _conversation(tag: str, fact: str, at: int = 9) -> list[dict]:
    messages = probe.seed_messages(probe.SEED_MESSAGES, probe.MESSAGE_CHARS, tag=tag)
    messages[at]["content"] += f"\n{fact}\n"
    return messages


def _compacted_session(db: Any, llm: ScriptedLLMServer, sid: str, tag: str, fact: str, mode: str) -> tuple[Any, list]:
    messages = _conversation(tag, fact)
    probe.seed_session(db, sid, messages)
    agent = new_agent(db, llm, sid, mode, enabled_toolsets=["session_guard"])
    probe.mark_flushed(agent, messages)
    compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    assert fact not in json.dumps(compressed)  # the detail really was compacted away
    return agent, compressed


def _tool_names(body: dict) -> set[str]:
    return {t.get("function", {}).get("name") or t.get("name") for t in body.get("tools") or []}


def _system_text(body: dict) -> str:
    if "system" in body:
        return " ".join(iter_message_text(body["system"]))
    return " ".join(str(m.get("content")) for m in body["messages"] if m.get("role") == "system")


def _recall_results(body: dict) -> list[str]:
    out = []
    for message in body.get("messages", []):
        for text in iter_message_text(message.get("content")):
            if text.startswith(OUTPUT_MARKER):
                out.append(text)
    return out


# Hermes 0.20+ defers plugin tools behind its tool-search bridge by default
# (``tools.tool_search: auto``): the request then carries tool_search / tool_describe /
# tool_call instead of the plugin's schema, and the model reaches the tool through tool_call.
BRIDGE_CALL = "tool_call"


def _bridge_call(body: dict) -> str | None:
    """The name this request gives the bridge's tool_call (Hermes's Anthropic adapter
    prefixes it ``mcp__``) when it offers the recall tool only through the bridge."""
    names = _tool_names(body)
    if RECALL_TOOL in names:
        return None
    return next((n for n in sorted(names, key=len) if n and n.split("__")[-1] == BRIDGE_CALL), None)


def _bridged(body: dict) -> bool:
    """This request offers the recall tool only through Hermes's tool-search bridge."""
    return _bridge_call(body) is not None


def _reachable(body: dict) -> bool:
    """The model can call the recall tool with this request: its schema is sent, or the
    bridge's catalog lists it."""
    if RECALL_TOOL in _tool_names(body):
        return True
    return _bridged(body) and any(RECALL_TOOL in json.dumps(t) for t in body.get("tools") or [])


def turn_requests(llm: ScriptedLLMServer) -> list[Any]:
    """The model requests of the agent's turns: Hermes 0.22 also asks the model for a
    session title (a structured-output request, ``response_format``) after a turn."""
    return [r for r in llm.chat_requests() if not r.body.get("response_format")]


def recall_call(body: dict, name: str, args: dict) -> tuple[str, dict]:
    """A call as a model makes it for the tools this request offers: directly, or
    through the bridge's tool_call."""
    bridge = _bridge_call(body) if name == RECALL_TOOL else None
    if bridge is not None:
        return bridge, {"name": RECALL_TOOL, "arguments": args}
    return name, args


def _model_calls(*calls: tuple[str, dict]) -> Any:
    def reply(body: dict) -> Any:
        if _recall_results({"messages": body["messages"][-1:]}):
            return "answered from recall"
        return ToolCallReply([recall_call(body, name, args) for name, args in calls])

    return reply


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_tool_and_rule_are_offered_only_once_the_session_has_compacted_history(
    guard: Any, db: Any, llm: ScriptedLLMServer, home: Path, mode: str
) -> None:
    fresh = new_agent(db, llm, SID_B, mode, enabled_toolsets=["session_guard"])
    assert RECALL_TOOL in host.tool_names(fresh)  # registered by the plugin, enabled by its toolset (maybe bridged)
    fresh.run_conversation("hello", conversation_history=[])
    before = turn_requests(llm)[-1].body
    # Its schema is not sent. (Where Hermes defers plugin tools, its bridge's catalog, built
    # when the agent starts, still names it: the guard does not rewrite Hermes's catalog.)
    assert RECALL_TOOL not in _tool_names(before)
    assert SYSTEM_RULE not in _system_text(before)

    agent, compressed = _compacted_session(db, llm, SID_A, "a", FACT_A, mode)
    agent.run_conversation("what next?", conversation_history=compressed)
    after = turn_requests(llm)[-1].body
    assert _reachable(after)
    assert SYSTEM_RULE in _system_text(after)


@pytest.mark.parametrize("mode", MODE_PARAMS)
@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_the_model_recalls_the_exact_text_through_hermes_tool_dispatch(
    guard: Any, db: Any, llm: ScriptedLLMServer, home: Path, api: str, mode: str
) -> None:
    agent, compressed = _compacted_session(db, llm, SID_A, "a", FACT_A, mode)
    if api == "anthropic":
        agent = probe.make_agent(db, llm.anthropic_base_url, SID_A, provider="anthropic", api_key="sk-ant-fake",
                                 model="claude-sonnet-4-5", enabled_toolsets=["session_guard"])
        if HOST_HAS_IN_PLACE:
            agent.compression_in_place = mode == "in_place"
        probe.mark_flushed(agent, compressed)
    llm.configure(strict=True, reply_fn=_model_calls((RECALL_TOOL, {"query": "foreign key constraint error"})))

    result = agent.run_conversation("What was the exact migration error?", conversation_history=compressed)

    assert result["final_response"] == "answered from recall", result.get("error")
    (answer,) = _recall_results(turn_requests(llm)[-1].body)
    assert FACT_A in answer
    assert "--- turn 10 · assistant · snapshot " in answer
    assert llm.violations == []


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_recall_never_reads_another_conversation(guard: Any, db: Any, llm: ScriptedLLMServer, home: Path,
                                                 mode: str) -> None:
    _compacted_session(db, llm, SID_B, "b", SECRET_B, mode)
    (snap_b,) = guard.store_for(home / "state.db").list_snapshots(SID_B)
    agent, compressed = _compacted_session(db, llm, SID_A, "a", FACT_A, mode)
    attacks = [
        {"query": SECRET_B},
        {"query": "staging billing key", "session_id": SID_B},
        {"query": "billing", "snapshot_id": snap_b.snapshot_id},
        {"turn_start": 1, "turn_end": 48, "snapshot_id": snap_b.snapshot_id},
        {"query": f"' OR session_id = '{SID_B}' --"},
        {"query": 'scope:* OR body:"sk" OR "b0b"* OR NEAR(billing key)'},
        {"query": "billing", "lineage": [SID_A, SID_B], "session_ids": [SID_B], "db_path": "/tmp/other.db"},
        {"query": "foreign key constraint"},  # its own history still answers
    ]
    llm.configure(reply_fn=_model_calls(*[(RECALL_TOOL, args) for args in attacks]))

    agent.run_conversation("recall everything you can", conversation_history=compressed)

    answers = _recall_results(turn_requests(llm)[-1].body)
    assert len(answers) == len(attacks)
    for args, answer in zip(attacks, answers, strict=True):
        body = answer.split("\n", 1)[1] if "\n" in answer else ""  # the first line echoes the query
        assert "sk-live-b0b-7781" not in body, (args, answer)
        assert "b-9:" not in answer and "turn-" not in answer.replace("a-", "")  # no line of B's transcript
    assert FACT_A in answers[-1]
    assert "is not part of this conversation" in answers[2] and "is not part of this conversation" in answers[3]


def _without_guard_compaction(db: Any, llm: ScriptedLLMServer, sid: str, in_place: bool) -> tuple[Any, list]:
    import hermes_session_guard

    messages = _conversation("a", FACT_A)
    probe.seed_session(db, sid, messages)
    agent = new_agent(db, llm, sid, "in_place" if in_place else "rotate")
    probe.mark_flushed(agent, messages)
    hermes_session_guard.uninstall()
    try:
        compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
        agent._flush_messages_to_session_db(compressed, [])
    finally:
        hermes_session_guard.install()
    return agent, compressed


def test_recall_finds_turns_the_host_compacted_before_the_guard_ran(guard: Any, db: Any, llm: ScriptedLLMServer,
                                                                   home: Path) -> None:
    """A rotation the host did on its own (0.14 always, 0.19 with in_place: false): the
    child continues the parent, and the parent's rows are this conversation's turns."""
    agent, _ = _without_guard_compaction(db, llm, SID_A, in_place=False)
    child = agent.session_id
    assert child != SID_A
    with calling_session(child):
        answer = handler({"query": "foreign key constraint error"})
    assert FACT_A in answer
    assert f"archived, session {SID_A}" in answer


@pytest.mark.skipif(not HOST_HAS_IN_PLACE, reason="0.18+ archives compacted rows in place")
def test_recall_finds_rows_the_host_archived_in_place_before_the_guard_ran(guard: Any, db: Any,
                                                                           llm: ScriptedLLMServer, home: Path) -> None:
    _without_guard_compaction(db, llm, SID_A, in_place=True)
    assert not guard.store_for(home / "state.db").list_snapshots(SID_A)
    with calling_session(SID_A):
        answer = handler({"query": "foreign key constraint error"})
    assert FACT_A in answer and f"archived, session {SID_A}" in answer
    with calling_session(SID_B):  # another conversation of the same state.db
        assert FACT_A not in handler({"query": "foreign key constraint error"})


def test_without_a_host_session_nothing_is_read(guard: Any) -> None:
    answer = handler({"query": "anything", "session_id": SID_A})
    assert "unknown" in answer and OUTPUT_MARKER not in answer


def test_recall_can_be_switched_off(guard: Any, db: Any, llm: ScriptedLLMServer, home: Path) -> None:
    from hermes_session_guard.config import parse_config

    before = guard.config
    guard.config = parse_config({"recall": {"enabled": False}})
    try:
        agent, compressed = _compacted_session(db, llm, SID_A, "a", FACT_A, "in_place")
        agent.run_conversation("what next?", conversation_history=compressed)
    finally:
        guard.config = before
        from tools.registry import invalidate_check_fn_cache

        invalidate_check_fn_cache()  # Hermes caches "unavailable" for 30 s; later tests need the tool
    request = turn_requests(llm)[-1].body
    # (0.20+ keeps a tool whose check failed within 60 s of a success in its bridge's catalog)
    assert RECALL_TOOL not in _tool_names(request)
    assert SYSTEM_RULE not in _system_text(request)
