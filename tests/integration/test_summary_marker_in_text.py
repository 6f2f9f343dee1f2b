"""Text that merely mentions Hermes's summary marker (a pasted log, a model quoting one)
is never cut or withheld: not on delivery to a chat platform, not in the TUI gateway's
history, not in the CLI's resume recap or /history, not in the API server's session
messages. Whether a message is a summary is decided by what was recorded (the tag,
Hermes's flag, the stored content hashes); the real summary of the same session stays
hidden on every one of those surfaces."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer, iter_message_text
from hermes_session_guard.selftest.gateway import start_gateway
from hermes_session_guard.summaries.tags import is_summary_text

from .conftest import new_agent
from .test_summary_visibility import (
    HAS_SESSION_MESSAGES_ENDPOINT,
    LAST_QUESTION,
    SYSTEM,
    _api_messages,
    _cli_screens,
    _regurgitating,
    _tui_history,
)

SID = "20260603_100000_dddddd"
MARKER = "[CONTEXT COMPACTION — REFERENCE ONLY]"  # how this Hermes's summaries start (0.14 and 0.19)
LEGACY = "[CONTEXT SUMMARY]:"  # the marker older Hermes wrote (still recognised)

# Ordinary text carrying the markers: at the start, in the middle, quoted in code.
USER_TEXTS = [
    f"{LEGACY} appears at the top of my log; is that bad?",
    f"My gateway.log says:\n```\n2026-06-01 12:00:01 INFO {MARKER} Earlier turns were compacted\n```\nwhat now?",
]
ASSISTANT_TEXTS = [
    "Step 1: run make.\nStep 2: the line `[CONTEXT SUMMARY]:` in your log is harmless.\n"
    "Step 3: rotate the deploy key NOW",
    f"{MARKER} is the header Hermes puts on compacted context; you can ignore it. Step 3: rotate the key.",
]
ALL_TEXTS = USER_TEXTS + ASSISTANT_TEXTS
REAL_SUMMARY = "compressed by the fake LLM server"  # in the body of the session's real summary


@pytest.fixture
def state_db(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import hermes_state

    monkeypatch.setattr(hermes_state, "DEFAULT_DB_PATH", home / "state.db")
    return home / "state.db"


def _quoting_session(db: Any, llm: FakeLLMServer, sid: str = SID) -> None:
    """A session that was compacted (its real summary recorded) and whose kept and later
    turns quote the markers: one quote sits in the protected tail during the compaction."""
    messages = probe.seed_messages()
    messages[-4]["content"] = f"turn-44: {USER_TEXTS[0]}"  # a kept user turn (tail)
    probe.seed_session(db, sid, messages)
    agent = new_agent(db, llm, sid, "in_place")
    probe.mark_flushed(agent, messages)
    compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    assert sum(1 for m in compressed if m.get("is_compressed_summary")) == 1
    kept = [m for m in compressed if USER_TEXTS[0] in str(m.get("content"))]
    assert kept and not any(m.get("is_compressed_summary") for m in kept)  # quoted, not a summary
    assert compressed[-1]["role"] == "assistant"
    for role, text in (("user", USER_TEXTS[1]), ("assistant", ASSISTANT_TEXTS[0]), ("user", "thanks, and then?"),
                       ("assistant", ASSISTANT_TEXTS[1])):
        db.append_message(session_id=agent.session_id, role=role, content=text)


def _assert_whole_and_summary_hidden(texts: list[str]) -> None:
    joined = "\n".join(texts)
    for text in ALL_TEXTS:
        assert text in texts or f"turn-44: {text}" in texts, f"cut or missing: {text[:50]!r}"
    assert REAL_SUMMARY not in joined and "Original context: session" not in joined  # the real one is hidden


# -- CLI ----------------------------------------------------------------------------------


def test_cli_resume_and_history_keep_quoting_text_whole(guard: Any, db: Any, llm: FakeLLMServer,
                                                        state_db: Path) -> None:
    _quoting_session(db, llm)
    recap, history, _ = _cli_screens(SID)
    for screen in (recap, history):
        flat = " ".join(screen.replace("│", " ").split())  # the recap is drawn in a panel
        for text in ALL_TEXTS:
            assert " ".join(text.split()) in flat, f"cut or missing: {text[:50]!r}"
        assert REAL_SUMMARY not in flat and "Original context: session" not in flat


# -- TUI gateway --------------------------------------------------------------------------


def test_tui_history_keeps_quoting_text_whole(guard: Any, db: Any, llm: FakeLLMServer, home: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _quoting_session(db, llm)
    shown = _tui_history(db, SID, monkeypatch)
    texts = [m.get("text", "") for m in shown]
    assert any(LAST_QUESTION in t for t in texts)
    _assert_whole_and_summary_hidden(texts)


# -- API server (0.15+) ---------------------------------------------------------------------


@pytest.mark.skipif(not HAS_SESSION_MESSAGES_ENDPOINT, reason="the session messages endpoint exists from 0.15")
def test_api_session_messages_keep_quoting_text_whole(guard: Any, db: Any, llm: FakeLLMServer,
                                                      home: Path) -> None:
    _quoting_session(db, llm)
    data = _api_messages(db, SID)
    _assert_whole_and_summary_hidden([str(m.get("content")) for m in data])


# -- delivery to a chat platform -------------------------------------------------------------


async def _gateway_replies(llm: FakeLLMServer, replies: list[str]) -> tuple[list[str], str | None]:
    gw = await start_gateway(record_edits=True)
    out: list[str] = []
    for reply in replies:
        llm.configure(reply_text=reply)
        gw.adapter.delivered.clear()
        await gw.say(reply)  # the user's message quotes it too
        out.append("\n".join(gw.adapter.delivered))
    return out, gw.bound_session_id()


def test_replies_quoting_the_marker_are_delivered_whole(guard: Any, db: Any, llm: FakeLLMServer,
                                                        state_db: Path) -> None:
    delivered, sid = asyncio.run(_gateway_replies(llm, ASSISTANT_TEXTS + USER_TEXTS))
    for reply, got in zip(ASSISTANT_TEXTS + USER_TEXTS, delivered, strict=True):
        assert reply in got, f"delivered {got!r} for {reply!r}"
    # and the user's own words are stored whole
    stored = [str(m.get("content")) for m in db.get_messages_as_conversation(sid) if m.get("role") == "user"]
    for text in ASSISTANT_TEXTS + USER_TEXTS:
        assert any(text in t for t in stored)


async def _compacted_gateway_then(db: Any, llm: FakeLLMServer, reply_fn: Any) -> list[str]:
    gw = await start_gateway(record_edits=True)
    await gw.say("hello")
    sid = gw.bound_session_id()
    for m in probe.seed_messages():
        db.append_message(session_id=sid, role=m["role"], content=m["content"])
    history = db.get_messages_as_conversation(sid)
    agent = new_agent(db, llm, sid, "in_place")
    probe.mark_flushed(agent, history)
    agent._compress_context(history, SYSTEM, approx_tokens=150_000)
    gw.adapter.delivered.clear()
    llm.configure(reply_fn=reply_fn)
    await gw.say("what is the answer?")
    return list(gw.adapter.delivered)


def test_after_a_compaction_a_quote_is_whole_and_the_repeated_summary_is_not_delivered(
    guard: Any, db: Any, llm: FakeLLMServer, state_db: Path
) -> None:
    quote = ASSISTANT_TEXTS[0]
    delivered = asyncio.run(_compacted_gateway_then(db, llm, lambda body: quote))
    assert quote in "\n".join(delivered)
    llm.reset()
    delivered = asyncio.run(_compacted_gateway_then(db, llm, _regurgitating))
    text = "\n".join(delivered)
    assert "The answer is 42." in text
    assert REAL_SUMMARY not in text and "Original context" not in text
    # the model had the real summary in its context
    body = llm.chat_requests()[-1].body
    assert any(is_summary_text(t) for m in body["messages"] for t in iter_message_text(m.get("content")))


def test_delivery_without_the_guard_keeps_quotes_too(no_guard: None, db: Any, llm: FakeLLMServer,
                                                     state_db: Path) -> None:
    """Hermes itself leaves such replies alone: the guard must not do worse."""
    delivered, _ = asyncio.run(_gateway_replies(llm, ASSISTANT_TEXTS[:1]))
    assert ASSISTANT_TEXTS[0] in delivered[0]
