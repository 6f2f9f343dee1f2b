"""The session-id contract through the real GatewayRunner: session hygiene before a
turn, and preflight compression inside a gateway turn."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer
from hermes_session_guard.selftest.gateway import GatewayHarness, start_gateway

from .conftest import HOST_HAS_IN_PLACE, log_tags_in


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _session_with_history(gw: GatewayHarness, llm: FakeLLMServer, n: int, prompt_tokens: int | None) -> str:
    """Open a chat, then give it ``n`` big messages of history (as earlier turns would have)."""
    llm.configure(prompt_tokens=prompt_tokens)
    await gw.send_text("hi")
    await gw.drain()
    sid = gw.bound_session_id()
    assert sid
    for m in probe.seed_messages(n, tag="hist"):
        gw.runner.session_store.append_to_transcript(sid, m)
    llm.configure(prompt_tokens=None)
    return sid


async def _executor_threads_served_another_session() -> None:
    """Leave every default-executor thread tagged with another session, as a gateway
    thread pool serving many chats does (the stale bracket of anomaly B)."""
    import time

    import hermes_logging

    def serve_other() -> None:
        hermes_logging.set_session_context("20260528_155201_68dc5996")
        time.sleep(0.05)

    loop = asyncio.get_running_loop()
    await asyncio.gather(*(loop.run_in_executor(None, serve_other) for _ in range(40)))


def _set_in_place(home: Path, llm: FakeLLMServer, mode: str) -> None:
    if HOST_HAS_IN_PLACE:
        probe.write_config(home, llm.base_url, in_place=(mode == "in_place"))


def _assert_one_live_session(home: Path, sid: str) -> list[dict]:
    rows = probe.sessions_table(home / "state.db")
    assert [r["id"] for r in rows] == [sid], [(r["id"], r["parent_session_id"], r["end_reason"]) for r in rows]
    assert rows[0]["ended_at"] is None
    return probe.live_messages(home / "state.db", sid)


def _contents(rows: list[dict]) -> list[str]:
    return [str(r["content"]) for r in rows]


@pytest.mark.parametrize("mode", ["in_place", "rotate"] if HOST_HAS_IN_PLACE else ["rotate"])
def test_session_hygiene_keeps_routing_on_the_same_id(guard: Any, llm: FakeLLMServer, home: Path, mode: str) -> None:
    """Seed scenario 'Compression preserves session ID' through the gateway: a session
    far above the threshold is compacted by hygiene; the done line names S, the gateway
    keeps routing to S, and the next turn sees the compacted history of S."""
    _set_in_place(home, llm, mode)

    async def scenario() -> tuple[GatewayHarness, str, list[str]]:
        gw = await start_gateway()
        sid = await _session_with_history(gw, llm, 200, prompt_tokens=126_000)
        await _executor_threads_served_another_session()
        llm.configure(reply_text="answer after hygiene")
        with probe.capture_host_compression_logs() as lines:
            await gw.send_text("what is the plan?")
            await gw.drain()
        return gw, sid, lines

    gw, sid, lines = run(scenario())

    assert lines and set(probe.session_ids_in(lines)) == {sid}, lines
    # the executor thread that ran hygiene tagged the operation's lines with S
    assert set(log_tags_in(lines)) == {sid}, lines
    assert gw.bound_session_id() == sid
    assert gw.replies()[-1] == "answer after hygiene"
    live = _assert_one_live_session(home, sid)
    assert _contents(live)[-2:] == ["what is the plan?", "answer after hygiene"]
    assert len(live) < 200
    (snap, *_) = guard.store_for(home / "state.db").list_snapshots(sid)
    kept = guard.store_for(home / "state.db").snapshot_messages(snap.snapshot_id)
    assert any(str(m["content"]).startswith("hist-199:") for m in kept)
    # the turn after compaction was answered from the compacted history of S
    last = llm.chat_requests()[-1].body["messages"]
    assert any("hist-199:" in str(m.get("content")) for m in last)
    assert not any("hist-100:" in str(m.get("content")) for m in last)


@pytest.mark.parametrize("mode", ["in_place", "rotate"] if HOST_HAS_IN_PLACE else ["rotate"])
def test_preflight_in_a_gateway_turn_keeps_transcript_consistent(
    guard: Any, llm: FakeLLMServer, home: Path, mode: str
) -> None:
    """Compression inside the agent's turn (preflight): routing stays on S, state.db
    holds compacted + exactly one copy of the turn, and the next message loads it."""
    _set_in_place(home, llm, mode)

    async def scenario() -> tuple[GatewayHarness, str]:
        gw = await start_gateway()
        sid = await _session_with_history(gw, llm, 48, prompt_tokens=500)
        llm.configure(reply_text="first answer")
        await gw.send_text("question one")
        await gw.drain()
        llm.configure(reply_text="second answer")
        await gw.send_text("question two")
        await gw.drain()
        return gw, sid

    gw, sid = run(scenario())

    assert gw.bound_session_id() == sid
    assert gw.replies()[-2:] == ["first answer", "second answer"]
    live = _contents(_assert_one_live_session(home, sid))
    assert live.count("question one") == 1 and live.count("first answer") == 1, live[-6:]
    assert live[-4:] == ["question one", "first answer", "question two", "second answer"]
    assert len(live) < 48
    # the second turn was built from the compacted transcript, not the pre-compression one
    second = llm.chat_requests()[-1].body["messages"]
    assert not any("hist-20:" in str(m.get("content")) for m in second)
    assert any("question one" == m.get("content") for m in second)
    assert guard.store_for(home / "state.db").list_snapshots(sid)


def test_gateway_turn_moves_routing_without_the_guard(no_guard: None, llm: FakeLLMServer, home: Path) -> None:
    """Hermes as shipped, rotating: the gateway follows the split to a child id."""
    _set_in_place(home, llm, "rotate")

    async def scenario() -> tuple[GatewayHarness, str]:
        gw = await start_gateway()
        sid = await _session_with_history(gw, llm, 48, prompt_tokens=500)
        await gw.send_text("question one")
        await gw.drain()
        return gw, sid

    gw, sid = run(scenario())
    assert gw.bound_session_id() != sid
    rows = {r["id"]: r for r in probe.sessions_table(home / "state.db")}
    assert rows[sid]["end_reason"] == "compression"
