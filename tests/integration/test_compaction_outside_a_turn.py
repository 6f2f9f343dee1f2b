"""A compaction that starts outside any turn (a background or timer thread, as an idle-chat
compactor does) while an API-server turn, a CLI turn and gateway messages arrive for the same session:
each is held until the compaction ends, then answered in arrival order as its own turn on
the compacted transcript; the compaction's record and events are written; every audit line
names the one session id."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import audit
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.gateway import start_gateway
from hermes_session_guard.summaries.tags import is_summary_text

from ..fake_llm import ScriptedLLMServer
from .api_turns import ApiServer, answer_for, chat_completion, echo_last_user, running_api_server, user_wrote
from .conftest import HOST_NATIVE_MODE, new_agent

TAG = "idle"
API_MSG = "msg-1-api"
CLI_MSG = "msg-2-cli"
GW_MSGS = ["msg-3-chat", "msg-4-chat"]
# 0.13-0.19: every entry point's turn waits in the guard's queue, so the API, CLI and chat turns
# run in arrival order. 0.20+: the CLI's and the chat's turns wait on Hermes's own turn lease
# (polled once a second), the API request in the guard's in-process queue; which goes first after
# the compaction is Hermes's "one at a time" (as behind a compaction inside a turn), each entry
# point's own messages in arrival order.
STRICT_ORDER = not HOST_NATIVE_MODE


@pytest.fixture
def server(home: Path) -> Iterator[ApiServer]:
    with running_api_server(home) as srv:
        yield srv


def _text(m: dict[str, Any]) -> str:
    c = m.get("content")
    if isinstance(c, list):
        return " ".join(str(p.get("text", "")) for p in c if isinstance(p, dict))
    return str(c or "")


async def _scenario(llm: ScriptedLLMServer, home: Path, server: ApiServer) -> dict[str, Any]:
    gw = await start_gateway()
    llm.configure(reply_fn=echo_last_user, prompt_tokens=500)  # low usage: no gateway hygiene
    await gw.say("hi")
    sid = gw.bound_session_id()
    assert sid
    for m in probe.seed_messages(tag=TAG):
        gw.runner.session_store.append_to_transcript(sid, m)
    gate = threading.Event()
    llm.configure(reply_fn=echo_last_user, summary_gate=gate, prompt_tokens=None)
    db = probe.open_db(home / "state.db")
    box: dict[str, Any] = {}
    resumed = db.get_messages_as_conversation(sid)  # a CLI that resumed the session before the compaction

    def idle_compaction() -> None:  # no turn on this thread: a background compactor's
        try:
            history = db.get_messages_as_conversation(sid)
            agent = new_agent(db, llm, sid, "in_place")
            probe.mark_flushed(agent, history)
            box["compacted"], _ = agent._compress_context(history, "sys", approx_tokens=150_000)
            box["sid_after"] = agent.session_id
        except BaseException as exc:  # reported by the test
            box["error"] = exc

    compactor = threading.Thread(target=idle_compaction, name="idle-compactor")
    compactor.start()
    replies: dict[str, Any] = {}
    api = threading.Thread(target=lambda: replies.__setitem__(API_MSG, chat_completion(server, sid, API_MSG)))

    def cli_turn() -> None:
        agent = probe.make_agent(db, llm.base_url, sid)
        probe.mark_flushed(agent, resumed)
        replies[CLI_MSG] = agent.run_conversation(CLI_MSG, conversation_history=resumed).get("final_response")

    cli = threading.Thread(target=cli_turn)
    loop = asyncio.get_running_loop()
    try:
        started = await loop.run_in_executor(None, llm.summary_started.wait, 60)
        assert started, "the background compaction never reached its summary call"
        api.start()
        await asyncio.sleep(0.3)  # arrival order: the API turn, the CLI's, the chat's messages
        cli.start()
        await asyncio.sleep(0.3)
        for text in GW_MSGS:
            await gw.send_text(text)
            await asyncio.sleep(0.3)
    finally:
        gate.set()
    await loop.run_in_executor(None, compactor.join, 120)
    await loop.run_in_executor(None, api.join, 180)
    await loop.run_in_executor(None, cli.join, 180)
    await gw.drain(timeout=180)
    db.close()
    return {"sid": sid, "box": box, "api": replies.get(API_MSG), "cli": replies.get(CLI_MSG), "chat": gw.replies(),
            "gw": gw}


def test_turns_arriving_during_an_idle_compaction_wait_and_run_in_order(
        guard: Any, llm: ScriptedLLMServer, home: Path, server: ApiServer) -> None:
    t0 = time.time()
    got = asyncio.run(_scenario(llm, home, server))
    sid, box = got["sid"], got["box"]
    assert "error" not in box, box.get("error")
    assert box["sid_after"] == sid
    # every message answered, each by a turn of its own
    assert got["api"] is not None and got["api"].status == 200 and got["api"].text == answer_for(API_MSG)
    assert got["cli"] == answer_for(CLI_MSG)
    answers = [r for r in got["chat"] if r.startswith("answer to [msg-")]
    assert answers == [answer_for(t) for t in GW_MSGS], got["chat"]
    sent = [API_MSG, CLI_MSG, *GW_MSGS]
    # each was asked alone, on the compacted transcript (the summary, no pre-compaction middle)
    for text in sent:
        asked = [r for r in llm.chat_requests() if r.ts >= t0 and any(
            m.get("role") == "user" and user_wrote(m) == text for m in r.body.get("messages") or [])
            and user_wrote([m for m in r.body["messages"] if m.get("role") == "user"][-1]) == text]
        assert asked, f"{text}: never asked alone"
        for req in asked:
            seen = [_text(m) for m in req.body["messages"]]
            assert any(is_summary_text(t) for t in seen), f"{text}: answered from the pre-compaction transcript"
            assert not any(t.startswith(f"{TAG}-20:") for t in seen), f"{text}: pre-compaction middle in its turn"
    # the live transcript: one summary, then each message once, in arrival order, followed by its answer
    live = [(str(r["role"]), str(r["content"])) for r in probe.live_messages(home / "state.db", sid)]
    assert sum(is_summary_text(c) for _, c in live) == 1
    users = [c for role, c in live if role == "user" and c in sent]
    if STRICT_ORDER:
        assert users == sent, live[-8:]
    else:
        assert sorted(users) == sorted(sent) and [u for u in users if u in GW_MSGS] == GW_MSGS, live[-8:]
    for text in sent:
        i = live.index(("user", text))
        assert live[i + 1] == ("assistant", answer_for(text)), live[i:i + 2]
    # the compaction's record and events, and one session id throughout
    store = guard.store_for(home / "state.db")
    records = store.compressions(sid)
    assert [r["phase"] for r in records] == ["done"], records
    events = audit.read_events(guard.audit_path)
    names = [e["event"] for e in events if e.get("op_id") == records[0]["op_id"]]
    assert "compression.started" in names and "compression.done" in names, names
    assert {e["session_id"] for e in events if e.get("session_id")} == {sid}
    assert [r["id"] for r in probe.sessions_table(home / "state.db")] == [sid]
