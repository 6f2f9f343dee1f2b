"""Real clients of the real API server across a compacting turn, guarded and unguarded
(docs/events.md, "What each client receives"):

- the official ``openai`` SDK on ``/v1/chat/completions``: the plain loop
  (``for chunk in stream: chunk.choices[0].delta.content``) and the ``stream()`` helper
  read the whole answer; guarded, the stream carries SSE comment lines and no record Hermes
  itself did not send (with ``events.chat_completions_records`` the guard's
  ``hermes.tool.progress`` records, which the plain loop cannot read: the documented caveat);
- the ``openai`` SDK on ``/v1/responses``: the event loop and the ``stream()`` helper;
- ``/api/sessions/{id}/chat/stream``: ``compaction.started`` then ``compaction.completed``,
  in Hermes's own event style, between ``message.started`` and ``assistant.completed``;
- ACP, with ``hermes-acp-sdk``'s ``EventHandler`` as the client: a tool call for the compaction,
  every update valid in the installed ACP schema.

One compacting turn per test; every stream is read raw too (what it received is asserted, and
printed for the table in docs/events.md).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from hermes_session_guard.selftest import probe

from ..fake_llm import ScriptedLLMServer
from .api_turns import API_KEY, ApiServer, running_api_server
from .conftest import DEFERS_TO_USAGE, HOST

SID = "20260601_140000_c1c1c1c1"
PROMPT = "and now?"


@pytest.fixture(params=["guarded", "unguarded"])
def guarded(request: pytest.FixtureRequest) -> bool:
    request.getfixturevalue("guard" if request.param == "guarded" else "no_guard")
    return bool(request.param == "guarded")


@pytest.fixture
def server(home: Path) -> Iterator[ApiServer]:
    with running_api_server(home) as srv:
        yield srv


class _Tee(httpx.HTTPTransport):
    """httpx's own transport, keeping a copy of every response body it streams."""

    def __init__(self) -> None:
        super().__init__()
        self.raw = bytearray()

    def handle_request(self, request: Any) -> Any:
        response = super().handle_request(request)
        stream, raw = response.stream, self.raw
        assert isinstance(stream, httpx.SyncByteStream)

        class Copying(httpx.SyncByteStream):
            def __iter__(self) -> Iterator[bytes]:
                for chunk in stream:
                    raw.extend(chunk)
                    yield chunk

            def close(self) -> None:
                stream.close()

        response.stream = Copying()
        return response


def _client(srv: ApiServer) -> tuple[Any, _Tee]:
    tee = _Tee()
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key=API_KEY, max_retries=0, timeout=300,
                           http_client=httpx.Client(transport=tee, timeout=300))
    return client, tee


def records(raw: bytes) -> list[str]:
    """What an SSE stream carried, one entry per record: ``: comment``, ``event: <name>`` or ``data``."""
    out = []
    for block in raw.decode().split("\n\n"):
        lines = [line for line in block.splitlines() if line]
        if not lines:
            continue
        named = [line for line in lines if line.startswith("event:")]
        out.append(named[0] if named else (lines[0] if lines[0].startswith(":") else "data"))
    return out


def _seed(db: Any) -> list[dict[str, Any]]:
    messages = probe.seed_messages(tag="cli")
    probe.seed_session(db, SID, messages, source="api_server")
    return messages


def _compacted(llm: ScriptedLLMServer, seen: list[str]) -> None:
    if not llm.summary_requests():
        pytest.fail(f"the turn did not compact (Hermes {HOST}); received {seen}")


def _check_guard_records(guarded: bool, seen: list[str]) -> None:
    """Guarded: the guard's comment lines are there and nothing else of the guard's."""
    comments = [r for r in seen if r.startswith(": session_guard")]
    if guarded:
        assert [c.split()[2] for c in comments] == ["compaction.started", "compaction.completed"], seen
    else:
        assert comments == [], seen
    assert "event: hermes.tool.progress" not in seen, seen  # no tools run in this turn


def test_the_openai_plain_loop_reads_a_compacting_chat_stream(
    guarded: bool, db: Any, llm: ScriptedLLMServer, server: ApiServer
) -> None:
    _seed(db)
    client, tee = _client(server)
    stream = client.chat.completions.create(model="fake-model", stream=True,
                                            messages=[{"role": "user", "content": PROMPT}],
                                            extra_headers={"X-Hermes-Session-Id": SID})
    loop_failed = None
    try:
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)  # what everyone writes
    except TypeError as exc:  # a named record the SDK yields as a chunk without choices
        loop_failed = exc
        for _ in stream:  # read the rest, to see what the stream carried
            pass
    seen = records(bytes(tee.raw))
    print(f"chat.completions plain loop, {'guarded' if guarded else 'unguarded'}: "
          f"{'TypeError' if loop_failed else 'ok'} {seen}")
    _compacted(llm, seen)
    _check_guard_records(guarded, seen)
    if loop_failed is not None:
        # only where Hermes itself names a record on this turn (0.22: hermes.status while it
        # compacts), guard or not; the guard's own are comments
        assert HOST >= (0, 21, 0) and "event: hermes.status" in seen, seen
        return
    assert text, seen


def test_the_openai_stream_helper_reads_a_compacting_chat_stream(
    guarded: bool, db: Any, llm: ScriptedLLMServer, server: ApiServer
) -> None:
    _seed(db)
    client, tee = _client(server)
    with client.chat.completions.stream(model="fake-model", messages=[{"role": "user", "content": PROMPT}],
                                        extra_headers={"X-Hermes-Session-Id": SID}) as stream:
        kinds = {event.type for event in stream}
        final = stream.get_final_completion()
    seen = records(bytes(tee.raw))
    print(f"chat.completions stream(), {'guarded' if guarded else 'unguarded'}: {seen}")
    assert "content.delta" in kinds and final.choices[0].message.content, kinds
    _compacted(llm, seen)
    _check_guard_records(guarded, seen)


def test_with_records_opted_in_the_chat_stream_carries_hermes_tool_progress(
    guard: Any, db: Any, llm: ScriptedLLMServer, server: ApiServer
) -> None:
    """``events.chat_completions_records: true``: Hermes's ``hermes.tool.progress`` record,
    running then completed; the SDK yields each as a chunk without choices (the caveat)."""
    guard.config = replace(guard.config, events=replace(guard.config.events, chat_completions_records=True))
    _seed(db)
    client, tee = _client(server)
    stream = client.chat.completions.create(model="fake-model", stream=True,
                                            messages=[{"role": "user", "content": PROMPT}],
                                            extra_headers={"X-Hermes-Session-Id": SID})
    chunks = list(stream)
    seen = records(bytes(tee.raw))
    print(f"chat.completions with chat_completions_records: {seen}")
    assert seen.count("event: hermes.tool.progress") == 2, seen
    assert not [r for r in seen if r.startswith(": session_guard")], seen
    assert any(chunk.choices is None for chunk in chunks)  # why it is opt-in
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), seen


def _responses_input(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [*({"role": m["role"], "content": m["content"]} for m in messages), {"role": "user", "content": PROMPT}]


@pytest.mark.parametrize("consumer", ["loop", "stream_helper"])
def test_the_openai_responses_stream_reads_a_compacting_turn(
    guarded: bool, consumer: str, db: Any, llm: ScriptedLLMServer, server: ApiServer
) -> None:
    """``/v1/responses`` with the history in ``input``: the SDK's event loop and its
    ``stream()`` helper get every Responses event and the answer; guarded, comment lines."""
    if DEFERS_TO_USAGE:
        pytest.skip("Hermes 0.21+ compacts only on its provider's usage report, which an input-only "
                    "history on /v1/responses never has")
    messages = probe.seed_messages(tag="cli")
    client, tee = _client(server)
    helper_failed = None
    if consumer == "loop":
        events = list(client.responses.create(model="fake-model", input=_responses_input(messages), stream=True))
        text = "".join(getattr(e, "delta", "") for e in events if e.type == "response.output_text.delta")
    else:
        try:
            with client.responses.stream(model="fake-model", input=_responses_input(messages)) as stream:
                events = list(stream)
                text = stream.get_final_response().output_text
        except IndexError as exc:  # the helper indexes the content parts a message item announced
            helper_failed = exc
    seen = records(bytes(tee.raw))
    print(f"responses {consumer}, {'guarded' if guarded else 'unguarded'}: "
          f"{'helper ' + type(helper_failed).__name__ if helper_failed else 'ok'} {seen}")
    _compacted(llm, seen)
    _check_guard_records(guarded, seen)
    if helper_failed is not None:
        # Hermes's own stream (guard or not) sends text deltas without response.content_part.added
        assert "event: response.content_part.added" not in seen and "event: response.output_text.delta" in seen
        return
    assert text and events[-1].type == "response.completed", [e.type for e in events]


def test_the_session_chat_stream_names_the_compaction_in_its_own_events(
    guarded: bool, db: Any, llm: ScriptedLLMServer, server: ApiServer
) -> None:
    """``/api/sessions/{id}/chat/stream`` (Hermes's web and dashboard chat): guarded,
    ``compaction.started`` then ``compaction.completed`` with the stream's own session id,
    run id and sequence, in counts and ids."""
    _seed(db)
    request = urllib.request.Request(f"{server.base}/api/sessions/{SID}/chat/stream",
                                     data=json.dumps({"message": PROMPT}).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {API_KEY}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            pytest.skip(f"Hermes {HOST} has no session chat stream")
        raise
    seen = records(raw)
    print(f"session chat stream, {'guarded' if guarded else 'unguarded'}: {seen}")
    events: dict[str, dict[str, Any]] = {}
    for block in raw.decode().split("\n\n"):
        name = next((line[7:] for line in block.splitlines() if line.startswith("event: ")), None)
        data = next((line[6:] for line in block.splitlines() if line.startswith("data: ")), None)
        if name and data:
            events.setdefault(name, json.loads(data))
    names = [r[7:] for r in seen if r.startswith("event: ")]
    assert names[-1] == "done" and "assistant.completed" in names, names
    _compacted(llm, seen)
    ours = [n for n in names if n.startswith("compaction.")]
    if not guarded:
        assert ours == [], names
        return
    assert ours == ["compaction.started", "compaction.completed"], names
    assert names.index("message.started") < names.index("compaction.started")
    assert names.index("compaction.completed") < names.index("assistant.completed")
    started, ended = events["compaction.started"], events["compaction.completed"]
    assert started["session_id"] == SID and started["run_id"] == events["run.started"]["run_id"]
    assert started["op_id"] == ended["op_id"] and ended["outcome"] == "done" and ended["seq"] > started["seq"]
    assert PROMPT not in json.dumps([started, ended]) and "cli-" not in json.dumps([started, ended])


def test_an_acp_sdk_client_reads_the_compaction_as_a_tool_call(
    guarded: bool, db: Any, llm: ScriptedLLMServer, home: Path
) -> None:
    """``hermes-acp-sdk``'s own ``EventHandler`` as the ACP client of a prompt that compacts:
    guarded, one ``ToolCall`` in progress then completed for the compaction, every
    ``session/update`` a valid ``SessionNotification`` of the installed schema that
    round-trips through its JSON; unguarded, no such tool call. The answer streams either way."""
    sdk = pytest.importorskip("hermes_acp_sdk.handler", reason="hermes-acp-sdk is not installed")
    policy = pytest.importorskip("hermes_acp_sdk.policy")
    try:
        from acp.schema import SessionNotification, TextContentBlock
        from acp_adapter.server import HermesACPAgent
        from acp_adapter.session import SessionManager
    except ImportError as exc:
        pytest.skip(f"ACP is not importable on this release ({exc})")
    import asyncio

    from .conftest import anchor_on_real_usage

    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages, source="acp")
    acp_agent = HermesACPAgent(SessionManager(db=probe.open_db(home / "state.db")))
    handler = sdk.EventHandler(policy.DenyAll(), policy.FsPolicy(), policy.TerminalPolicy())
    updates: list[Any] = []
    session_update = handler.session_update

    async def keep(session_id: str, update: Any, **kwargs: Any) -> None:
        updates.append(update)
        await session_update(session_id, update, **kwargs)

    handler.session_update = keep
    acp_agent.on_connect(handler)
    state = acp_agent.session_manager.get_session(SID)
    assert state is not None
    if DEFERS_TO_USAGE:
        anchor_on_real_usage(state.agent, messages)
    response = asyncio.run(acp_agent.prompt(prompt=[TextContentBlock(type="text", text=PROMPT)], session_id=SID))
    assert response.stop_reason == "end_turn", response
    _compacted(llm, [type(u).__name__ for u in updates])
    events = []
    queue = handler.queue_for(SID)
    while not queue.empty():
        events.append(queue.get_nowait())
    for update in updates:
        wire = SessionNotification(session_id=SID, update=update).model_dump_json(by_alias=True, exclude_none=True)
        assert SessionNotification.model_validate_json(wire).update == update
    ours = [e for e in events if type(e).__name__ == "ToolCall" and e.tool_call_id.startswith("session_guard.")]
    print(f"ACP via hermes-acp-sdk, {'guarded' if guarded else 'unguarded'}: "
          f"{[type(e).__name__ for e in events]} ours={[e.status for e in ours]}")
    assert any(type(e).__name__ == "AgentText" for e in events), events
    assert [e.status for e in ours] == (["in_progress", "completed"] if guarded else []), events


def test_the_tui_shows_one_line_per_compaction(guarded: bool, db: Any, llm: ScriptedLLMServer, tui: Any) -> None:
    """The TUI's ``status.update`` frames of a compacting turn: the lines its transcript and
    activity list show (every kind but ``status``, the status bar) are Hermes's own, guarded
    as unguarded (its "Compacting context" line; 0.20+ also its ``compacted`` line); guarded,
    the guard's facts reach the status bar when the compaction ends."""
    from .conftest import anchor_on_real_usage
    from .tui_import import tui_resume

    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages, source="tui")
    server_module, frames = tui
    send = tui_resume(server_module, frames, SID)
    if DEFERS_TO_USAGE:
        anchor_on_real_usage(server_module._sessions[send.live]["agent"], messages)
    send(PROMPT)
    _compacted(llm, [])
    every = [(str(u.get("kind")), str(u.get("text", ""))) for u in frames.events(send.live, "status.update")]
    print(f"TUI, {'guarded' if guarded else 'unguarded'}: {[(kind, text[:40]) for kind, text in every]}")
    lines = [(kind, text) for kind, text in every if kind != "status"]
    assert [text for _, text in lines if "Compacting context" in text], every  # Hermes's own
    assert not [text for _, text in lines if text.startswith(("Compacting the context", "Context compact"))], every
    bar = [text for kind, text in every if kind == "status" and text.startswith("Context compacted: ")]
    assert len(bar) == (1 if guarded else 0), every


def test_run_events_name_the_compaction_only_guarded(
    guarded: bool, db: Any, llm: ScriptedLLMServer, server: ApiServer
) -> None:
    """``/v1/runs/{id}/events``: ``compaction.started`` and ``.completed`` guarded, none unguarded."""
    from .api_turns import post

    messages = _seed(db)
    body: dict[str, Any] = {"input": PROMPT, "session_id": SID}
    if not DEFERS_TO_USAGE:
        body["conversation_history"] = [{"role": m["role"], "content": m["content"]} for m in messages]
    reply = post(server.base + "/v1/runs", body)
    assert reply.status in (200, 202), reply.body
    request = urllib.request.Request(f"{server.base}/v1/runs/{reply.body['run_id']}/events",
                                     headers={"Authorization": f"Bearer {API_KEY}"})
    names = []
    with urllib.request.urlopen(request, timeout=300) as stream:
        for raw in stream:
            line = raw.decode().strip()
            if line.startswith("data: "):
                names.append(json.loads(line[6:]).get("event"))
                if names[-1] in ("run.completed", "run.failed"):
                    break
    print(f"run events, {'guarded' if guarded else 'unguarded'}: {names}")
    assert names[-1] == "run.completed", names
    _compacted(llm, names)
    ours = [n for n in names if str(n).startswith("compaction.")]
    assert ours == (["compaction.started", "compaction.completed"] if guarded else []), names
