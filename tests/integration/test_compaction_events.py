"""Compaction events on the real API server's client streams (docs/events.md).

- ``/v1/runs/{id}/events``: ``compaction.started`` while the summary call is held, then
  ``compaction.completed`` (messages before/after, summary length, snapshot id) before
  ``run.completed``; with a failing summary model, ``compaction.started`` then
  ``compaction.failed`` with its reason. No message text in either.
- ``/v1/chat/completions`` SSE: the typed client ``hermes-agent-api-client`` 0.3.3 (which
  fails the whole stream on a record it does not know) reads the stream to its end, by
  default (comment lines only) and with ``events.chat_completions_records`` (one
  ``hermes.tool.progress`` record ``running`` and one ``completed`` for the tool
  ``session_guard.compaction``), up to 0.20: on 0.22 Hermes's own ``hermes.status`` records
  of a compaction already fail that client, guard or not (the ``openai`` SDK:
  test_client_streams.py). The client needs Python 3.13 (its wheels say so, not
  3.12): it runs from the virtualenv ``HERMES_API_CLIENT_PYTHON`` names (scripts/matrix.py
  builds ``.venvs/api-client``), and that test is skipped when there is none.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.host.client_events import TOOL_NAME
from hermes_session_guard.selftest import probe

from ..fake_llm import ScriptedLLMServer
from .api_turns import API_KEY, ApiServer, chat_completion, post, running_api_server
from .conftest import DEFERS_TO_USAGE, HOST, anchor_on_real_usage
from .tui_import import tui_resume

SID = "20260601_130000_e7e7e7e7"
TOOL = "session_guard.compaction"
ROOT = Path(__file__).resolve().parents[2]
CLIENT_PYTHON = os.environ.get("HERMES_API_CLIENT_PYTHON") or str(ROOT / ".venvs" / "api-client" / "bin" / "python")


_CLIENT = r"""
import asyncio, json, sys
from hermes_agent_api_client import HermesAgentApiClient

async def main():
    base, key, sid, text = sys.argv[1:5]
    events = []
    try:
        async with HermesAgentApiClient(base, key) as client:
            request = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": text}]}
            async for event in client.stream_chat_events(request, session_id=sid):
                events.append({"type": type(event).__name__, **event.model_dump(mode="json")})
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__, "events": events}))
        return
    print(json.dumps({"events": events}))

asyncio.run(main())
"""


@pytest.fixture
def server(home: Path) -> Iterator[ApiServer]:
    with running_api_server(home) as srv:
        yield srv


def _seed(db: Any, llm: ScriptedLLMServer, srv: ApiServer) -> list[dict[str, Any]]:
    """A stored session over the compression threshold, which the next request compacts
    (0.21+: its agent resumes it priced by the provider, ``api_turns._anchor_agents``)."""
    messages = probe.seed_messages(tag="evt")
    probe.seed_session(db, SID, messages, source="api_server")
    return messages


class RunEvents:
    """Reads ``/v1/runs/{id}/events`` on a thread, event by event."""

    def __init__(self, srv: ApiServer, run_id: str) -> None:
        self.events: list[dict[str, Any]] = []
        self.started = threading.Event()
        req = urllib.request.Request(f"{srv.base}/v1/runs/{run_id}/events",
                                     headers={"Authorization": f"Bearer {API_KEY}"})
        self.response = urllib.request.urlopen(req, timeout=180)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for raw in self.response:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            self.events.append(event)
            if event.get("event") == "compaction.started":
                self.started.set()
            if event.get("event") in ("run.completed", "run.failed"):
                return

    def names(self) -> list[str]:
        return [str(e.get("event")) for e in self.events]


def _start_run(srv: ApiServer, messages: list[dict[str, Any]]) -> tuple[str, RunEvents]:
    """POST /v1/runs on the session, its history in the request (0.21+: loaded by Hermes from
    the session, the only history it compacts after the usage report, see ``_seed``)."""
    body: dict[str, Any] = {"input": "and now?", "session_id": SID}
    if not DEFERS_TO_USAGE:
        body["conversation_history"] = [{"role": m["role"], "content": m["content"]} for m in messages]
    reply = post(srv.base + "/v1/runs", body)
    assert reply.status in (200, 202), reply.body
    run_id = reply.body["run_id"]
    return run_id, RunEvents(srv, run_id)


def _compaction(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if str(e.get("event", "")).startswith("compaction.")]


def _no_text(events: list[dict[str, Any]], messages: list[dict[str, Any]]) -> None:
    dumped = json.dumps(events)
    assert "evt-" not in dumped and "deployment plan" not in dumped and "and now?" not in dumped


def test_run_events_say_started_while_the_summary_is_held_then_completed(
    guard: Any, db: Any, llm: ScriptedLLMServer, server: ApiServer
) -> None:
    messages = _seed(db, llm, server)
    gate = threading.Event()
    llm.configure(summary_gate=gate)
    try:
        _, stream = _start_run(server, messages)
        assert llm.summary_started.wait(120), "the run never reached the summary call"
        assert stream.started.wait(60), stream.names()
        assert [e["event"] for e in _compaction(stream.events)] == ["compaction.started"]  # still held
    finally:
        gate.set()
    stream.thread.join(180)
    names = stream.names()
    assert names[-1] == "run.completed", names
    started, ended = _compaction(stream.events)
    assert names.index("compaction.completed") < names.index("run.completed")
    assert started["session_id"] == ended["session_id"] == SID and started["op_id"] == ended["op_id"]
    assert started["messages_before"] == ended["messages_before"] >= len(messages)
    assert ended["event"] == "compaction.completed" and ended["outcome"] == "done"
    assert 0 < ended["messages_after"] < ended["messages_before"] and ended["summary_chars"] > 0
    assert ended["snapshot_id"].startswith(f"{SID}.snapshot.") and ended["duration_ms"] >= ended["summary_ms"] > 0
    _no_text(_compaction(stream.events), messages)


def test_run_events_say_started_then_failed_when_the_summary_fails(
    guard: Any, db: Any, llm: ScriptedLLMServer, server: ApiServer
) -> None:
    messages = _seed(db, llm, server)
    llm.configure(fail_all_summaries=("status", 500))
    _, stream = _start_run(server, messages)
    stream.thread.join(180)
    compaction = _compaction(stream.events)
    assert [e["event"] for e in compaction] == ["compaction.started", "compaction.failed"], stream.names()
    failed = compaction[-1]
    assert failed["outcome"] == "failed" and failed["reason"] and "snapshot_id" not in failed
    assert failed["messages_after"] == failed["messages_before"]
    _no_text(compaction, messages)


def test_chat_completions_stream_carries_tool_progress_records_when_opted_in(
    guard: Any, db: Any, llm: ScriptedLLMServer, server: ApiServer
) -> None:
    guard.config = replace(guard.config, events=replace(guard.config.events, chat_completions_records=True))
    _seed(db, llm, server)
    reply = chat_completion(server, SID, "and now?", stream=True)
    assert reply.status == 200
    progress = [p for name, p in reply.body if name == "hermes.tool.progress" and p.get("tool") == TOOL]
    assert [p["status"] for p in progress] == ["running", "completed"], reply.body
    assert progress[0]["toolCallId"] == progress[1]["toolCallId"] and progress[0]["toolCallId"].startswith(TOOL)
    assert reply.text  # the answer still streams after it


@pytest.mark.skipif(not Path(CLIENT_PYTHON).exists(), reason=f"no hermes-agent-api-client virtualenv at "
                    f"{CLIENT_PYTHON} (scripts/matrix.py builds it; or set HERMES_API_CLIENT_PYTHON)")
@pytest.mark.skipif(HOST >= (0, 21, 0), reason="Hermes 0.22's own chat stream carries `event: hermes.status` records "
                    "while it compacts, which client 0.3.3 rejects (HermesProtocolError) with or without the guard")
@pytest.mark.parametrize("records", [False, True], ids=["default", "records"])
def test_the_typed_api_client_reads_a_stream_with_a_compaction(
    guard: Any, db: Any, llm: ScriptedLLMServer, server: ApiServer, records: bool
) -> None:
    guard.config = replace(guard.config, events=replace(guard.config.events, chat_completions_records=records))
    _seed(db, llm, server)
    done = subprocess.run([CLIENT_PYTHON, "-c", _CLIENT, server.base, API_KEY, SID, "and now?"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in result, result
    kinds = [e["type"] for e in result["events"]]
    progress = [e for e in result["events"] if e["type"] == "ToolProgressEvent" and e["tool_name"] == TOOL]
    assert [e["status"] for e in progress] == (["running", "completed"] if records else []), kinds
    assert "AssistantDeltaEvent" in kinds and kinds[-1] == "TerminalEvent"
    assert len(llm.summary_requests()) == 1


# -- the TUI gateway: status.update ---------------------------------------------------------


@pytest.mark.parametrize("fails", [False, True], ids=["completed", "failed"])
def test_a_tui_client_sees_the_compaction_start_and_end_as_status_updates(
    guard: Any, db: Any, llm: ScriptedLLMServer, home: Path, tui: Any, fails: bool
) -> None:
    """A TUI turn that compacts: Hermes posts its own line for the compaction ("Compacting
    context", ``lifecycle``; ``compacting`` from 0.17); the guard adds its facts to the status
    bar (kind ``status``) when the compaction ends, and no line of its own."""
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages, source="tui")
    server_module, frames = tui
    send = tui_resume(server_module, frames, SID)
    if DEFERS_TO_USAGE:  # a long-lived TUI agent has its provider's reading of the session
        anchor_on_real_usage(server_module._sessions[send.live]["agent"], messages)
    if fails:
        llm.configure(fail_all_summaries=("status", 500))
    send("and now?")
    every = frames.events(send.live, "status.update")
    ours = ("Compacting the context: ", "Context compact")
    updates = [u for u in every if str(u.get("text", "")).startswith(ours)]
    hermes_own = [u for u in every if "Compacting context" in str(u.get("text", ""))]
    assert not [u for u in every if u.get("kind") == TOOL_NAME], every
    assert hermes_own or fails, every  # Hermes's own line for this compaction
    assert [u["kind"] for u in updates] == ["status"], every  # the guard's facts on the status bar only
    ended = updates[0]["text"]
    op = ended.rsplit("(op ", 1)[1].split(",")[0].rstrip(")")
    before = ended.split(": ", 1)[1].split(" -> ")[0] if not fails else ""
    if fails:
        assert ended.startswith("Context compaction failed, nothing changed: ") and ended.endswith(f"(op {op})")
    else:
        done = re.fullmatch(rf"Context compacted: {before} -> (\d+) messages "
                            rf"\(op {op}, snapshot {SID}\.snapshot\.\S+\)", ended)
        assert done and int(done[1]) < int(before) and int(before) > len(messages), ended
    assert "deployment plan" not in json.dumps(updates) and "and now?" not in json.dumps(updates)


# -- ACP: session/update tool calls ---------------------------------------------------------


class _AcpUpdates:
    """The client side of an ACP connection: keeps every session update it is sent."""

    def __init__(self) -> None:
        self.updates: list[Any] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)

    def __getattr__(self, name: str) -> Any:  # any other client callback: accepted, nothing to do
        async def ignore(*args: Any, **kwargs: Any) -> None:
            return None
        return ignore


@pytest.mark.parametrize("fails", [False, True], ids=["completed", "failed"])
def test_an_acp_client_sees_the_compaction_as_a_tool_call(
    guard: Any, db: Any, llm: ScriptedLLMServer, home: Path, fails: bool
) -> None:
    """An ACP prompt that compacts: its client gets a ``tool_call`` (in progress) when the
    compaction starts and a ``tool_call_update`` of the same id when it ends, completed
    or failed, in counts and ids; the turn's own answer still streams."""
    try:
        from acp.schema import TextContentBlock
        from acp_adapter.server import HermesACPAgent
        from acp_adapter.session import SessionManager
    except ImportError as exc:
        pytest.skip(f"ACP is not importable on this release ({exc})")
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages, source="acp")  # ACP restores only its own sessions
    acp_agent = HermesACPAgent(SessionManager(db=probe.open_db(home / "state.db")))
    client = _AcpUpdates()
    acp_agent.on_connect(client)
    state = acp_agent.session_manager.get_session(SID)
    assert state is not None
    if DEFERS_TO_USAGE:  # a long-lived ACP agent has its provider's reading of the session
        anchor_on_real_usage(state.agent, messages)
    if fails:
        llm.configure(fail_all_summaries=("status", 500))
    response = asyncio.run(acp_agent.prompt(prompt=[TextContentBlock(type="text", text="and now?")],
                                            session_id=SID))
    assert response.stop_reason == "end_turn", response
    ours = [u for u in client.updates if str(getattr(u, "tool_call_id", "")).startswith(TOOL_NAME)]
    assert [u.session_update for u in ours] == ["tool_call", "tool_call_update"], client.updates
    started, ended = ours
    assert started.tool_call_id == ended.tool_call_id and started.status == "in_progress"
    assert started.kind == "other" and started.raw_input["messages"] > len(messages)
    assert re.fullmatch(r"Compacting the context: \d+ messages \(op \w+\)", started.title)
    if fails:
        assert ended.status == "failed" and ended.raw_output["outcome"] == "failed"
    else:
        assert ended.status == "completed" and ended.raw_output["outcome"] == "done"
        assert ended.raw_output["snapshot_id"].startswith(f"{SID}.snapshot.")
        assert ended.raw_output["messages_after"] < ended.raw_output["messages_before"]
    dumped = json.dumps([u.model_dump(mode="json") for u in ours])
    assert "deployment plan" not in dumped and "and now?" not in dumped
    chunks = [u for u in client.updates if getattr(u, "session_update", "") == "agent_message_chunk"]
    assert chunks, "the turn's answer did not stream"


# -- the platform gateway: status lines in the chat ------------------------------------------

_STARTED_LINE = re.compile(r"Compacting the context: (\d+) messages \(op (\w+)\)")
_DONE_LINE = re.compile(r"Context compacted: (\d+) -> (\d+) messages \(op (\w+), snapshot (\S+)\)")


def _chat_after_compaction(llm: ScriptedLLMServer, home: Path, trigger: str) -> tuple[list[str], str]:
    """What a platform chat received when its next message compacts the session (by
    ``trigger``: inside the agent's turn, or the gateway's session hygiene before it)."""
    from hermes_session_guard.selftest.gateway import start_gateway

    from .test_buffering import _open_session, echo, new_tag

    async def scenario() -> tuple[list[str], str]:
        gw = await start_gateway()
        try:
            source = gw.source()
            sid = await _open_session(gw, llm, trigger, source, new_tag())
            llm.configure(reply_fn=echo)
            await gw.send_text("trigger", source=source)
            await gw.drain()
            return gw.replies(), sid
        finally:
            await gw.adapter.cancel_background_tasks()  # as a gateway shutdown does

    return asyncio.run(scenario())


@pytest.mark.parametrize("trigger", ["preflight", "hygiene"])
def test_a_platform_chat_sees_the_compaction_as_status_lines(
    guard: Any, llm: ScriptedLLMServer, home: Path, trigger: str
) -> None:
    """A chat whose session compacts in its turn gets a status line when the compaction
    starts and one when it ends, through the status callback the gateway gave the turn's
    agent, before the answer. The gateway's own session hygiene compacts with a quiet agent
    that has no status channel: its end line is posted before the turn's answer."""
    replies, sid = _chat_after_compaction(llm, home, trigger)
    (op,) = [c["op_id"] for c in guard.store_for(home / "state.db").compressions(sid)]
    started = [i for i, r in enumerate(replies) if _STARTED_LINE.fullmatch(r)]
    done = [i for i, r in enumerate(replies) if _DONE_LINE.fullmatch(r)]
    answer = replies.index("re: trigger")
    assert len(done) == 1 and done[0] < answer, replies
    end = _DONE_LINE.fullmatch(replies[done[0]])
    assert end is not None and end[3] == op and end[4].startswith(f"{sid}.snapshot."), replies
    assert int(end[2]) < int(end[1])
    if trigger == "preflight":
        assert len(started) == 1 and started[0] < done[0], replies
        begun = _STARTED_LINE.fullmatch(replies[started[0]])
        assert begun is not None and begun[2] == op and begun[1] == end[1]
    else:
        assert started == [], replies
    assert not any("-1:" in r for r in replies if r.startswith(("Compacting", "Context")))  # no seeded text


def test_chat_status_off_posts_no_status_line(guard: Any, llm: ScriptedLLMServer, home: Path) -> None:
    """``events.chat_status: false``: the chat gets the answer and no compaction line."""
    from dataclasses import replace

    before = guard.config
    guard.config = replace(before, events=replace(before.events, chat_status=False))
    try:
        replies, sid = _chat_after_compaction(llm, home, "preflight")
    finally:
        guard.config = before
    assert guard.store_for(home / "state.db").compressions(sid), "the turn did not compact"
    assert "re: trigger" in replies
    assert not [r for r in replies if _STARTED_LINE.fullmatch(r) or _DONE_LINE.fullmatch(r)], replies
