"""With turn ordering off (``session_guard: {turns: {enabled: false}}``), turns of one
session can still run on a history read before a compaction they did not see: the
generation check makes them adopt the live transcript. Adoption keeps each of their own
messages as a message of its own, in order, after the live transcript: never folded
into another turn's prompt (Hermes merges two adjacent user messages into one), never
dropped, never reordered."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.config import parse_config
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer
from hermes_session_guard.summaries.tags import is_summary_text

from .api_turns import _text, answer_for, echo_last_user, marker
from .conftest import anchor_on_real_usage
from .waiting import TURN_WAITS, parked_in, place, wait_for

# Where the second turn waits: for the first turn (turn order) or for its compression's lock.
_WAITS = [*TURN_WAITS, place("acquire", "locks", "session_lock.py")]

SID = "20260701_110000_adopt"


@pytest.fixture
def turns_off(guard: Any) -> Iterator[Any]:
    before = guard.config
    # The compression lock waits long enough for the held summary call below.
    guard.config = parse_config({"turns": {"enabled": False}, "lock": {"wait_seconds": 60}})
    try:
        yield guard
    finally:
        guard.config = before


def _turn(home: Path, llm: FakeLLMServer, history: list[dict[str, Any]], text: str,
          out: dict[str, Any]) -> None:
    """One turn on its own agent and connection, with the history its caller read earlier."""
    db = probe.open_db(home / "state.db")
    try:
        agent = probe.make_agent(db, llm.base_url, SID)
        anchor_on_real_usage(agent)
        probe.mark_flushed(agent, history)
        result = agent.run_conversation(text, conversation_history=list(history))
        out[text] = (str(result.get("final_response") or "").strip(), agent.session_id)
    finally:
        db.close()


def test_turns_behind_a_compaction_adopt_it_without_merging_prompts(turns_off: Any, home: Path, db: Any,
                                                                    llm: FakeLLMServer) -> None:
    probe.seed_session(db, SID, probe.seed_messages())
    stale = db.get_messages_as_conversation(SID)  # every caller read the history before the compaction
    gate = threading.Event()
    llm.configure(summary_gate=gate, reply_fn=echo_last_user)
    sent = [marker(i, "adopt") for i in range(3)]
    replies: dict[str, Any] = {}
    first = threading.Thread(target=_turn, args=(home, llm, stale, sent[0], replies))
    second = threading.Thread(target=_turn, args=(home, llm, stale, sent[1], replies))
    try:
        first.start()
        assert llm.summary_started.wait(60), "the first turn never reached the summary call"
        second.start()  # behind the compaction in progress: waits for its lock, then adopts
        assert wait_for(lambda: parked_in(_WAITS, second) or not second.is_alive()
                        or len(llm.summary_requests()) > 1, timeout=60), "the second turn neither waited nor ran"
    finally:
        gate.set()
    first.join(180)
    second.join(180)
    _turn(home, llm, stale, sent[2], replies)  # later, still on the old history: adopts again

    problems = []
    for text in sent:
        reply, sid_after = replies.get(text, ("", None))
        if reply != answer_for(text):
            problems.append(f"{text}: answered {reply[:80]!r}")
        if sid_after != SID:
            problems.append(f"{text}: session id became {sid_after}")
    for rec in llm.chat_requests():
        msgs = rec.body.get("messages") or []
        users = [_text(m).strip() for m in msgs if m.get("role") == "user"]
        hits = [t for t in sent if users and t in users[-1]]
        if hits and users[-1] != hits[0]:
            problems.append(f"the model got a merged prompt {users[-1][:80]!r}")
        if hits and hits[0] != sent[0] and not any(is_summary_text(_text(m)) for m in msgs):
            problems.append(f"{hits[0]}: answered from the pre-compression transcript")
    live = [(m.get("role"), _text(m).strip()) for m in db.get_messages_as_conversation(SID)]
    stored_users = [t for role, t in live if role == "user" and any(s in t for s in sent)]
    if stored_users != sent:
        problems.append(f"live user messages {stored_users} != sent {sent}")
    answers = [t for role, t in live if role == "assistant" and t.startswith("answer to [")]
    if sorted(answers) != sorted(answer_for(t) for t in sent):
        problems.append(f"live answers {answers}")
    if sum(1 for _, t in live if is_summary_text(t)) != 1:
        problems.append("not exactly one live summary")
    if not live or not live[0][1].startswith("turn-0:"):
        problems.append("protected head lost")
    # the last turn ran alone: its prompt and its answer end the transcript, in that order
    if live[-2:] != [("user", sent[2]), ("assistant", answer_for(sent[2]))]:
        problems.append(f"transcript ends {live[-2:]}")
    assert problems == [], [(r, t[:60]) for r, t in live]
    assert len(llm.summary_requests()) == 1
