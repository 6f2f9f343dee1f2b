"""Every agent attribute and SessionDB call the guard relies on, in one place.

This module and :mod:`hermes_session_guard.seams` are the only ones that know
Hermes's internals. :data:`HOST_NAMES` lists every host name used here so the
surface can be diffed against a new release (``selftest`` checks it).
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import types
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .hostinfo import state_db_path

log = logging.getLogger("hermes_session_guard")

HOST_NAMES: dict[str, tuple[str, ...]] = {
    "AIAgent attributes": (
        "session_id",
        "_session_db",
        "compression_in_place",
        "_last_flushed_db_idx",
        "_flushed_db_message_ids",
        "_flushed_db_message_session_id",
        "context_compressor",
        "_memory_manager",
        "commit_memory_session",
    ),
    "agent.context_compressor": ("SUMMARY_PREFIX", "LEGACY_SUMMARY_PREFIX"),
    "ContextCompressor attributes": ("_last_summary_error", "_last_compress_aborted", "on_session_start"),
    "SessionDB methods": ("db_path", "replace_messages", "update_system_prompt", "get_messages"),
    "hermes_logging": ("set_session_context", "_session_context"),
    "GatewayRunner attributes": (
        "session_store",
        "_running_agents",
        "_session_db",
        "_background_tasks",
        "_draining",
        "adapters",
        "_session_key_for_source",
        "_is_user_authorized",
        "_reply_anchor_for_event",
        "_thread_metadata_for_source",
    ),
    "GatewayRunner attributes used when present": ("_adapter_for_source",),
    "SessionStore attributes": ("_entries",),
    "BasePlatformAdapter attributes": (
        "_active_sessions",
        "_pending_messages",
        "_send_with_retry",
        "send",
        "handle_message",
    ),
    "gateway.platforms.base": ("MessageEvent", "MessageType"),
    "gateway.session": ("SessionSource.to_dict", "SessionSource.from_dict"),
    "tools.approval": ("has_blocking_approval",),
}


_DEFAULT_SUMMARY_PREFIXES = ("[CONTEXT COMPACTION — REFERENCE ONLY]", "[CONTEXT SUMMARY]:")


def summary_prefixes() -> tuple[str, ...]:
    """The host's summary markers (``SUMMARY_PREFIX`` and the legacy one)."""
    try:
        from agent import context_compressor as cc
    except Exception:
        return _DEFAULT_SUMMARY_PREFIXES
    found = tuple(p for p in (getattr(cc, "SUMMARY_PREFIX", None), getattr(cc, "LEGACY_SUMMARY_PREFIX", None)) if p)
    return found or _DEFAULT_SUMMARY_PREFIXES


def session_id(agent: Any) -> str:
    return str(getattr(agent, "session_id", "") or "")


def session_db(agent: Any) -> Any:
    return getattr(agent, "_session_db", None)


def db_path(agent: Any) -> Path:
    """The state.db the agent writes to, or ``$HERMES_HOME/state.db`` when it has none
    (the 0.14 gateway hygiene agent is built without a SessionDB)."""
    db = session_db(agent)
    path = getattr(db, "db_path", None) if db is not None else None
    return Path(path) if path else state_db_path()


@contextmanager
def detached_session_db(agent: Any) -> Iterator[None]:
    """Run the host's compression with no SessionDB, so its rotation block
    (end_session, new id, create_session(parent=old)) cannot run."""
    db = agent._session_db
    agent._session_db = None
    try:
        yield
    finally:
        agent._session_db = db


@contextmanager
def forced_in_place(agent: Any) -> Iterator[None]:
    """Run the host's compression with its own in-place path (0.18.2+), which keeps
    the id and archives the old rows, whatever ``compression.in_place`` says."""
    had = hasattr(agent, "compression_in_place")
    before = getattr(agent, "compression_in_place", None)
    agent.compression_in_place = True
    try:
        yield
    finally:
        if had:
            agent.compression_in_place = before
        else:
            del agent.compression_in_place


@contextmanager
def pinned_log_context(sid: str) -> Iterator[None]:
    """Pin Hermes's ``[session]`` log tag to ``sid`` for the whole operation.

    The tag is a thread-local set once per turn; a gateway executor thread keeps
    whatever session it served last (anomaly B's stale bracket)."""
    try:
        import hermes_logging

        ctx = hermes_logging._session_context
        setter = hermes_logging.set_session_context
    except Exception:  # pragma: no cover - host without the logging context
        yield
        return
    before = getattr(ctx, "session_id", None)
    setter(sid)
    try:
        yield
    finally:
        ctx.session_id = before


_engine_op = threading.local()
_shimmed_engines: weakref.WeakSet[Any] = weakref.WeakSet()


class EngineVerdict:
    """What the guard learned from the context engine during one compression."""

    def __init__(self) -> None:
        self.failure: str | None = None


def _engine_failure(engine: Any, out: Any) -> str | None:
    if getattr(engine, "_last_compress_aborted", False):
        return str(getattr(engine, "_last_summary_error", None) or "compression aborted")
    err = getattr(engine, "_last_summary_error", None)
    if err:
        return str(err)
    from .summaries import summary_is_empty

    if isinstance(out, list) and summary_is_empty(out):
        return "the summary model returned an empty summary"
    return None


def _make_engine_shim(cls: type) -> Any:
    original = cls.compress

    def compress(self: Any, messages: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, messages, *args, **kwargs)
        verdict: EngineVerdict | None = getattr(_engine_op, "verdict", None)
        if verdict is None:
            return out
        failure = _engine_failure(self, out)
        if failure:
            # A failed summary must not replace real turns with a fallback marker:
            # hand the host its input back, which every release treats as "no progress".
            verdict.failure = failure
            return list(messages)
        return out

    compress.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    compress.__name__ = "compress"
    compress.__qualname__ = f"{cls.__qualname__}.compress"
    return compress


def shim_engine(agent: Any) -> None:
    """Give the agent's active context engine (whatever class) a per-instance
    ``compress`` that reports summary failures to the guard. Bound with
    ``MethodType`` so hosts that deep-copy the engine per agent rebind it."""
    engine = getattr(agent, "context_compressor", None)
    if engine is None or "compress" in vars(engine) or not callable(getattr(type(engine), "compress", None)):
        return
    engine.compress = types.MethodType(_make_engine_shim(type(engine)), engine)
    _shimmed_engines.add(engine)


def unshim_engines() -> None:
    for engine in list(_shimmed_engines):
        vars(engine).pop("compress", None)
    _shimmed_engines.clear()


@contextmanager
def watching_engine(agent: Any) -> Iterator[EngineVerdict]:
    shim_engine(agent)
    verdict = EngineVerdict()
    previous = getattr(_engine_op, "verdict", None)
    _engine_op.verdict = verdict
    try:
        yield verdict
    finally:
        _engine_op.verdict = previous


def commit_memory(agent: Any, messages: list[Any]) -> None:
    fn = getattr(agent, "commit_memory_session", None)
    if callable(fn):
        try:
            fn(messages)
        except Exception as exc:
            log.debug("session guard: commit_memory_session failed: %s", exc)


def persist_compacted(agent: Any, sid: str, compressed: list[Any], system_prompt: str | None) -> None:
    """Make ``compressed`` the live transcript of ``sid`` and re-base the flush cursor
    so the next turn appends after it (the host skipped all of this: its DB was detached)."""
    db = session_db(agent)
    if db is None:
        return
    db.replace_messages(sid, compressed)
    if system_prompt:
        try:
            db.update_system_prompt(sid, system_prompt)
        except Exception as exc:
            log.debug("session guard: update_system_prompt failed: %s", exc)
    agent._last_flushed_db_idx = len(compressed)
    if hasattr(agent, "_flushed_db_message_ids"):
        agent._flushed_db_message_ids = {id(m) for m in compressed if isinstance(m, dict)}
    if hasattr(agent, "_flushed_db_message_session_id"):
        agent._flushed_db_message_session_id = sid


def notify_boundary(agent: Any, sid: str) -> None:
    """Tell the context engine and memory providers a compaction boundary happened on
    the same id, as the host's in-place path does (0.18.2+)."""
    cc = getattr(agent, "context_compressor", None)
    if cc is not None and hasattr(cc, "on_session_start"):
        try:
            cc.on_session_start(sid, boundary_reason="compression", old_session_id=sid)
        except Exception as exc:
            log.debug("session guard: context engine on_session_start failed: %s", exc)
    mm = getattr(agent, "_memory_manager", None)
    if mm is not None:
        try:
            mm.on_session_switch(sid, parent_session_id=sid, reset=False, reason="compression")
        except Exception as exc:
            log.debug("session guard: memory on_session_switch failed: %s", exc)


def process_session_env() -> str | None:
    return os.environ.get("HERMES_SESSION_ID")


# -- gateway ----------------------------------------------------------------------------
# The gateway seams (busy message, drain, handler, startup) reach the runner, its
# adapters and MessageEvent only through the functions below.

INBOX_TAG = "_session_guard_inbox_seq"


def gateway_session_id(runner: Any, session_key: str) -> str | None:
    """The session id the gateway routes ``session_key`` to (its SessionEntry)."""
    store = getattr(runner, "session_store", None)
    entries = getattr(store, "_entries", None)
    entry = entries.get(session_key) if isinstance(entries, dict) else None
    sid = getattr(entry, "session_id", None)
    return str(sid) if sid else None


def running_agent_session_id(runner: Any, session_key: str) -> str | None:
    agent = (getattr(runner, "_running_agents", None) or {}).get(session_key)
    sid = getattr(agent, "session_id", None)
    return sid if isinstance(sid, str) and sid else None


def session_running(runner: Any, session_key: str) -> bool:
    """An agent turn (or its pending sentinel) is registered for ``session_key``."""
    return session_key in (getattr(runner, "_running_agents", None) or {})


def adapter_busy(adapter: Any, session_key: str) -> bool:
    return session_key in (getattr(adapter, "_active_sessions", None) or {})


def adapter_for(runner: Any, source: Any) -> Any:
    find = getattr(runner, "_adapter_for_source", None)
    if callable(find):
        return find(source)
    return (getattr(runner, "adapters", None) or {}).get(getattr(source, "platform", None))


def session_key_for(runner: Any, source: Any) -> str:
    return str(runner._session_key_for_source(source))


def user_authorized(runner: Any, event: Any) -> bool:
    check = getattr(runner, "_is_user_authorized", None)
    return bool(check(event.source)) if callable(check) else True


def runner_draining(runner: Any) -> bool:
    return bool(getattr(runner, "_draining", False))


def approval_pending(session_key: str) -> bool:
    """The agent of this session waits for a dangerous-command approval."""
    try:
        from tools.approval import has_blocking_approval
    except Exception:
        return False
    try:
        return bool(has_blocking_approval(session_key))
    except Exception:
        return False


def event_is_plain_message(event: Any) -> bool:
    """A user message the guard may buffer: not a slash command, not a synthetic event."""
    if getattr(event, "internal", False):
        return False
    text = getattr(event, "text", None) or ""
    return not text.lstrip().startswith("/")


def event_text(event: Any) -> str:
    return str(getattr(event, "text", None) or "")


def event_user_id(event: Any) -> str | None:
    user = getattr(getattr(event, "source", None), "user_id", None)
    return str(user) if user is not None else None


def event_chat_id(event: Any) -> str | None:
    chat = getattr(getattr(event, "source", None), "chat_id", None)
    return str(chat) if chat is not None else None


def event_platform(payload: dict[str, Any]) -> str | None:
    return (payload.get("source") or {}).get("platform")


def event_payload(event: Any) -> dict[str, Any]:
    """Everything needed to rebuild ``event`` in another process (JSON-safe).
    ``raw_message`` (the platform's own object) is not kept."""
    import dataclasses
    import json
    from datetime import datetime
    from enum import Enum

    out: dict[str, Any] = {}
    for f in dataclasses.fields(event):
        if f.name == "raw_message":
            continue
        value = getattr(event, f.name, None)
        if f.name == "source":
            out["source"] = value.to_dict() if value is not None else None
            continue
        if isinstance(value, Enum):
            value = value.value
        elif isinstance(value, datetime):
            value = value.isoformat()
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        out[f.name] = value
    return out


def event_from_payload(payload: dict[str, Any], seq: int | None = None) -> Any:
    """A MessageEvent of the installed Hermes rebuilt from :func:`event_payload`
    (fields this Hermes does not know are left out), tagged with its inbox ``seq``."""
    import dataclasses
    from datetime import datetime

    from gateway.platforms.base import MessageEvent, MessageType
    from gateway.session import SessionSource

    known = {f.name for f in dataclasses.fields(MessageEvent)}
    kwargs: dict[str, Any] = {k: v for k, v in payload.items() if k in known}
    if kwargs.get("source") is not None:
        kwargs["source"] = SessionSource.from_dict(kwargs["source"])
    if "message_type" in kwargs:
        try:
            kwargs["message_type"] = MessageType(kwargs["message_type"])
        except ValueError:
            kwargs["message_type"] = MessageType.TEXT
    if isinstance(kwargs.get("timestamp"), str):
        try:
            kwargs["timestamp"] = datetime.fromisoformat(kwargs["timestamp"])
        except ValueError:
            kwargs.pop("timestamp")
    kwargs.setdefault("text", "")
    event = MessageEvent(**kwargs)
    if seq is not None:
        setattr(event, INBOX_TAG, seq)
    return event


def event_inbox_seq(event: Any) -> int | None:
    seq = getattr(event, INBOX_TAG, None)
    return seq if isinstance(seq, int) else None


def adapter_has_pending(adapter: Any, session_key: str) -> bool:
    return session_key in (getattr(adapter, "_pending_messages", None) or {})


def adapter_pending_seq(adapter: Any, session_key: str) -> int | None:
    event = (getattr(adapter, "_pending_messages", None) or {}).get(session_key)
    return event_inbox_seq(event) if event is not None else None


def stage_pending(adapter: Any, session_key: str, event: Any) -> None:
    """Put ``event`` in the adapter's next-up slot; the adapter runs it when the
    current message's processing ends (its in-band or late-arrival drain)."""
    adapter._pending_messages[session_key] = event


async def send_notice(runner: Any, adapter: Any, event: Any, text: str) -> bool:
    """Reply to ``event`` in its chat/thread the way the gateway's own busy ack does."""
    source = event.source
    anchor = None
    meta = None
    try:
        anchor = runner._reply_anchor_for_event(event)
        meta = runner._thread_metadata_for_source(source, anchor)
    except Exception:
        anchor = getattr(event, "message_id", None)
    sender = getattr(adapter, "_send_with_retry", None)
    if callable(sender):
        result = await sender(chat_id=source.chat_id, content=text, reply_to=anchor, metadata=meta)
    else:
        result = await adapter.send(source.chat_id, text, reply_to=anchor, metadata=meta)
    return bool(getattr(result, "success", True))


def runner_db_path(runner: Any) -> Path:
    db = getattr(runner, "_session_db", None)
    path = getattr(db, "db_path", None) if db is not None else None
    return Path(path) if path else state_db_path()


def transcript_has_user_text(runner: Any, session_id: str | None, text: str | None, since: float | None) -> bool:
    """Whether the session's live transcript holds a user message containing ``text``
    written at or after ``since`` (used to settle a message whose turn outlived its process)."""
    db = getattr(runner, "_session_db", None)
    if db is None or not session_id or not text:
        return False
    try:
        rows = db.get_messages(session_id)
    except Exception:
        return False
    floor = (since or 0) - 1.0
    for row in rows:
        if row.get("role") != "user":
            continue
        if (row.get("timestamp") or 0) < floor:
            continue
        if text in str(row.get("content") or ""):
            return True
    return False


def adapter_for_platform(runner: Any, platform_value: str | None) -> Any:
    for platform, adapter in (getattr(runner, "adapters", None) or {}).items():
        if getattr(platform, "value", platform) == platform_value:
            return adapter
    return None


def platform_value(platform: Any) -> str | None:
    if platform is None:
        return None
    return str(getattr(platform, "value", platform))


def spawn(runner: Any, coro: Any) -> Any:
    """Run ``coro`` as a task the runner tracks (as its own startup resume does)."""
    import asyncio

    task = asyncio.get_running_loop().create_task(coro)
    tasks = getattr(runner, "_background_tasks", None)
    if isinstance(tasks, set):
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    return task


def redeliver(runner: Any, adapter: Any, event: Any) -> Any:
    """Feed ``event`` to the adapter as if it had just arrived (a tracked task)."""
    return spawn(runner, adapter.handle_message(event))
