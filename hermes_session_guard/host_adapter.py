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
from .store import message_text

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
        "_cached_system_prompt",
        "_build_system_prompt",
        "_last_compaction_in_place",
        "_repair_message_sequence",
    ),
    "agent.context_compressor": ("SUMMARY_PREFIX", "LEGACY_SUMMARY_PREFIX"),
    "ContextCompressor attributes": ("_last_summary_error", "_last_compress_aborted", "on_session_start"),
    "SessionDB methods": (
        "db_path",
        "replace_messages",
        "update_system_prompt",
        "get_messages",
        "get_messages_as_conversation",
        "append_message",
        "try_acquire_compression_lock",
        "refresh_compression_lock",
        "release_compression_lock",
        "get_compression_lock_holder",
    ),
    "hermes_logging": ("set_session_context", "_session_context"),
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
    rebase_flush(agent, sid, compressed)


def rebase_flush(agent: Any, sid: str, persisted: list[Any]) -> None:
    """Tell the agent that ``persisted`` is exactly what state.db holds live for
    ``sid``: 0.14's positional cursor and 0.15+'s flushed-identity seed."""
    if hasattr(agent, "_flushed_db_message_ids"):
        agent._last_flushed_db_idx = len(persisted)
        agent._flushed_db_message_ids = {id(m) for m in persisted if isinstance(m, dict)}
    else:
        # A positional cursor: Hermes's alternation repair folds consecutive same-role
        # turns in place before the next request, shortening the list under the cursor;
        # without the allowance the turn's reply would fall behind it and never be written.
        agent._last_flushed_db_idx = len(persisted) - repairs_pending(agent, persisted)
    if hasattr(agent, "_flushed_db_message_session_id"):
        agent._flushed_db_message_session_id = sid


def repairs_pending(agent: Any, messages: list[Any]) -> int:
    """How many messages Hermes's alternation repair will fold away in ``messages``
    before the next request (tried on a copy)."""
    repair = getattr(agent, "_repair_message_sequence", None)
    if not callable(repair):
        return 0
    trial = [dict(m) if isinstance(m, dict) else m for m in messages]
    try:
        repair(trial)
    except Exception as exc:
        log.debug("session guard: trial alternation repair failed: %s", exc)
        return 0
    return max(0, len(messages) - len(trial))


def mark_compacted_in_place(agent: Any) -> None:
    """0.18.2+: tell the caller (turn loop, gateway) that the list it gets back replaced
    the transcript on the same id and is already persisted."""
    agent._last_compaction_in_place = True


def current_system_prompt(agent: Any, system_message: str | None) -> str:
    """The prompt a compression that changed nothing returns (what Hermes returns on a skip)."""
    cached = getattr(agent, "_cached_system_prompt", None)
    if cached:
        return str(cached)
    build = getattr(agent, "_build_system_prompt", None)
    return str(build(system_message)) if callable(build) else str(system_message or "")


def live_transcript(agent: Any, sid: str) -> list[dict[str, Any]]:
    """The transcript Hermes would load for ``sid`` (active rows, conversation format)."""
    db = session_db(agent)
    if db is None:
        return []
    return list(db.get_messages_as_conversation(sid))


_APPEND_FIELDS = (
    "tool_name", "tool_calls", "tool_call_id", "finish_reason", "reasoning", "reasoning_content",
    "reasoning_details", "codex_reasoning_items", "codex_message_items",
)


def append_messages(agent: Any, sid: str, messages: list[Any]) -> None:
    """Append ``messages`` to ``sid``'s live transcript through Hermes's own API."""
    db = session_db(agent)
    if db is None or not messages:
        return
    accepted = set(inspect.signature(db.append_message).parameters)
    for m in messages:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            content = message_text(m)
        extra = {k: m[k] for k in _APPEND_FIELDS if k in accepted and m.get(k) is not None}
        db.append_message(session_id=sid, role=str(m.get("role") or "user"), content=content, **extra)


class NativeLeases:
    """Hermes's own ``compression_locks`` rows (0.16+), through its SessionDB methods."""

    name = "native"

    def __init__(self, db: Any) -> None:
        self.db = db

    def try_acquire(self, session_id: str, holder: str, ttl_seconds: float) -> bool:
        return bool(self.db.try_acquire_compression_lock(session_id, holder, ttl_seconds=ttl_seconds))

    def refresh(self, session_id: str, holder: str, ttl_seconds: float) -> bool:
        return bool(self.db.refresh_compression_lock(session_id, holder, ttl_seconds=ttl_seconds))

    def release(self, session_id: str, holder: str) -> None:
        self.db.release_compression_lock(session_id, holder)

    def holder(self, session_id: str) -> str | None:
        found = self.db.get_compression_lock_holder(session_id)
        return str(found) if found else None


def native_leases(agent: Any) -> NativeLeases | None:
    """The agent's SessionDB as a lease table, when it has Hermes's lock API."""
    db = session_db(agent)
    if db is None or not all(
        callable(getattr(db, name, None))
        for name in ("try_acquire_compression_lock", "refresh_compression_lock", "release_compression_lock",
                     "get_compression_lock_holder")
    ):
        return None
    return NativeLeases(db)


_native_held = threading.local()


def _db_key(db: Any) -> str:
    path = getattr(db, "db_path", None)
    return str(Path(path).resolve()) if path else f"id:{id(db)}"


@contextmanager
def native_lock_reentry(leases: NativeLeases, sid: str) -> Iterator[None]:
    """While the guard holds Hermes's lock on ``sid``, the host's own acquire of that
    lock on this thread succeeds (see the ``native_lock_reentry`` seam) instead of
    seeing the guard as a competitor and skipping."""
    held: set[tuple[str, str]] = getattr(_native_held, "keys", None) or set()
    key = (_db_key(leases.db), sid)
    _native_held.keys = held | {key}
    try:
        yield
    finally:
        _native_held.keys = held


def native_lock_held_here(db: Any, sid: Any) -> bool:
    held = getattr(_native_held, "keys", None)
    return bool(held) and (_db_key(db), str(sid)) in held


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
