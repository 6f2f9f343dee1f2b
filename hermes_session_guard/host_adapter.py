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
}


_DEFAULT_SUMMARY_PREFIXES = ("[CONTEXT COMPACTION — REFERENCE ONLY]", "[CONTEXT SUMMARY]:")


def summary_prefixes() -> tuple[str, ...]:
    """The host's summary markers: its full ``SUMMARY_PREFIX`` and legacy prefix first
    (so a summary body can be cut after them), then the short stable markers."""
    try:
        from agent import context_compressor as cc
    except Exception:
        return _DEFAULT_SUMMARY_PREFIXES
    found = tuple(p for p in (getattr(cc, "SUMMARY_PREFIX", None), getattr(cc, "LEGACY_SUMMARY_PREFIX", None)) if p)
    return found + tuple(p for p in _DEFAULT_SUMMARY_PREFIXES if p not in found)


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


# A summary body above this size that is also larger than its input is rejected.
RUNAWAY_SUMMARY_CHARS = 32_000


def _text_size(messages: Any) -> int:
    from .store import message_text

    return sum(len(message_text(m) or "") for m in messages if isinstance(m, dict))


def _engine_failure(engine: Any, messages: Any, out: Any) -> str | None:
    if getattr(engine, "_last_compress_aborted", False):
        return str(getattr(engine, "_last_summary_error", None) or "compression aborted")
    err = getattr(engine, "_last_summary_error", None)
    if err:
        return str(err)
    from .summaries import summary_body_size, summary_is_empty

    if isinstance(out, list) and summary_is_empty(out):
        return "the summary model returned an empty summary"
    if isinstance(out, list) and isinstance(messages, list):
        body = summary_body_size(out)
        if body > RUNAWAY_SUMMARY_CHARS and body >= _text_size(messages):
            return (f"the summary ({body:,} characters) is larger than the whole conversation it replaces "
                    "(garbage or runaway summary)")
    return None


def _make_engine_shim(cls: type) -> Any:
    original = cls.compress

    def compress(self: Any, messages: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, messages, *args, **kwargs)
        verdict: EngineVerdict | None = getattr(_engine_op, "verdict", None)
        if verdict is None:
            return out
        failure = _engine_failure(self, messages, out)
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
