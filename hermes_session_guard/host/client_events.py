"""Compaction events on the API server's client streams, through the callbacks Hermes
gave the compacting agent (docs/events.md).

- ``/v1/runs`` events: the agent's ``tool_progress_callback`` is the run's event
  callback; it is called with the event's name (``compaction.started`` ...) and its
  fields, and the ``api_run_events`` seam lets those names through to the run's stream
  as ``{"event": "compaction.started", "run_id", "timestamp", ...fields}``
  (:func:`run_event`).
- ``/v1/chat/completions`` SSE: the agent's ``tool_start_callback`` /
  ``tool_complete_callback`` of that handler, so the stream carries Hermes's own
  ``hermes.tool.progress`` record (``tool`` ``session_guard.compaction``, ``toolCallId``
  ``session_guard.compaction.<op id>``, ``status`` ``running`` then ``completed``), which
  typed clients that reject unknown records accept. The outcome is in the run events
  and the audit log, not in that record (Hermes builds it from the tool name and id only).

Only agents of the API server (``agent.platform == "api_server"``) are told that way: on the
other entry points these callbacks draw tool rows in a terminal or chat, and the Responses
stream would show a function call.

- TUI gateway: the agent's ``status_callback`` that the TUI gateway gave it (defined in a
  ``tui_gateway`` module) emits ``status.update`` with ``kind`` ``session_guard.compaction``
  and a one-line ``text`` (:func:`status_text`), once when the compaction starts and once
  when it ends; Hermes's own status kinds are untouched.
- Platform gateway (Telegram, Discord, ...): the agent's ``status_callback`` that the
  gateway gave its turn (defined in a ``gateway`` module) with ``kind``
  ``session_guard.compaction`` and the same line, when the compaction starts and ends;
  the gateway posts it to the chat (Telegram and Slack edit one status message per
  kind in place). Switched by ``events.chat_status``. A compaction whose agent has no
  status channel (the gateway's own session hygiene runs a quiet agent before the
  turn) leaves its end line to :func:`has_status_channel`'s caller.
- ACP: the session's client gets a ``session/update`` tool call (``tool_call``, title
  :func:`status_text`, kind ``other``, ``rawInput`` op id and messages, status
  ``in_progress``) when the compaction starts and a ``tool_call_update`` of the same id
  when it ends (status ``completed``, or ``failed`` for a failed compaction; ``rawOutput``
  the event's fields). Every ACP client knows tool calls. The connection, session and
  loop are those of the ACP adapter's own ``tool_progress_callback`` on the agent (a
  closure of ``acp_adapter.events``), sent with its own ``_send_update``.

Ids, counts, durations and reasons only.
"""

from __future__ import annotations

import time
from typing import Any

from ..hooks.specs import COMPACTION_EVENTS, COMPACTION_STARTED, CompactionEvent

TOOL_NAME = "session_guard.compaction"
API_PLATFORM = "api_server"
_CHAT_HANDLER = "_handle_chat_completions"  # the chat completions handler's own callbacks


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


def _status_line(agent: Any, event: CompactionEvent, chat_status: bool) -> None:
    callback = _callback_of(agent, "status_callback", "tui_gateway")
    if callback is None and chat_status:
        callback = _callback_of(agent, "status_callback", "gateway")
    if callback is not None:
        callback(TOOL_NAME, status_text(event))


def has_status_channel(agent: Any) -> bool:
    """Whether :func:`deliver` can tell anyone about ``agent``'s compaction as it runs."""
    return (getattr(agent, "platform", None) == API_PLATFORM
            or callable(getattr(agent, "status_callback", None))
            or _callback_of(agent, "tool_progress_callback", "acp_adapter") is not None)


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
    if event.name == COMPACTION_STARTED:
        update = acp.start_tool_call(call_id, status_text(event), kind="other", status="in_progress",
                                     raw_input={"op_id": event.op_id, "messages": event.messages_before})
    else:
        update = acp.update_tool_call(call_id, title=status_text(event),
                                      status="failed" if event.outcome == "failed" else "completed",
                                      raw_output=event.fields())
    _send_update(conn, session_id, loop, update)


def deliver(agent: Any, event: CompactionEvent, chat_status: bool = True) -> None:
    """Tell the client streams of the API server request, the TUI session, the ACP
    session or (``chat_status``) the platform gateway's chat that runs ``agent``."""
    if getattr(agent, "platform", None) != API_PLATFORM:
        _status_line(agent, event, chat_status)
        _acp_update(agent, event)
        return
    fields = event.fields()
    progress = getattr(agent, "tool_progress_callback", None)
    if callable(progress):
        progress(event.name, TOOL_NAME, None, None, **{k: v for k, v in fields.items() if k != "name"})
    callback = getattr(agent, "tool_start_callback" if event.name == COMPACTION_STARTED
                       else "tool_complete_callback", None)
    if not callable(callback) or _CHAT_HANDLER not in getattr(callback, "__qualname__", ""):
        return
    args = {"op_id": event.op_id, "messages": event.messages_before}
    if event.name == COMPACTION_STARTED:
        callback(tool_call_id(event.op_id), TOOL_NAME, args)
    else:
        callback(tool_call_id(event.op_id), TOOL_NAME, args, event.outcome or "")


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
