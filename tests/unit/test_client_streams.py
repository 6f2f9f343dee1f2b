"""The compaction on each API server stream in that stream's own vocabulary (docs/events.md):
SSE comment lines through the writer's queue on ``/v1/chat/completions`` and
``/v1/responses`` (both of Hermes's queue kinds), Hermes-style named events on the session
chat stream, and the ACP schema's own compaction update where one exists."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from hermes_session_guard.hooks.specs import CompactionEvent
from hermes_session_guard.host import client_events

STARTED = CompactionEvent(name="compaction.started", session_id="S", op_id="ab12", strategy="host_in_place",
                          release="0.19.0", messages_before=49)
DONE = CompactionEvent(name="compaction.completed", session_id="S", op_id="ab12", strategy="host_in_place",
                       release="0.19.0", messages_before=49, messages_after=13, outcome="done",
                       snapshot_id="S.snapshot.x")


def test_the_comment_line_is_an_sse_comment_of_ids_and_counts() -> None:
    assert client_events.comment_line(STARTED) == b": session_guard compaction.started op=ab12 messages_before=49\n\n"
    line = client_events.comment_line(DONE).decode()
    assert line.startswith(": ") and line.endswith("\n\n") and line.count("\n") == 2
    assert "outcome=done" in line and "messages_after=13" in line


def _handler_callback(handler: str, **cells: Any) -> Any:
    """A callback as Hermes's handler ``handler`` defines it: a closure over ``cells``."""
    names = ", ".join(cells)
    namespace: dict[str, Any] = {}
    exec(f"def outer({names}):\n    def cb(*a, **k):\n        return ({names},)\n    return cb\n", namespace)
    callback = namespace["outer"](*cells.values())
    callback.__qualname__ = f"APIServerAdapter.{handler}.<locals>._on_tool_start"
    return callback


class _Agent:
    platform = "api_server"
    tool_progress_callback = None
    tool_complete_callback = None

    def __init__(self, start: Any) -> None:
        self.tool_start_callback = start


async def _no_write(line: bytes) -> None:
    raise AssertionError("nothing should be written")


@pytest.mark.parametrize("handler", ["_handle_chat_completions", "_handle_responses"])
def test_a_chat_or_responses_stream_gets_comment_lines_in_order_on_a_thread_queue(handler: str) -> None:
    """Up to 0.19 the writer reads a ``queue.Queue`` on an executor thread: the comment is
    written on the loop, in its place between Hermes's own items."""
    inner: queue.Queue[Any] = queue.Queue()
    written: list[bytes] = []
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def write(line: bytes) -> None:
        written.append(line)

    try:
        commenting = client_events.CommentingQueue(inner, write, loop)
        agent = _Agent(_handler_callback(handler, _stream_q=inner))
        inner.put("before")
        client_events.deliver(agent, STARTED)
        inner.put("after")
        client_events.deliver(agent, DONE)
        assert commenting.get(timeout=1) == "before" and written == []
        assert commenting.get(timeout=1) == "after"
        assert written == [client_events.comment_line(STARTED)]
        inner.put(None)
        assert commenting.get_nowait() is None  # the drain after the agent ended drops what is left
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_an_async_queue_gets_comment_lines_through_put_threadsafe() -> None:
    """0.20+: ``ThreadSafeAsyncQueue`` (an ``asyncio.Queue`` with ``put_threadsafe``)."""

    class ThreadSafeAsyncQueue(asyncio.Queue):  # type: ignore[type-arg]
        def put_threadsafe(self, item: Any) -> None:
            self.put_nowait(item)

    async def run() -> tuple[list[Any], list[bytes]]:
        inner = ThreadSafeAsyncQueue()
        written: list[bytes] = []

        async def write(line: bytes) -> None:
            written.append(line)

        commenting = client_events.CommentingQueue(inner, write, asyncio.get_running_loop())
        agent = _Agent(_handler_callback("_handle_chat_completions", _stream_q=inner))
        client_events.deliver(agent, STARTED)
        inner.put_nowait("text")
        got = [await asyncio.wait_for(commenting.get(), 1)]
        return got, written

    got, written = asyncio.run(run())
    assert got == ["text"] and written == [client_events.comment_line(STARTED)]


def test_a_queue_no_writer_reads_through_the_guard_gets_nothing() -> None:
    """A stream whose writer the seam did not wrap (it failed, or another handler): no
    comment is put on its queue, where Hermes's writer would send it as content."""
    inner: queue.Queue[Any] = queue.Queue()
    client_events.deliver(_Agent(_handler_callback("_handle_chat_completions", _stream_q=inner)), STARTED)
    assert inner.empty()


def test_with_records_on_the_chat_stream_gets_hermes_tool_progress_not_a_comment() -> None:
    inner: queue.Queue[Any] = queue.Queue()
    loop = asyncio.new_event_loop()
    client_events.CommentingQueue(inner, _no_write, loop)
    loop.close()
    calls: list[tuple[Any, ...]] = []
    start = _handler_callback("_handle_chat_completions", _stream_q=inner)
    agent = _Agent(lambda *a: calls.append(("start", *a)))
    agent.tool_start_callback.__qualname__ = start.__qualname__
    client_events.deliver(agent, STARTED, chat_records=True)
    assert inner.empty() and calls[0][2] == client_events.TOOL_NAME


@pytest.mark.parametrize("release", ["0.19", "0.22"])
def test_the_session_chat_stream_gets_named_events_through_its_own_enqueue(release: str) -> None:
    """``/api/sessions/{id}/chat/stream``: ``compaction.*`` under its own name with the
    handler's message id, through ``_enqueue`` (0.17-0.20) or ``events.enqueue`` (0.22)."""
    sent: list[tuple[str, dict[str, Any]]] = []

    class Events:
        def enqueue(self, name: str, payload: dict[str, Any]) -> None:
            sent.append((name, payload))

    def enqueue(name: str, payload: dict[str, Any]) -> None:
        sent.append((name, payload))

    cells = {"_enqueue": enqueue} if release == "0.19" else {"events": Events()}
    progress = _handler_callback("_handle_session_chat_stream", message_id="msg_1", **cells)
    agent = _Agent(None)
    agent.tool_progress_callback = progress
    client_events.deliver(agent, STARTED)
    client_events.deliver(agent, DONE)
    assert [name for name, _ in sent] == ["compaction.started", "compaction.completed"]
    assert sent[0][1] == {"message_id": "msg_1", **{k: v for k, v in STARTED.fields().items() if k != "name"}}
    assert sent[1][1]["outcome"] == "done" and sent[1][1]["messages_after"] == 13


def test_the_installed_acp_schema_has_no_compaction_update_yet() -> None:
    """When it gains one (0.9.0 to 0.12.1 have none), ACP clients get it instead of a tool call."""
    pytest.importorskip("acp")
    assert client_events.acp_compaction_update() is None


def test_an_acp_schema_with_a_compaction_update_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    schema = pytest.importorskip("acp.schema")

    class CompactionUpdate(BaseModel):
        model_config = ConfigDict(populate_by_name=True)
        session_update: Literal["compaction_update"] = Field(alias="sessionUpdate")

    monkeypatch.setattr(schema, "CompactionUpdate", CompactionUpdate, raising=False)
    assert client_events.acp_compaction_update() is CompactionUpdate
