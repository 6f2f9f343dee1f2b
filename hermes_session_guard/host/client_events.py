"""Compaction events on the API server's client streams, through the callbacks Hermes
gave the compacting agent (docs/events.md, ADR "standard records only by default").

- ``/v1/runs`` events: the agent's ``tool_progress_callback`` is the run's event
  callback; it is called with the event's name (``compaction.started`` ...) and its
  fields, and the ``api_run_events`` seam lets those names through to the run's stream
  as ``{"event": "compaction.started", "run_id", "timestamp", ...fields}``
  (:func:`run_event`).
- ``/api/sessions/{id}/chat/stream``: the agent's ``tool_progress_callback`` is a closure of
  that handler; its own enqueue (``_enqueue`` up to 0.20, ``events.enqueue`` on 0.22) sends
  ``event: compaction.started`` ... with the event's fields, and Hermes adds the stream's
  ``session_id``, ``run_id``, ``seq`` and ``ts`` as to its own ``run.started``, ``tool.progress``.
- ``/v1/chat/completions`` and ``/v1/responses`` SSE: by default one SSE comment line per
  event (``: session_guard compaction.started op=... messages_before=...``), which no SSE
  client parses as data: the handler's stream queue (the ``_stream_q`` of its tool
  callbacks) carries it to the writer, which the ``api_stream_comments`` /
  ``api_responses_stream_comments`` seams give a :class:`CommentingQueue`. With
  ``events.chat_completions_records`` the chat completions stream carries Hermes's own
  ``hermes.tool.progress`` record instead, through the handler's ``tool_start_callback`` /
  ``tool_complete_callback`` (``tool`` ``session_guard.compaction``, ``toolCallId``
  ``session_guard.compaction.<op id>``, ``status`` ``running`` then ``completed``): typed
  clients that accept those (``hermes-agent-api-client``) show them, but the ``openai``
  SDK yields each as a chunk without ``choices``.

Only agents of the API server (``agent.platform == "api_server"``) are told that way: on the
other entry points these callbacks draw tool rows in a terminal or chat.

- TUI gateway: Hermes itself posts a line when it starts compacting, on every release
  ("Compacting context": kind ``lifecycle``, re-tagged ``compacting`` from 0.17; 0.20+ also
  ``compacted`` when done). So the guard adds no line of its own: when the compaction ends
  the agent's ``status_callback`` that the TUI gateway gave it (defined in a ``tui_gateway``
  module) puts the guard's facts (:func:`status_text`) on the TUI's status bar (Hermes's
  kind ``status``, which the TUI shows there only).
- Platform gateway (Telegram, Discord, ...): the agent's ``status_callback`` that the
  gateway gave its turn (defined in a ``gateway`` module) with ``kind``
  ``session_guard.compaction`` and the same line, when the compaction starts and ends;
  the gateway posts it to the chat (Telegram and Slack edit one status message per
  kind in place). Switched by ``events.chat_status``. A compaction whose agent has no
  status channel (the gateway's own session hygiene runs a quiet agent before the
  turn) leaves its end line to :func:`has_status_channel`'s caller.
- ACP: the session's client gets (until the installed ACP schema has a ``compaction_update``
  session update, :func:`acp_compaction_update`; none of 0.9.0 to 0.12.1 has) a
  ``session/update`` tool call (``tool_call``, title
  :func:`status_text`, kind ``other``, ``rawInput`` op id and messages, status
  ``in_progress``) when the compaction starts and a ``tool_call_update`` of the same id
  when it ends (status ``completed``, or ``failed`` for a failed compaction; ``rawOutput``
  the event's fields). Every ACP client knows tool calls. The connection, session and
  loop are those of the ACP adapter's own ``tool_progress_callback`` on the agent (a
  closure of ``acp_adapter.events``), sent with its own ``_send_update``.

Ids, counts, durations and reasons only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import time
import typing
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

from ..compaction_event import COMPACTION_EVENTS, COMPACTION_STARTED, CompactionEvent

TOOL_NAME = "session_guard.compaction"
API_PLATFORM = "api_server"
_CHAT_HANDLER = "_handle_chat_completions"  # the chat completions handler's own callbacks
_RESPONSES_HANDLER = "_handle_responses"
_SESSION_STREAM_HANDLER = "_handle_session_chat_stream"
COMMENT_TAG = "__session_guard_comment__"
# Hermes's own TUI status kind the TUI shows on its status bar only (tui_gateway ``_status_update``).
TUI_BAR_KIND = "status"
ACP_COMPACTION_UPDATE = "compaction_update"


def tool_call_id(op_id: str) -> str:
    return f"{TOOL_NAME}.{op_id}"


def status_text(event: CompactionEvent) -> str:
    """The TUI's status line for ``event``: what happened, counts and ids, no message text."""
    op = f"op {event.op_id}"
    if not event.ended:
        return f"Compacting the context: {event.messages_before} messages ({op})"
    if event.outcome == "done":
        kept = f", snapshot {event.snapshot_id}" if event.snapshot_id else ""
        return f"Context compacted: {event.messages_before} -> {event.messages_after} messages ({op}{kept})"
    if event.outcome == "adopted":
        return f"Context compaction: this session was already compacted, continuing on it ({op})"
    reason = f": {event.reason}" if event.reason else ""
    return f"Context compaction {event.outcome or 'ended'}, nothing changed{reason} ({op})"


def _callback_of(agent: Any, name: str, module: str) -> Any:
    """``agent``'s callback ``name`` when a module of ``module`` (a package) defined it."""
    callback = getattr(agent, name, None)
    owner = str(getattr(callback, "__module__", ""))
    return callback if callable(callback) and (owner == module or owner.startswith(module + ".")) else None


def tui_status(event: CompactionEvent) -> tuple[str, str] | None:
    """The TUI ``status.update`` (kind, text) for ``event``, None for none: the facts on the
    status bar when it ends, beside Hermes's own line for the compaction, never a second line."""
    return (TUI_BAR_KIND, status_text(event)) if event.ended else None


def _status_line(agent: Any, event: CompactionEvent, chat_status: bool) -> None:
    tui = _callback_of(agent, "status_callback", "tui_gateway")
    if tui is not None:
        update = tui_status(event)
        if update is not None:
            tui(*update)
        return
    callback = _callback_of(agent, "status_callback", "gateway") if chat_status else None
    if callback is not None:
        callback(TOOL_NAME, status_text(event))


def has_status_channel(agent: Any) -> bool:
    """Whether :func:`deliver` can tell anyone about ``agent``'s compaction as it runs."""
    return (getattr(agent, "platform", None) == API_PLATFORM
            or callable(getattr(agent, "status_callback", None))
            or _callback_of(agent, "tool_progress_callback", "acp_adapter") is not None)


def acp_compaction_update() -> Any:
    """The installed ACP schema's own compaction session update (a model whose
    ``session_update`` is ``compaction_update``), None where it has none (0.9.0-0.12.1)."""
    from acp import schema

    for value in vars(schema).values():
        fields = getattr(value, "model_fields", None) if isinstance(value, type) else None
        field = fields.get("session_update") if isinstance(fields, dict) else None
        if field is not None and ACP_COMPACTION_UPDATE in typing.get_args(field.annotation):
            return value
    return None


def _acp_update(agent: Any, event: CompactionEvent) -> None:
    callback = _callback_of(agent, "tool_progress_callback", "acp_adapter")
    code, cells = getattr(callback, "__code__", None), getattr(callback, "__closure__", None)
    if code is None or not cells:
        return
    bound = dict(zip(code.co_freevars, (c.cell_contents for c in cells), strict=False))
    conn, session_id, loop = bound.get("conn"), bound.get("session_id"), bound.get("loop")
    if conn is None or not session_id or loop is None:
        return
    import acp
    from acp_adapter.events import _send_update

    call_id = tool_call_id(event.op_id)
    update: Any
    own = acp_compaction_update()
    if own is not None:  # the protocol's own update, where the installed schema accepts these fields
        try:
            update = own.model_validate({"sessionUpdate": ACP_COMPACTION_UPDATE, **event.fields()})
        except ValueError:  # pydantic's ValidationError: this schema's update wants other fields
            pass
        else:
            _send_update(conn, session_id, loop, update)
            return
    if event.name == COMPACTION_STARTED:
        update = acp.start_tool_call(call_id, status_text(event), kind="other", status="in_progress",
                                     raw_input={"op_id": event.op_id, "messages": event.messages_before})
    else:
        update = acp.update_tool_call(call_id, title=status_text(event),
                                      status="failed" if event.outcome == "failed" else "completed",
                                      raw_output=event.fields())
    _send_update(conn, session_id, loop, update)


def comment_line(event: CompactionEvent) -> bytes:
    """The SSE comment line for ``event``: ids and counts, never parsed as data by a client."""
    facts = [f"op={event.op_id}", f"messages_before={event.messages_before}"]
    if event.ended:
        facts += [f"outcome={event.outcome}", f"messages_after={event.messages_after}"]
    return f": session_guard {event.name} {' '.join(facts)}\n\n".encode()


def _closure(callback: Any) -> dict[str, Any]:
    code, cells = getattr(callback, "__code__", None), getattr(callback, "__closure__", None) or ()
    return dict(zip(code.co_freevars, (c.cell_contents for c in cells), strict=False)) if code else {}


def _session_stream_event(callback: Any, event: CompactionEvent) -> bool:
    """Send ``event`` on the ``/api/sessions/{id}/chat/stream`` whose callback this is, under its
    own name, through that handler's enqueue; False when ``callback`` is not one."""
    if _SESSION_STREAM_HANDLER not in getattr(callback, "__qualname__", ""):
        return False
    bound = _closure(callback)
    enqueue = bound.get("_enqueue") or getattr(bound.get("events"), "enqueue", None)
    if callable(enqueue):
        enqueue(event.name, {"message_id": bound.get("message_id"),
                             **{k: v for k, v in event.fields().items() if k != "name"}})
    return True


_COMMENTED: weakref.WeakKeyDictionary[Any, CommentingQueue] = weakref.WeakKeyDictionary()


def _comment(callback: Any, event: CompactionEvent) -> None:
    commenting = _COMMENTED.get(_closure(callback).get("_stream_q"))
    if commenting is not None:
        commenting.put_comment(comment_line(event))


def deliver(agent: Any, event: CompactionEvent, chat_status: bool = True, chat_records: bool = False) -> None:
    """Tell the client streams of the API server request, the TUI session, the ACP
    session or (``chat_status``) the platform gateway's chat that runs ``agent``;
    ``chat_records``: Hermes's ``hermes.tool.progress`` records on the chat completions
    stream instead of a comment line."""
    if getattr(agent, "platform", None) != API_PLATFORM:
        _status_line(agent, event, chat_status)
        _acp_update(agent, event)
        return
    fields = event.fields()
    progress = getattr(agent, "tool_progress_callback", None)
    if callable(progress) and not _session_stream_event(progress, event):
        progress(event.name, TOOL_NAME, None, None, **{k: v for k, v in fields.items() if k != "name"})
    start = getattr(agent, "tool_start_callback", None)
    handler = getattr(start, "__qualname__", "")
    if _RESPONSES_HANDLER in handler or (_CHAT_HANDLER in handler and not chat_records):
        _comment(start, event)
        return
    callback = getattr(agent, "tool_start_callback" if event.name == COMPACTION_STARTED
                       else "tool_complete_callback", None)
    if not callable(callback) or _CHAT_HANDLER not in getattr(callback, "__qualname__", ""):
        return
    args = {"op_id": event.op_id, "messages": event.messages_before}
    if event.name == COMPACTION_STARTED:
        callback(tool_call_id(event.op_id), TOOL_NAME, args)
    else:
        callback(tool_call_id(event.op_id), TOOL_NAME, args, event.outcome or "")


class CommentingQueue:
    """The stream queue of a chat completions or Responses handler as its SSE writer reads
    it: the guard's comment lines (tagged :data:`COMMENT_TAG`) are written to the response
    in their place in the stream (``write``, on the server's loop), everything else is
    Hermes's. Works with both of Hermes's queues: ``queue.Queue`` read on an executor
    thread (up to 0.19) and its ``asyncio.Queue`` with ``put_threadsafe`` (0.20+)."""

    def __init__(self, inner: Any, write: Callable[[bytes], Coroutine[Any, Any, None]],
                 loop: asyncio.AbstractEventLoop) -> None:
        self._inner, self._write, self._loop = inner, write, loop
        self._async = inspect.iscoroutinefunction(getattr(inner, "get", None))
        _COMMENTED[inner] = self

    def put_comment(self, line: bytes) -> None:
        item = (COMMENT_TAG, line)
        if not self._async:
            self._inner.put(item)
        elif callable(getattr(self._inner, "put_threadsafe", None)):
            self._inner.put_threadsafe(item)
        else:
            self._loop.call_soon_threadsafe(self._inner.put_nowait, item)

    def get(self, *args: Any, **kwargs: Any) -> Any:
        if self._async:
            return self._get_async()
        while True:
            item = self._inner.get(*args, **kwargs)
            if not _is_comment(item):
                return item
            # waits for the line to be written (the writer's own errors are its to report), never raises
            concurrent.futures.wait([asyncio.run_coroutine_threadsafe(self._write(item[1]), self._loop)], timeout=30)

    async def _get_async(self) -> Any:
        while True:
            item = await self._inner.get()
            if not _is_comment(item):
                return item
            await self._write(item[1])

    def get_nowait(self) -> Any:
        """The writer's drain after the agent finished, on the loop: a comment left there is dropped."""
        while True:
            item = self._inner.get_nowait()
            if not _is_comment(item):
                return item

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _is_comment(item: Any) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and item[0] == COMMENT_TAG


def run_event(run_id: str, event_type: str, fields: dict[str, Any]) -> dict[str, Any] | None:
    """The ``/v1/runs`` event for a compaction event passed to a run's callback, in the
    shape of Hermes's own run events; None for any other event type."""
    if event_type not in COMPACTION_EVENTS:
        return None
    return {"event": event_type, "run_id": run_id, "timestamp": time.time(), **fields}


def push_run_event(adapter: Any, run_id: str, loop: Any, event: dict[str, Any]) -> None:
    """Put ``event`` on the run's event queue the way Hermes's own callback does."""
    queue = getattr(adapter, "_run_streams", {}).get(run_id)
    if queue is not None:
        loop.call_soon_threadsafe(queue.put_nowait, event)
