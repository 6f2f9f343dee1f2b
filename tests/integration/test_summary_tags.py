"""Summaries on the real host: tagged, recorded, re-tagged on load, carrying the recall
line, which a later compression strips again; never a guard key on the wire."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.selftest import probe
from hermes_session_guard.summaries.tags import is_summary_text, original_part

from ..fake_llm import ScriptedLLMServer
from .conftest import HOST, HOST_HAS_IN_PLACE, HOST_ROW, MODE_PARAMS, new_agent

SID = "20260528_093510_66bfaec7"
SYSTEM = "You are a test agent."
HEADER_RE = re.compile(r"^\[Original context: session (\S+), turns (\d+)–(\d+), snapshot (\S+)\]$", re.MULTILINE)
NATIVE = "_compressed_summary"
# 0.17+ tag their own summary message in memory (the seam table's native_summary_key)
HOST_TAGS_NATIVELY = bool(HOST_ROW and HOST_ROW.behaviour.native_summary_key == NATIVE)


def _seeded(db: Any, llm: ScriptedLLMServer, mode: str, n: int = probe.SEED_MESSAGES, chars: int = probe.MESSAGE_CHARS,
            **kwargs: Any) -> tuple[Any, list]:
    messages = probe.seed_messages(n, chars)
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, mode, **kwargs)
    probe.mark_flushed(agent, messages)
    return agent, messages


def _summaries(messages: list) -> list[dict]:
    return [m for m in messages if isinstance(m, dict) and is_summary_text(str(m.get("content")))]


def _host_detects(content: str) -> bool:
    from agent.context_compressor import ContextCompressor

    return ContextCompressor._is_context_summary_content(content)


def _turn_of(text: str) -> int:
    return int(text.split(":", 1)[0].split("-")[1]) + 1


@pytest.mark.parametrize("mode", MODE_PARAMS)
@pytest.mark.parametrize("shape", [(probe.SEED_MESSAGES, probe.MESSAGE_CHARS), (30, 3000)], ids=["big", "merged"])
def test_summary_is_tagged_recorded_and_names_the_compacted_turns(
    guard: Any, db: Any, llm: ScriptedLLMServer, home: Path, mode: str, shape: tuple[int, int]
) -> None:
    agent, messages = _seeded(db, llm, mode, *shape)
    compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)

    (summary,) = _summaries(compressed)
    assert summary["is_compressed_summary"] is True
    assert summary.get(NATIVE) is (True if HOST_TAGS_NATIVELY else None)
    assert _host_detects(summary["content"])  # Hermes still recognises its own summary
    (snap,) = guard.store_for(home / "state.db").list_snapshots(SID)
    ((sid, first, last, snapshot_id),) = HEADER_RE.findall(summary["content"])
    assert (sid, snapshot_id) == (SID, snap.snapshot_id)
    # exactly the turns that are no longer in the live list verbatim: a message that carries a
    # summary keeps only its part outside the summary block (the fake summariser quotes turns,
    # and Hermes merges the summary into a kept turn's message)
    kept = {original_part(m["content"]) if is_summary_text(m["content"]) else m["content"] for m in compressed}
    gone = [_turn_of(m["content"]) for m in messages if m["content"] not in kept and not any(
        m["content"].strip() in k for k in kept)]
    assert (int(first), int(last)) == (min(gone), max(gone))
    # the line sits right after the prefix line
    lines = summary["content"].splitlines()
    at = next(i for i, line in enumerate(lines) if "[Original context:" in line)
    assert is_summary_text(lines[at - 1])

    conn = sqlite3.connect(home / "state.db")
    rows = conn.execute("SELECT session_id, snapshot_id FROM session_guard_summaries").fetchall()
    conn.close()
    assert rows == [(SID, snap.snapshot_id)]


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_tag_survives_a_reload(guard: Any, db: Any, llm: ScriptedLLMServer, home: Path, mode: str) -> None:
    agent, messages = _seeded(db, llm, mode)
    compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)

    reloaded = probe.open_db(home / "state.db").get_messages_as_conversation(SID)
    (summary,) = _summaries(reloaded)
    assert summary["is_compressed_summary"] is True
    assert summary.get(NATIVE) is (True if HOST_TAGS_NATIVELY else None)
    assert [bool(m.get("is_compressed_summary")) for m in reloaded] == \
        [bool(m.get("is_compressed_summary")) for m in compressed]


def test_state_db_drops_the_tag_without_the_guard(no_guard: None, db: Any, home: Path) -> None:
    """What the guard's table is for: Hermes's messages table has no column for the tag."""
    from hermes_session_guard.host import summary_prefixes

    db.create_session(session_id=SID, source="cli", model="fake-model")
    db.replace_messages(SID, [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": f"{summary_prefixes()[0]}\nbody", "is_compressed_summary": True},
    ])
    reloaded = db.get_messages_as_conversation(SID)
    assert _summaries(reloaded) and not any(m.get("is_compressed_summary") for m in reloaded)


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_a_later_compression_resummarises_without_the_recall_line(
    guard: Any, db: Any, llm: ScriptedLLMServer, home: Path, mode: str
) -> None:
    agent, messages = _seeded(db, llm, mode)
    compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    first_snapshot = HEADER_RE.findall(_summaries(compressed)[0]["content"])[0][3]

    # A new agent resumes the session (the host rehydrates the previous summary from
    # the stored text) and the conversation grows past the budget again.
    history = probe.open_db(home / "state.db").get_messages_as_conversation(SID)
    more = probe.seed_messages(40, probe.MESSAGE_CHARS, tag="more")
    for m in more:
        db.append_message(session_id=SID, role=m["role"], content=m["content"])
    history = history + more
    resumed = new_agent(db, llm, SID, mode)
    probe.mark_flushed(resumed, history)
    llm.reset()
    # the iterative-update prompt carries none of the fake server's default summary markers
    llm.configure(summary_predicate=lambda body: "summarization agent" in str(body.get("messages")))
    again, _ = resumed._compress_context(history, SYSTEM, approx_tokens=150_000)

    (prompt_request,) = llm.summary_requests()
    prompt = prompt_request.body["messages"][0]["content"]
    assert "Earlier turns were compressed by the fake LLM server" in prompt  # the previous summary is carried…
    assert "[Original context:" not in prompt  # …without the guard's line
    (summary,) = _summaries(again)
    headers = HEADER_RE.findall(summary["content"])
    assert len(headers) == 1 and headers[0][3] != first_snapshot
    assert _host_detects(summary["content"])
    snaps = guard.store_for(home / "state.db").list_snapshots(SID)
    assert [s.snapshot_id for s in snaps][-1] == headers[0][3]


def _strict_turns(agent: Any, llm: ScriptedLLMServer, messages: list, question: str = "next question") -> list:
    llm.configure(strict=True, reply_text="strict ok")
    result = agent.run_conversation(question, conversation_history=messages)
    assert result["final_response"] == "strict ok", result.get("error")
    history = result["messages"]
    assert _summaries(history) and all(m.get("is_compressed_summary") for m in _summaries(history))
    for follow_up in ("and then?", "one more"):
        result = agent.run_conversation(follow_up, conversation_history=history)
        assert result["final_response"] == "strict ok", result.get("error")
        history = result["messages"]
    return history


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_strict_openai_provider_accepts_every_request(guard: Any, db: Any, llm: ScriptedLLMServer, home: Path,
                                                      mode: str) -> None:
    agent, messages = _seeded(db, llm, mode)
    _strict_turns(agent, llm, messages)

    chats = llm.chat_requests()
    assert len(chats) >= 3 and llm.violations == []
    # the summary itself did go to the model, as plain role/content
    assert any(is_summary_text(str(m.get("content"))) for m in chats[-1].body["messages"])


@pytest.mark.parametrize("mode", MODE_PARAMS)
@pytest.mark.skipif(HOST >= (0, 21, 0), reason="Hermes 0.21+'s auxiliary client refuses an Anthropic base_url that is "
                    "not an Anthropic host ('not an Anthropic-compatible host'): no compaction runs through that "
                    "transport against the local fake provider")
def test_strict_anthropic_provider_accepts_every_request(guard: Any, db: Any, llm: ScriptedLLMServer, home: Path,
                                                         mode: str) -> None:
    agent, messages = _seeded(db, llm, mode)
    agent = probe.make_agent(db, llm.anthropic_base_url, SID, provider="anthropic", api_key="sk-ant-fake",
                             model="claude-sonnet-4-5")
    if HOST_HAS_IN_PLACE:
        agent.compression_in_place = mode == "in_place"
    probe.mark_flushed(agent, messages)
    assert agent.api_mode == "anthropic_messages"
    _strict_turns(agent, llm, messages)

    chats = [r for r in llm.chat_requests() if r.path.endswith("/messages")]
    assert len(chats) >= 3 and llm.violations == []
    assert any(is_summary_text(" ".join(str(b.get("text", "")) for b in m["content"]) if isinstance(
        m["content"], list) else m["content"]) for m in chats[-1].body["messages"])


def test_strict_provider_rejects_the_tag_without_the_guard(no_guard: None, db: Any, llm: ScriptedLLMServer,
                                                           home: Path) -> None:
    """Why the guard strips: a tagged message reaches the wire on 0.14 (no stripping)
    and on 0.19 (only _-prefixed keys are stripped)."""
    agent = new_agent(db, llm, SID, "in_place")
    history = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "earlier answer", "is_compressed_summary": True},
    ]
    llm.configure(strict=True)
    agent.run_conversation("next", conversation_history=history)
    assert any(key == "is_compressed_summary" for _, _, key in llm.violations)


def test_without_the_recall_line_the_tag_still_survives_a_reload(guard: Any, db: Any, llm: ScriptedLLMServer,
                                                                 home: Path) -> None:
    from hermes_session_guard.config import parse_config

    before = guard.config
    guard.config = parse_config({"summaries": {"recall_header": False}})
    try:
        agent, messages = _seeded(db, llm, "in_place")
        compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    finally:
        guard.config = before
    (summary,) = _summaries(compressed)
    assert "[Original context:" not in summary["content"] and summary["is_compressed_summary"] is True
    (reloaded,) = _summaries(probe.open_db(home / "state.db").get_messages_as_conversation(SID))
    assert reloaded["is_compressed_summary"] is True  # matched by content hash alone
