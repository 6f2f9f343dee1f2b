"""The session-id contract on the real host: direct compression, a preflight turn,
the next turn's persistence, aborted compressions, and anomaly A without the guard."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import audit
from hermes_session_guard.selftest import probe

from ..fake_llm import ScriptedLLMServer
from .conftest import HOST_HAS_IN_PLACE, MODES, log_tags_in, new_agent

SID = "20260528_093510_66bfaec7"
SYSTEM = "You are a test agent."


def _seeded_agent(db: Any, llm: ScriptedLLMServer, mode: str, n: int = probe.SEED_MESSAGES) -> tuple[Any, list]:
    messages = probe.seed_messages(n)
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, mode)
    probe.mark_flushed(agent, messages)
    return agent, messages


def _gateway_contextvar() -> str | None:
    from gateway import session_context

    var = getattr(session_context, "_SESSION_ID", None)
    return var.get(None) if var is not None else None


def _log_tag() -> str | None:
    import hermes_logging

    return getattr(hermes_logging._session_context, "session_id", None)


def _events(runtime: Any, op_id: str | None = None) -> list[dict]:
    events = [e for e in audit.read_events(runtime.audit_path) if e.get("op_id")]
    return [e for e in events if op_id is None or e["op_id"] == op_id]


@pytest.mark.parametrize("mode", MODES)
def test_direct_compression_keeps_every_id(guard: Any, db: Any, llm: ScriptedLLMServer, home: Path, mode: str) -> None:
    agent, messages = _seeded_agent(db, llm, mode)
    import hermes_logging

    hermes_logging.set_session_context(SID)
    os.environ["HERMES_SESSION_ID"] = SID
    var_before = _gateway_contextvar()

    with probe.capture_host_compression_logs() as lines:
        compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)

    assert len(compressed) < len(messages)
    # 1. every place that names the live session still names S
    assert agent.session_id == SID
    assert os.environ["HERMES_SESSION_ID"] == SID
    assert _gateway_contextvar() == var_before
    assert _log_tag() == SID
    # 2. the host's own started/done lines name the same id
    ids = probe.session_ids_in(lines)
    assert len(ids) >= 2 and set(ids) == {SID}, lines
    assert set(log_tags_in(lines)) == {SID}, lines
    # 3. no child, not ended, the compacted transcript is live under S
    rows = probe.sessions_table(home / "state.db")
    assert [r["id"] for r in rows] == [SID]
    assert rows[0]["ended_at"] is None and rows[0]["end_reason"] is None
    live = probe.live_messages(home / "state.db", SID)
    assert [m["content"] for m in live] == [m["content"] for m in compressed]
    # 4. the pre-compression transcript is a verbatim snapshot under a derived id
    store = guard.store_for(home / "state.db")
    (snap,) = store.list_snapshots(SID)
    assert snap.snapshot_id.startswith(f"{SID}.snapshot.")
    kept = store.snapshot_messages(snap.snapshot_id)
    assert [(m["role"], m["content"]) for m in kept] == [(m["role"], m["content"]) for m in messages]
    assert snap.snapshot_id not in {r["id"] for r in rows}  # never promoted to live
    # 5. audit: one op, one session id, started + done with the numbers
    events = _events(guard)
    op_ids = {e["op_id"] for e in events if e["event"] == "compression.started"}
    assert len(op_ids) == 1
    op = _events(guard, op_ids.pop())
    assert [e["event"] for e in op] == ["compression.started", "compression.done"]
    assert {e["session_id"] for e in op} == {SID}
    done = op[-1]
    assert done["session_id_after"] == SID
    assert done["messages_before"] == len(messages) and done["messages_after"] == len(compressed)
    assert done["snapshot_id"] == snap.snapshot_id and done["duration_ms"] >= 0
    assert all("ts" in e for e in op)


@pytest.mark.parametrize("mode", MODES)
def test_next_turn_is_persisted_after_the_compacted_transcript(
    guard: Any, db: Any, llm: ScriptedLLMServer, home: Path, mode: str
) -> None:
    agent, messages = _seeded_agent(db, llm, mode)
    compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    llm.configure(reply_text="post-compression answer")
    result = agent.run_conversation("what did we decide?", conversation_history=compressed)

    assert agent.session_id == SID
    live = probe.live_messages(home / "state.db", SID)
    contents = [m["content"] for m in live]
    assert contents[: len(compressed)] == [m["content"] for m in compressed]
    assert contents[len(compressed):] == ["what did we decide?", "post-compression answer"]
    assert result["final_response"] == "post-compression answer"
    assert [r["id"] for r in probe.sessions_table(home / "state.db")] == [SID]
    # the model saw the compacted history on that turn
    # (the turn's own request, the longest that carries the question: 0.22 then asks for a
    # title with the question alone)
    last_chat = max((r.body["messages"] for r in llm.chat_requests()
                     if any("what did we decide?" in str(m.get("content")) for m in r.body["messages"])), key=len)
    assert any("turn-0:" in str(m.get("content")) for m in last_chat)
    assert not any("turn-20:" in str(m.get("content")) for m in last_chat)


@pytest.mark.parametrize("mode", MODES)
def test_preflight_compression_in_a_real_turn_keeps_the_id(
    guard: Any, db: Any, llm: ScriptedLLMServer, home: Path, mode: str
) -> None:
    agent, messages = _seeded_agent(db, llm, mode)
    llm.configure(reply_text="answer after preflight")
    with probe.capture_host_compression_logs() as lines:
        result = agent.run_conversation("next question", conversation_history=messages)

    assert lines, "preflight compression did not run"
    assert set(probe.session_ids_in(lines)) == {SID}
    assert agent.session_id == SID
    assert result["final_response"] == "answer after preflight"
    rows = probe.sessions_table(home / "state.db")
    assert [r["id"] for r in rows] == [SID] and rows[0]["ended_at"] is None
    live = [m["content"] for m in probe.live_messages(home / "state.db", SID)]
    assert live[-2:] == ["next question", "answer after preflight"]
    assert len(live) < len(messages)
    assert len(guard.store_for(home / "state.db").list_snapshots(SID)) >= 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("failure", [("status", 500), ("empty",)])
def test_aborted_compression_changes_nothing(
    guard: Any, db: Any, llm: ScriptedLLMServer, home: Path, mode: str, failure: tuple
) -> None:
    agent, messages = _seeded_agent(db, llm, mode)
    llm.configure(fail_all_summaries=failure)
    contents = [m["content"] for m in messages]

    returned, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)

    assert agent.session_id == SID
    assert [m["content"] for m in returned] == contents
    assert [m["content"] for m in probe.live_messages(home / "state.db", SID)] == contents
    assert [r["id"] for r in probe.sessions_table(home / "state.db")] == [SID]
    assert guard.store_for(home / "state.db").list_snapshots(SID) == []
    names = [e["event"] for e in _events(guard)]
    assert names[0] == "compression.started"
    assert names[-1] in ("compression.failed", "compression.skipped")
    last = _events(guard)[-1]
    assert last["reason"], last


@pytest.mark.skipif(HOST_HAS_IN_PLACE and "rotate" not in MODES, reason="host never rotates")
def test_anomaly_a_reproduces_without_the_guard(no_guard: None, db: Any, llm: ScriptedLLMServer, home: Path) -> None:
    """Hermes as shipped (rotation mode): the done line names a new id the started
    line never did, and the conversation moves to a child session."""
    agent, messages = _seeded_agent(db, llm, "rotate")
    with probe.capture_host_compression_logs() as lines:
        agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    ids = probe.session_ids_in(lines)
    assert ids[0] == SID and ids[-1] != SID
    assert agent.session_id != SID
    rows = {r["id"]: r for r in probe.sessions_table(home / "state.db")}
    assert rows[SID]["end_reason"] == "compression"
    assert rows[agent.session_id]["parent_session_id"] == SID


@pytest.mark.parametrize("mode", MODES)
def test_resumed_turn_with_preflight_stores_the_compacted_transcript_once(
    guard: Any, db: Any, llm: ScriptedLLMServer, home: Path, mode: str
) -> None:
    """A resumed conversation (history loaded from state.db, as the CLI and the
    gateway do, on an agent that never flushed) compresses before its turn: state.db
    must then hold the compacted transcript exactly once, followed by the turn."""
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    history = db.get_messages_as_conversation(SID)
    agent = new_agent(db, llm, SID, mode)
    llm.configure(reply_text="answer after resume")

    result = agent.run_conversation("resumed question", conversation_history=history)

    assert result["final_response"] == "answer after resume"
    assert agent.session_id == SID
    done = [e for e in _events(guard) if e["event"] == "compression.done"]
    assert len(done) == 1, [e["event"] for e in _events(guard)]
    assert done[0]["messages_before"] == len(messages) + 1  # preflight compacts the history and the new question
    live = [m["content"] for m in probe.live_messages(home / "state.db", SID)]
    assert len(live) == done[0]["messages_after"] + 1, live  # the compacted set, then the answer
    assert live[-2:] == ["resumed question", "answer after resume"]
    assert len(set(live)) == len(live), "a message was stored twice"
    # and a resume (CLI or gateway) loads it back in that order (0.17 loads ORDER BY timestamp)
    assert [m["content"] for m in db.get_messages_as_conversation(SID)] == live
    assert [r["id"] for r in probe.sessions_table(home / "state.db")] == [SID]


@pytest.mark.parametrize("mode", MODES)
def test_agent_without_a_session_db_keeps_the_id_and_the_snapshot(
    guard: Any, llm: ScriptedLLMServer, home: Path, mode: str
) -> None:
    """The shape of the gateway's session-hygiene agent up to 0.17 (no SessionDB:
    the gateway rewrites the transcript itself afterwards). The host cannot rotate;
    the guard still keeps the pre-compression transcript in $HERMES_HOME/state.db."""
    messages = probe.seed_messages()
    agent = new_agent(None, llm, SID, mode)
    with probe.capture_host_compression_logs() as lines:
        compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)

    assert len(compressed) < len(messages)
    assert agent.session_id == SID
    assert set(probe.session_ids_in(lines)) == {SID}
    (snap,) = guard.store_for(home / "state.db").list_snapshots(SID)
    assert snap.message_count == len(messages)
    done = [e for e in _events(guard) if e["event"] == "compression.done"]
    assert [(e["session_id"], e["session_id_after"]) for e in done] == [(SID, SID)]
