"""A message another writer stores in the session while the summary is being written
(another agent's turn, another process storing a platform message) stays live after
the compaction, after the compacted block; without the guard a rotating host leaves it
behind in the ended parent."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from .conftest import HOST_HAS_IN_PLACE, MODES, new_agent

SID = "20260528_093510_66bfaec7"
ARRIVING = "arriving: build 7 is green"


def _compress_while_a_message_arrives(db: Any, llm: FakeLLMServer, home: Path, mode: str) -> tuple[Any, list]:
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, mode)
    probe.mark_flushed(agent, messages)
    gate = threading.Event()
    llm.configure(summary_gate=gate)
    box: dict[str, Any] = {}

    def compress() -> None:
        box["result"], _ = agent._compress_context(messages, "sys", approx_tokens=150_000)

    t = threading.Thread(target=compress)
    t.start()
    try:
        assert llm.summary_started.wait(10)
        other = probe.open_db(home / "state.db")
        try:
            other.append_message(session_id=SID, role="user", content=ARRIVING)
        finally:
            other.close()
    finally:
        gate.set()
        t.join(60)
    return agent, box["result"]


@pytest.mark.parametrize("mode", MODES)
def test_a_message_stored_during_the_summary_stays_live(
    guard: Any, db: Any, llm: FakeLLMServer, home: Path, mode: str
) -> None:
    agent, compressed = _compress_while_a_message_arrives(db, llm, home, mode)
    assert agent.session_id == SID
    live = [str(r["content"]) for r in probe.live_messages(home / "state.db", SID)]
    assert live.count(ARRIVING) == 1 and len(live) < probe.SEED_MESSAGES
    assert live.index(ARRIVING) > 0 and live[-1] == ARRIVING  # after the compacted block, in arrival order
    assert [str(m.get("content")) for m in compressed] == live  # the agent continues with what is stored


@pytest.mark.skipif(HOST_HAS_IN_PLACE, reason="0.18.2+ compacts in place on its own")
def test_without_the_guard_the_message_is_left_behind_in_the_ended_parent(
    no_guard: None, db: Any, llm: FakeLLMServer, home: Path
) -> None:
    agent, _ = _compress_while_a_message_arrives(db, llm, home, "rotate")
    child = agent.session_id
    assert child != SID
    assert ARRIVING not in [str(r["content"]) for r in probe.live_messages(home / "state.db", child)]
