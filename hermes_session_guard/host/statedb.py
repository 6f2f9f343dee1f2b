"""Every agent attribute and SessionDB call the guard relies on, in one place.

This module and :mod:`hermes_session_guard.seams` are the only ones that know
Hermes's internals. :data:`HOST_NAMES` lists every host name used here so the
surface can be diffed against a new release (``selftest`` checks it).
"""

from __future__ import annotations

import contextvars
import inspect
import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
import types
import uuid
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from .. import engine_support
from ..hostinfo import state_db_path
from ..safe_text import sendable_messages
from ..store import message_text

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
    "AIAgent tool and prompt attributes": ("tools", "valid_tool_names"),
    "agent.context_compressor": (
        "SUMMARY_PREFIX", "LEGACY_SUMMARY_PREFIX", "_HISTORICAL_SUMMARY_PREFIXES", "_MERGED_PRIOR_CONTEXT_HEADER",
        "_MERGED_SUMMARY_DELIMITER",
    ),
    "ContextCompressor attributes": ("_last_summary_error", "_last_compress_aborted", "on_session_start"),
    # Any context engine, through the interface (engine_support decides what can be wrapped).
    "ContextEngine interface": ("name", "compress", "on_session_start", "on_session_end"),
    "context engine selection (engine_support, selftest)": (
        "config.yaml context.engine", "agent.context_engine.ContextEngine",
        "agent.context_compressor.ContextCompressor",
        "plugins.context_engine.load_context_engine", "hermes_cli.plugins.discover_plugins",
        "hermes_cli.plugins.get_plugin_context_engine",
    ),
    "SessionDB methods": (
        "db_path", "replace_messages", "update_system_prompt", "get_messages", "get_messages_as_conversation",
        "append_message", "get_session", "create_session", "delete_session", "end_session", "get_session_title",
        "set_session_title", "get_next_title_in_lineage",
    ),
    "SessionDB compression lock (0.16+; refresh 0.18.2+)": (
        "try_acquire_compression_lock", "refresh_compression_lock", "release_compression_lock",
        "get_compression_lock_holder",
    ),
    "state.db columns (recall index, read only)": (
        "sessions.id", "sessions.parent_session_id", "sessions.end_reason",
        "messages.id", "messages.session_id", "messages.role", "messages.content", "messages.active",
        "messages.compacted",
    ),
    "gateway.platforms.base": (
        "BasePlatformAdapter.send", "BasePlatformAdapter.edit_message", "SendResult", "MessageEvent", "MessageType",
    ),
    "transcript rows that are not turns": ("session_meta",),
    "hermes_logging": ("set_session_context", "_session_context"),
    # Operator commands (doctor, repair, status): read state.db read-only by SQL,
    # write only through these SessionDB methods.
    "state.db tables": ("sessions", "messages", "schema_version", "compression_locks", "gateway_routing"),
    "state.db columns": (
        "sessions.id", "sessions.source", "sessions.parent_session_id", "sessions.started_at",
        "sessions.ended_at", "sessions.end_reason", "sessions.model_config", "sessions.system_prompt",
        "messages.id", "messages.session_id", "messages.role", "messages.content", "messages.timestamp",
        "messages.active", "compression_locks.session_id", "compression_locks.holder",
        "compression_locks.acquired_at", "compression_locks.expires_at", "gateway_routing.scope",
        "gateway_routing.session_key", "gateway_routing.entry_json",
    ),
    "SessionDB repair methods": (
        "replace_messages", "archive_and_compact", "reopen_session",
        "end_session", "ensure_session", "update_system_prompt", "save_gateway_routing_entry",
        "try_acquire_compression_lock", "release_compression_lock",
    ),
    "hermes_state": ("SessionDB", "SCHEMA_VERSION"),
    "gateway.status": ("is_gateway_runtime_lock_active",),
    "gateway routing file": ("sessions/sessions.json",),
    "hand-off (agent)": (
        "model", "platform", "_session_init_model_config", "_cached_system_prompt", "_todo_store.read",
        "_emit_status", "status_callback", "session_log_file", "logs_dir", "_session_db_created",
        "_persist_disabled",
    ),
    "hand-off (host modules)": (
        "agent.redact.redact_sensitive_text", "gateway.session_context._SESSION_ID", "hermes_state.SessionDB",
        "hermes_cli.goals.migrate_goal_to_session",
    ),
    "hand-off (gateway)": (
        "gateway.run._gateway_runner_ref", "GatewayRunner.session_store", "GatewayRunner.adapters",
        "GatewayRunner._session_key_for_source", "SessionStore._entries", "SessionStore._lock", "SessionStore._save",
        "SessionStore._record_gateway_session_peer", "SessionEntry.session_id", "SessionEntry.origin",
        "SessionEntry.last_prompt_tokens", "MessageEvent.source",
    ),
    # Buffering during compression (busy-message, drain, hand-off and replay seams).
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
    "AsyncSessionDB attributes used when present (0.19 gateway)": ("_db",),
    "SessionStore attributes": ("_entries",),
    "BasePlatformAdapter attributes": (
        "_active_sessions",
        "_pending_messages",
        "_send_with_retry",
        "send",
        "handle_message",
    ),
    "gateway.session": ("SessionSource.to_dict", "SessionSource.from_dict"),
    "tools.approval": ("has_blocking_approval",),
    "SessionDB compression lock, read by the busy-message seam (0.16+)": ("get_compression_lock_holder",),
}


_DEFAULT_SUMMARY_PREFIXES = ("[CONTEXT COMPACTION — REFERENCE ONLY]", "[CONTEXT SUMMARY]:")
_DEFAULT_MERGED_MARKERS = (
    "[PRIOR CONTEXT — for reference only; not a new message]",
    "[END OF PRIOR CONTEXT — COMPACTION SUMMARY BELOW]",
)
#: The host's own in-memory summary flag (0.17+); hosts before it do not know the key.
NATIVE_SUMMARY_KEY = "_compressed_summary"
_markers: dict[str, tuple[str, ...]] = {}


def _compressor_module() -> Any:
    try:
        from agent import context_compressor as cc
    except Exception:
        return None
    return cc


def summary_prefixes() -> tuple[str, ...]:
    """The host's summary markers: ``SUMMARY_PREFIX``, the historical prefixes it
    still recognises (0.19) and the legacy one first (so a summary body can be cut
    after them), then the short stable markers."""
    cached = _markers.get("prefixes")
    if cached:
        return cached
    cc = _compressor_module()
    if cc is None:
        return _DEFAULT_SUMMARY_PREFIXES
    candidates = (
        getattr(cc, "SUMMARY_PREFIX", None),
        *tuple(getattr(cc, "_HISTORICAL_SUMMARY_PREFIXES", ()) or ()),
        getattr(cc, "LEGACY_SUMMARY_PREFIX", None),
    )
    found = tuple(p for p in candidates if isinstance(p, str) and p)
    # The short stable markers last: a summary body is cut after the full prefix.
    _markers["prefixes"] = found + tuple(p for p in _DEFAULT_SUMMARY_PREFIXES if p not in found)
    return _markers["prefixes"]


def merged_summary_markers() -> tuple[str, str]:
    """``(prior_context_header, delimiter)`` of a summary merged into a tail
    message (0.19); the defaults are harmless on hosts that never write them."""
    cached = _markers.get("merged")
    if cached:
        return cached[0], cached[1]
    cc = _compressor_module()
    header = getattr(cc, "_MERGED_PRIOR_CONTEXT_HEADER", None) or _DEFAULT_MERGED_MARKERS[0]
    delimiter = getattr(cc, "_MERGED_SUMMARY_DELIMITER", None) or _DEFAULT_MERGED_MARKERS[1]
    if cc is not None:
        _markers["merged"] = (header, delimiter)
    return header, delimiter


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
    """What the guard learned from the context engine during one compression, and
    what it does to a successful result before the host persists it."""

    def __init__(self, decorate: Callable[[list[Any], list[Any]], None] | None = None) -> None:
        self.failure: str | None = None
        self.decorate = decorate


# A summary body above this size that is also larger than its input is rejected.
RUNAWAY_SUMMARY_CHARS = 32_000


def _text_size(messages: Any) -> int:
    from ..store import message_text

    return sum(len(message_text(m) or "") for m in messages if isinstance(m, dict))


def _engine_failure(engine: Any, messages: Any, out: Any) -> str | None:
    if getattr(engine, "_last_compress_aborted", False):
        return str(getattr(engine, "_last_summary_error", None) or "compression aborted")
    err = getattr(engine, "_last_summary_error", None)
    if err:
        return str(err)
    from ..summaries import summary_body_size, summary_is_empty

    given = messages if isinstance(messages, list) else None  # kept messages quoting the prefix are not summaries
    if isinstance(out, list) and summary_is_empty(out, given):
        return "the summary model returned an empty summary"
    if isinstance(out, list) and isinstance(messages, list):
        body = summary_body_size(out, given)
        if body > RUNAWAY_SUMMARY_CHARS and body >= _text_size(messages):
            return (f"the summary ({body:,} characters) is larger than the whole conversation it replaces "
                    "(garbage or runaway summary)")
    return None


def _make_engine_shim(cls: type) -> Any:
    original = cls.compress

    def compress(self: Any, messages: Any, *args: Any, **kwargs: Any) -> Any:
        verdict: EngineVerdict | None = getattr(_engine_op, "verdict", None)
        if verdict is not None and isinstance(messages, list):
            # Text UTF-8 cannot carry (lone surrogates) would fail the summary request and
            # the host's own write; the engine gets copies with it replaced, the snapshot
            # keeps the originals verbatim (safe_text).
            messages = sendable_messages(messages)
        out = original(self, messages, *args, **kwargs)
        if verdict is None:
            return out
        failure = _engine_failure(self, messages, out) or engine_support.empty_summary(self, messages, out)
        if failure:
            # A failed summary must not replace real turns with a fallback marker:
            # hand the host its input back, which every release treats as "no progress".
            verdict.failure = failure
            return list(messages)
        if verdict.decorate is not None and isinstance(out, list) and out is not messages:
            try:
                verdict.decorate(list(messages), out)
            except Exception as exc:  # fail open: the summary stays as the host wrote it
                log.error("session guard: tagging the compaction summary failed (%s: %s); the summary is "
                          "kept untagged and without its recall line.", type(exc).__name__, exc)
        return out

    compress.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    compress.__session_guard_shim__ = True  # type: ignore[attr-defined]
    compress.__name__ = "compress"
    compress.__qualname__ = f"{cls.__qualname__}.compress"
    return compress


def shim_engine(agent: Any) -> None:
    """Give the agent's active context engine (whatever class) a per-instance
    ``compress`` that reports summary failures to the guard. Bound with
    ``MethodType`` so hosts that deep-copy the engine per agent rebind it."""
    engine = getattr(agent, "context_compressor", None)
    if engine is None or getattr(getattr(engine, "__dict__", {}).get("compress"), "__session_guard_shim__", False):
        return
    refused = engine_support.compress_shape(engine)
    if refused:  # an engine of another shape: not wrapped, and said so (selftest lists what does not hold)
        engine_support.refuse_shim(engine, refused)
        return
    engine.compress = types.MethodType(_make_engine_shim(type(engine)), engine)
    _shimmed_engines.add(engine)


def unshim_engines() -> None:
    for engine in list(_shimmed_engines):
        vars(engine).pop("compress", None)
    _shimmed_engines.clear()


@contextmanager
def watching_engine(
    agent: Any, decorate: Callable[[list[Any], list[Any]], None] | None = None
) -> Iterator[EngineVerdict]:
    shim_engine(agent)
    verdict = EngineVerdict(decorate)
    previous = getattr(_engine_op, "verdict", None)
    _engine_op.verdict = verdict
    try:
        yield verdict
    finally:
        _engine_op.verdict = previous


def context_engine(agent: Any) -> Any:
    """The agent's active context engine (the built-in compressor or a plugin's)."""
    return getattr(agent, "context_compressor", None)


def commit_memory(agent: Any, messages: list[Any]) -> None:
    fn = getattr(agent, "commit_memory_session", None)
    if callable(fn):
        try:
            fn(messages)
        except Exception as exc:
            log.debug("session guard: commit_memory_session failed: %s", exc)


FLUSH_CURSORS = ("index", "identity", "marker")


def in_timestamp_order(db: Any, floor_session: str, messages: list[Any]) -> list[Any]:
    """Copies of ``messages`` whose timestamps keep them, in order, before anything
    the turn appends afterwards, for hosts that load a transcript ``ORDER BY
    timestamp`` (0.17). Without them the rows would be stamped "now", after the
    turn's own user message, which the host stamps with its arrival time. They
    start at the first timestamp of ``floor_session`` (the conversation being
    compacted or handed off); a message's own timestamp is kept where it has one
    and still fits the order."""
    try:
        known = [float(r["timestamp"]) for r in db.get_messages(floor_session) if r.get("timestamp") is not None]
    except Exception:
        known = []
    last = (min(known) if known else time.time()) - 1e-6
    out: list[Any] = []
    for m in messages:
        if not isinstance(m, dict):
            out.append(m)
            continue
        try:
            ts = float(m["timestamp"]) if m.get("timestamp") is not None else None
        except (TypeError, ValueError):
            ts = None
        last = ts if ts is not None and ts > last else last + 1e-6
        out.append({**m, "timestamp": last})
    return out


def persist_compacted(
    agent: Any, sid: str, compressed: list[Any], system_prompt: str | None, *, flush_cursor: str | None = None,
    transcript_order: str | None = None,
) -> None:
    """Make ``compressed`` the live transcript of ``sid`` and re-base the flush cursor
    so the next turn appends after it (the host skipped all of this: its DB was detached).
    ``transcript_order`` is how the host loads a transcript back (``id`` or ``timestamp``)."""
    db = session_db(agent)
    if db is None:
        return
    rows = in_timestamp_order(db, sid, compressed) if transcript_order == "timestamp" else compressed
    db.replace_messages(sid, rows)
    if system_prompt:
        try:
            db.update_system_prompt(sid, system_prompt)
        except Exception as exc:
            log.debug("session guard: update_system_prompt failed: %s", exc)
    rebase_flush(agent, sid, compressed, flush_cursor)


def rebase_flush(agent: Any, sid: str, persisted: list[Any], kind: str | None = None) -> None:
    """Tell the agent that ``persisted`` is exactly what state.db holds live for
    ``sid``. ``kind`` is the row's ``flush_cursor``: ``index`` hosts (0.13-0.16)
    slice at ``_last_flushed_db_idx``; ``identity`` (0.17) and ``marker`` (0.18.2+)
    hosts skip the ``id()`` of every dict in ``_flushed_db_message_ids`` while
    ``_flushed_db_message_session_id`` names the session, and reset that set
    otherwise, so both are set even on an agent that never flushed (0.18.2+ take
    the set as a one-shot seed). ``None`` (no row data): whatever the agent has."""
    identity = kind in ("identity", "marker") if kind else hasattr(agent, "_flushed_db_message_ids")
    if identity:
        agent._last_flushed_db_idx = len(persisted)
        agent._flushed_db_message_ids = {id(m) for m in persisted if isinstance(m, dict)}
        agent._flushed_db_message_session_id = sid
        return
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


def compacted_in_place(agent: Any) -> bool:
    """0.18.2+: whether the host's in-place compaction reached state.db (Hermes sets the
    flag only once ``archive_and_compact`` committed; it logs a failed write and goes on)."""
    return bool(getattr(agent, "_last_compaction_in_place", False))


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


# Rows Hermes stores in a transcript that are not conversation turns: the gateway's
# ``session_meta`` marker (tool list, model, platform) and system injections. The
# gateway drops them before handing history to an agent, so an agent's list never has them.
_TRANSCRIPT_METADATA_ROLES = frozenset({"session_meta", "system"})


def live_transcript(agent: Any, sid: str) -> list[dict[str, Any]]:
    """The conversation Hermes would hand an agent for ``sid``: its active rows in
    conversation format, without metadata rows (see ``_TRANSCRIPT_METADATA_ROLES``)."""
    db = session_db(agent)
    if db is None:
        return []
    return [m for m in db.get_messages_as_conversation(sid)
            if not (isinstance(m, dict) and m.get("role") in _TRANSCRIPT_METADATA_ROLES)]


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
        """Hermes answers False both when another holder has the lock and when its
        database refused the write (it logs that and "fails safe"); only the first is
        a busy lock. A refusal with nobody holding the lock, twice in a row, raises
        (the lease table is unavailable) instead of being polled for the whole wait."""
        for _ in range(2):
            if self.db.try_acquire_compression_lock(session_id, holder, ttl_seconds=ttl_seconds):
                return True
            if self.holder(session_id) is not None:
                return False
        raise RuntimeError("Hermes could not take its compression lock and nobody holds it "
                           "(state.db refused the write; see Hermes's own warning)")

    def refresh(self, session_id: str, holder: str, ttl_seconds: float) -> bool:
        refresh = getattr(self.db, "refresh_compression_lock", None)
        if callable(refresh):
            return bool(refresh(session_id, holder, ttl_seconds=ttl_seconds))
        write = getattr(self.db, "_execute_write", None)
        if callable(write):
            # 0.16-0.17 have no refresh method: extend the guard's own row with the
            # statement 0.18.2's refresh_compression_lock runs, through the SessionDB's
            # own write path (its lock and retry), holder-qualified like Hermes's.
            now = time.time()

            def _extend(conn: Any) -> int:
                return conn.execute(
                    "UPDATE compression_locks SET expires_at = ? WHERE session_id = ? AND holder = ?"
                    " AND expires_at >= ?", (now + ttl_seconds, session_id, holder, now),
                ).rowcount

            return bool(write(_extend))
        # A SessionDB without either: the lock stays ours until the TTL it was taken with runs out.
        return self.holder(session_id) == holder

    def release(self, session_id: str, holder: str) -> None:
        """Hermes's release logs and swallows a database error; a lock still held
        afterwards is reported as a failed release, so the guard retries it."""
        self.db.release_compression_lock(session_id, holder)
        if self.holder(session_id) == holder:
            raise RuntimeError("Hermes could not release its compression lock (state.db refused the write)")

    def holder(self, session_id: str) -> str | None:
        found = self.db.get_compression_lock_holder(session_id)
        return str(found) if found else None


def native_leases(agent: Any) -> NativeLeases | None:
    """The agent's SessionDB as a lease table, when it has Hermes's lock API (0.16+;
    ``refresh_compression_lock`` only from 0.18.2, see :meth:`NativeLeases.refresh`)."""
    db = session_db(agent)
    if db is None or not all(
        callable(getattr(db, name, None))
        for name in ("try_acquire_compression_lock", "release_compression_lock", "get_compression_lock_holder")
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


# -- the agent's tools ---------------------------------------------------------------


def tool_names(agent: Any) -> set[str]:
    """Tools the host enabled for this agent (its toolset configuration decided)."""
    names = getattr(agent, "valid_tool_names", None)
    return set(names) if names else set()


@contextmanager
def tools_hidden(agent: Any, names: set[str]) -> Iterator[None]:
    """Leave ``names`` out of the tool list the host sends with this one request."""
    tools = getattr(agent, "tools", None)
    if not names or not isinstance(tools, list):
        yield
        return
    kept = [t for t in tools if _tool_name(t) not in names]
    if len(kept) == len(tools):
        yield
        return
    agent.tools = kept
    try:
        yield
    finally:
        if agent.tools is kept:
            agent.tools = tools


def _tool_name(tool: Any) -> str | None:
    if isinstance(tool, dict):
        fn = tool.get("function")
        return fn.get("name") if isinstance(fn, dict) else tool.get("name")
    return None


# -- the conversation's own history in state.db (read only) -------------------------


class _ReadOnly:
    """A shared read-only connection per state.db (one query at a time)."""

    def __init__(self, db_path: Path) -> None:
        self.conn = sqlite3.connect(f"file:{Path(db_path).as_posix()}?mode=ro", uri=True, timeout=5.0,
                                    check_same_thread=False)
        self.conn.execute("PRAGMA busy_timeout=5000")
        self.lock = threading.Lock()

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        with self.lock:
            return _Rows(self.conn.execute(sql, params).fetchall())

    def close(self) -> None:  # shared: stays open (see close_readers)
        return None


class _Rows(list):
    def fetchone(self) -> Any:
        return self[0] if self else None

    def fetchall(self) -> list[Any]:
        return list(self)


_readers: dict[Path, _ReadOnly] = {}
_readers_lock = threading.Lock()


def _read_only(db_path: Path) -> _ReadOnly:
    key = Path(db_path).resolve()
    with _readers_lock:
        reader = _readers.get(key)
        if reader is None:
            if not key.exists():
                raise sqlite3.OperationalError(f"no database at {key}")
            reader = _readers[key] = _ReadOnly(key)
        return reader


def close_readers() -> None:
    with _readers_lock:
        for reader in _readers.values():
            reader.conn.close()
        _readers.clear()


def compression_ancestors(db_path: Path, sid: str, limit: int = 64) -> list[str]:
    """Sessions this one continues after a host compression that rotated the id
    (before the guard was installed): parent links whose parent ended with
    ``end_reason = 'compression'``. Branches and other parents are not the same
    conversation and are not followed."""
    out: list[str] = []
    try:
        conn = _read_only(db_path)
    except sqlite3.Error:
        return out
    try:
        current = sid
        for _ in range(limit):
            row = conn.execute("SELECT parent_session_id FROM sessions WHERE id = ?", (current,)).fetchone()
            parent = row[0] if row else None
            if not parent or parent in out or parent == sid:
                break
            ended = conn.execute("SELECT end_reason FROM sessions WHERE id = ?", (parent,)).fetchone()
            if not ended or ended[0] != "compression":
                break
            out.append(parent)
            current = parent
    except sqlite3.Error as exc:
        log.debug("session guard: reading the session lineage failed: %s", exc)
    finally:
        conn.close()
    return out


def stored_turns(db_path: Path, sid: str, after_id: int, *, archived_only: bool) -> list[tuple[int, int, str, str]]:
    """``(host_row_id, turn, role, content)`` of a session's stored messages with an id
    above ``after_id``; ``turn`` is the 1-based position among all of the session's rows.
    With ``archived_only`` only rows the host compacted away in place are returned
    (``active = 0`` and ``compacted = 1``; rows the user rewound stay out)."""
    try:
        conn = _read_only(db_path)
    except sqlite3.Error:
        return []
    try:
        cols = {r[1] for r in conn.execute("PRAGMA table_info(messages)")}
        if archived_only and "active" not in cols:
            return []
        active = "active" if "active" in cols else "1"
        compacted = "compacted" if "compacted" in cols else "0"
        rows = conn.execute(
            f"SELECT id, role, content, {active}, {compacted} FROM messages WHERE session_id = ? ORDER BY id", (sid,)
        ).fetchall()
    except sqlite3.Error as exc:
        log.debug("session guard: reading stored turns failed: %s", exc)
        return []
    finally:
        conn.close()
    out = []
    for turn, (row_id, role, content, is_active, was_compacted) in enumerate(rows, 1):
        if row_id <= after_id or (archived_only and (is_active or not was_compacted)):
            continue
        out.append((row_id, turn, role or "", content if isinstance(content, str) else str(content or "")))
    return out


def last_row_id(db_path: Path, sid: str) -> int:
    try:
        conn = _read_only(db_path)
    except sqlite3.Error:
        return 0
    try:
        row = conn.execute("SELECT MAX(id) FROM messages WHERE session_id = ?", (sid,)).fetchone()
        return int(row[0] or 0)
    except sqlite3.Error:
        return 0
    finally:
        conn.close()


def stored_message(db_path: Path, row_id: int) -> str | None:
    try:
        conn = _read_only(db_path)
    except sqlite3.Error:
        return None
    try:
        row = conn.execute("SELECT content FROM messages WHERE id = ?", (row_id,)).fetchone()
        return row[0] if row else None
    except sqlite3.Error:
        return None
    finally:
        conn.close()


# -- what a gateway delivers to a platform --------------------------------------------

_shimmed_adapters: weakref.WeakSet[Any] = weakref.WeakSet()
_DELIVERY_METHODS = ("send", "edit_message", "send_draft")


def _content_slot(fn: Any) -> int | None:
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("content") if "content" in names else None


def delivered_nothing() -> Any:
    """The result a platform send reports when the guard withheld the whole text."""
    from gateway.platforms.base import SendResult

    return SendResult(success=True, message_id=None)


def shim_adapter(adapter: Any, transform: Callable[[str], str | None]) -> None:
    """Route this adapter's outgoing text through ``transform`` (per instance: every
    platform subclass overrides ``send``). ``None`` from ``transform`` withholds
    the message."""
    if adapter in _shimmed_adapters:
        return
    for name in _DELIVERY_METHODS:
        bound = getattr(adapter, name, None)
        slot = _content_slot(bound) if callable(bound) else None
        if slot is None or name in vars(adapter):
            continue
        setattr(adapter, name, _filtered_delivery(bound, slot, transform))
    _shimmed_adapters.add(adapter)


def _filtered_delivery(bound: Any, slot: int, transform: Callable[[str], str | None]) -> Any:
    async def deliver(*args: Any, **kwargs: Any) -> Any:
        if "content" in kwargs:
            content = kwargs["content"]
        elif len(args) > slot:
            content = args[slot]
        else:
            return await bound(*args, **kwargs)
        if isinstance(content, str):
            try:
                new = transform(content)
            except Exception as exc:  # fail open: deliver what the host wrote
                log.error("session guard: delivery filter failed (%s: %s); message sent unfiltered.",
                          type(exc).__name__, exc)
                new = content
            if new is None:
                return delivered_nothing()
            if "content" in kwargs:
                kwargs["content"] = new
            else:
                args = (*args[:slot], new, *args[slot + 1:])
        return await bound(*args, **kwargs)

    deliver.__signature__ = inspect.signature(bound)  # type: ignore[attr-defined]
    deliver.__name__ = getattr(bound, "__name__", "send")
    return deliver


def unshim_adapters() -> None:
    for adapter in list(_shimmed_adapters):
        for name in _DELIVERY_METHODS:
            vars(adapter).pop(name, None)
    _shimmed_adapters.clear()


def json_response_like(response: Any, payload: Any) -> Any:
    """An aiohttp JSON response carrying ``payload`` with ``response``'s status and headers."""
    from aiohttp import web

    new = web.json_response(payload, status=response.status)
    for key, value in response.headers.items():
        if key.lower() not in ("content-type", "content-length"):
            new.headers[key] = value
    return new


# -- state.db and gateway routing, for the operator commands ------------------------------
# doctor and status read Hermes's tables by plain SQL on a read-only connection
# (the host offers no read-only API on every release); repair writes Hermes data
# only through the SessionDB methods below.

COMPRESSION_END_REASON = "compression"
SUMMARY_MARKERS = _DEFAULT_SUMMARY_PREFIXES  # the same on every supported release
ROUTING_FILE = Path("sessions") / "sessions.json"
NATIVE_LOCK_TABLE = "compression_locks"
ROUTING_TABLE = "gateway_routing"
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "sessions": ("id", "source", "parent_session_id", "started_at", "ended_at", "end_reason"),
    "messages": ("id", "session_id", "role", "content", "timestamp"),
}
# model_config keys that mark a child as a branch or a delegate, not a continuation (0.19)
NON_CONTINUATION_MARKERS = ("_branched_from", "_delegate_from")
_JSON_COLUMNS = ("tool_calls", "reasoning_details", "codex_reasoning_items", "codex_message_items")
_ROW_ONLY_KEYS = ("id", "session_id", "active", "compacted")


def carries_summary_marker(text: str) -> bool:
    """The stored text holds a compaction summary (standalone or merged into a turn)."""
    return any(marker in text for marker in SUMMARY_MARKERS)


def table_columns(conn: Any, table: str) -> set[str]:
    return {str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")}


def read_sessions(conn: Any) -> list[dict[str, Any]]:
    cols = table_columns(conn, "sessions")
    wanted = [c for c in ("id", "source", "parent_session_id", "started_at", "ended_at", "end_reason",
                          "model_config", "title", "message_count") if c in cols]
    rows = conn.execute(f"SELECT {', '.join(wanted)} FROM sessions ORDER BY started_at, id").fetchall()
    return [dict(zip(wanted, r, strict=True)) for r in rows]


def _live_clause(conn: Any) -> str:
    return " AND active = 1" if "active" in table_columns(conn, "messages") else ""


def read_message_stats(conn: Any) -> dict[str, dict[str, Any]]:
    """Per session id (including ids with no session row): row count, live row count,
    first/last row id and the last timestamp."""
    live = "SUM(active)" if "active" in table_columns(conn, "messages") else "COUNT(*)"
    out: dict[str, dict[str, Any]] = {}
    for sid, count, live_count, first_id, last_id, last_ts in conn.execute(
        f"SELECT session_id, COUNT(*), {live}, MIN(id), MAX(id), MAX(timestamp) FROM messages GROUP BY session_id"
    ):
        out[str(sid)] = {"count": int(count), "live": int(live_count or 0), "first_id": first_id,
                         "last_id": last_id, "last_ts": last_ts}
    return out


def read_message_marks(conn: Any, session_ids: list[str]) -> dict[str, list[tuple[int, float]]]:
    """``(row id, timestamp)`` of every row of the given sessions, in row order."""
    out: dict[str, list[tuple[int, float]]] = {sid: [] for sid in session_ids}
    for sid in session_ids:
        out[sid] = [(int(i), float(ts or 0.0)) for i, ts in conn.execute(
            "SELECT id, timestamp FROM messages WHERE session_id = ? ORDER BY id", (sid,))]
    return out


def read_session_rows(conn: Any, sid: str) -> list[dict[str, Any]]:
    """Every stored row of ``sid`` (all columns, live or archived), in row order."""
    cur = conn.execute("SELECT * FROM messages WHERE session_id = ? ORDER BY id", (sid,))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def is_live_row(row: dict[str, Any]) -> bool:
    return row.get("active", 1) in (1, None)


def read_system_prompt(conn: Any, sid: str) -> str | None:
    if "system_prompt" not in table_columns(conn, "sessions"):
        return None
    row = conn.execute("SELECT system_prompt FROM sessions WHERE id = ?", (sid,)).fetchone()
    return row[0] if row else None


def read_summary_rows(conn: Any) -> dict[str, list[int]]:
    """Live rows that carry a compaction summary (standalone or merged), per session."""
    like = " OR ".join("content LIKE ?" for _ in SUMMARY_MARKERS)
    out: dict[str, list[int]] = {}
    for sid, mid in conn.execute(
        f"SELECT session_id, id FROM messages WHERE ({like}){_live_clause(conn)} ORDER BY id",
        tuple(f"%{m}%" for m in SUMMARY_MARKERS),
    ):
        out.setdefault(str(sid), []).append(int(mid))
    return out


def read_schema_version(conn: Any) -> int | None:
    try:
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    except Exception:
        return None
    return int(row[0]) if row and row[0] is not None else None


def read_routing_table(conn: Any) -> list[dict[str, Any]]:
    """Rows of ``gateway_routing`` (0.19+); an empty list where the table does not exist."""
    if not table_columns(conn, ROUTING_TABLE):
        return []
    out = []
    for scope, key, entry_json in conn.execute(
        f"SELECT scope, session_key, entry_json FROM {ROUTING_TABLE} ORDER BY scope, session_key"
    ):
        try:
            entry = json.loads(entry_json)
        except (TypeError, ValueError):
            entry = None
        out.append({"scope": scope, "session_key": key, "entry_json": entry_json,
                    "session_id": entry.get("session_id") if isinstance(entry, dict) else None})
    return out


def read_routing_file(home: Path) -> tuple[Path, dict[str, Any] | None]:
    """``sessions/sessions.json``: the routing index on 0.14, a mirror of the table on 0.19.
    ``None`` when the file does not exist; ValueError when it is not a JSON object."""
    path = home / ROUTING_FILE
    if not path.exists():
        return path, None
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return path, data


def routing_file_entries(data: dict[str, Any] | None) -> dict[str, str]:
    """``session_key -> session_id`` of a sessions.json mapping (sentinel keys skipped)."""
    out: dict[str, str] = {}
    for key, entry in (data or {}).items():
        if not key.startswith("_") and isinstance(entry, dict) and entry.get("session_id"):
            out[key] = str(entry["session_id"])
    return out


def write_routing_file(path: Path, data: dict[str, Any]) -> None:
    """Rewrite sessions.json the way the gateway does: a temp file in the same
    directory, then an atomic replace."""
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=str(path.parent), suffix=".tmp", prefix=".sessions_")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def host_schema_version() -> int | None:
    """The state.db schema version the installed Hermes writes (None: not installed)."""
    try:
        import hermes_state
    except Exception:
        return None
    value = getattr(hermes_state, "SCHEMA_VERSION", None)
    return int(value) if isinstance(value, int) else None


def gateway_running() -> bool | None:
    """Whether a gateway holds this ``HERMES_HOME``'s runtime lock (None: cannot tell)."""
    try:
        from gateway import status
    except Exception:
        return None
    try:
        return bool(status.is_gateway_runtime_lock_active())
    except Exception:
        return None


# -- hand-off: reading a session --------------------------------------------------------
def host_redactor() -> Callable[[str], str] | None:
    """Hermes's own secret redaction, forced on (whatever ``security.redact_secrets``
    says) and, where the host offers it, with URL credentials included."""
    try:
        from agent.redact import redact_sensitive_text
    except Exception:
        return None
    try:
        params = inspect.signature(redact_sensitive_text).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    kwargs: dict[str, Any] = {}
    if "force" in params:
        kwargs["force"] = True
    if "redact_url_credentials" in params:
        kwargs["redact_url_credentials"] = True

    def redactor(text: str) -> str:
        return redact_sensitive_text(text, **kwargs)

    return redactor


_OPEN_ATTEMPTS = 5


def open_session_db(path: Path) -> Any:
    """Hermes's own ``SessionDB`` on ``path``. Opening runs the release's schema check,
    which on 0.19 probes the FTS tables; an opener racing another one can see a
    transient ``sqlite3.OperationalError`` (busy, or ``vtable constructor failed``).
    Such an open is retried a few times with a short backoff before the error stands."""
    from hermes_state import SessionDB

    for attempt in range(1, _OPEN_ATTEMPTS + 1):
        try:
            return SessionDB(db_path=Path(path))
        except sqlite3.OperationalError as exc:
            if attempt == _OPEN_ATTEMPTS:
                raise
            log.warning("session guard: opening %s failed (%s: attempt %d of %d); retrying",
                        path, type(exc).__name__, attempt, _OPEN_ATTEMPTS)
            time.sleep(0.05 * attempt)
    raise AssertionError("unreachable")  # pragma: no cover


def as_message(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row as a message dict the SessionDB writers accept (JSON columns decoded,
    row bookkeeping dropped, original timestamp kept where the host honours it)."""
    msg = {k: v for k, v in row.items() if k not in _ROW_ONLY_KEYS and (v is not None or k in ("role", "content"))}
    for key in _JSON_COLUMNS:
        if isinstance(msg.get(key), str):
            try:
                msg[key] = json.loads(msg[key])
            except ValueError:
                pass
    return msg


def set_live_transcript(db: Any, sid: str, messages: list[dict[str, Any]]) -> str:
    """Make ``messages`` the live transcript of ``sid`` in one host transaction.
    0.18.2+: ``archive_and_compact`` keeps the previous rows (inactive, searchable);
    older hosts: ``replace_messages`` (the caller keeps those rows as a snapshot first)."""
    if callable(getattr(db, "archive_and_compact", None)):
        db.archive_and_compact(sid, messages)
        return "archive_and_compact"
    db.replace_messages(sid, messages)
    return "replace_messages"


def reopen_session(db: Any, sid: str) -> None:
    db.reopen_session(sid)


def end_session(db: Any, sid: str, reason: str) -> None:
    """End ``sid`` with ``reason``; an already ended session is re-ended (the host's
    ``end_session`` keeps the first reason, so it is reopened first)."""
    db.reopen_session(sid)
    db.end_session(sid, reason)


def ensure_session_row(db: Any, sid: str, source: str = "unknown") -> None:
    db.ensure_session(sid, source=source)


def update_system_prompt(db: Any, sid: str, prompt: str) -> None:
    db.update_system_prompt(sid, prompt)


def save_routing_entry(db: Any, scope: str, key: str, entry_json: str) -> None:
    db.save_gateway_routing_entry(key, entry_json, scope=scope)


def clear_expired_native_lock(db: Any, sid: str, holder: str) -> bool:
    """Let the host reclaim an expired compression lock (its acquire deletes expired
    rows) and release it again at once. False when the lock is still live."""
    if not db.try_acquire_compression_lock(sid, holder, ttl_seconds=5.0):
        return False
    db.release_compression_lock(sid, holder)
    return True


@contextmanager
def session_db_for(agent: Any) -> Iterator[Any]:
    """The agent's SessionDB, or one opened (and closed again) on its state.db
    (0.14's gateway hygiene agent has none)."""
    own = session_db(agent)
    if own is not None:
        yield own
        return
    db = open_session_db(db_path(agent))
    try:
        yield db
    finally:
        try:
            db.close()
        except Exception:
            pass


def persistence_disabled(agent: Any) -> bool:
    """0.19's background-review fork shares the live session id but must never write
    to it (``_persist_disabled``): it is not the conversation and must not hand it off."""
    return bool(getattr(agent, "_persist_disabled", False))


def session_row(db: Any, sid: str) -> dict[str, Any] | None:
    try:
        row = db.get_session(sid)
    except Exception:
        return None
    return dict(row) if row else None


def session_messages(db: Any, sid: str) -> list[dict[str, Any]]:
    """The live transcript (0.19: active rows only)."""
    return [dict(m) for m in db.get_messages(sid)]


def todo_items(agent: Any) -> list[dict[str, Any]] | None:
    store = getattr(agent, "_todo_store", None)
    read = getattr(store, "read", None)
    if not callable(read):
        return None
    try:
        return [dict(item) for item in read()]
    except Exception:
        return None


def working_dir(row: dict[str, Any] | None) -> str | None:
    """The session's working directory: the session row (0.19 stores ``cwd``), the
    gateway's ``TERMINAL_CWD``, else this process's directory."""
    cwd = (row or {}).get("cwd") or os.environ.get("TERMINAL_CWD")
    if cwd:
        return str(cwd)
    try:
        return os.getcwd()
    except OSError:
        return None


def git_state(cwd: str | None, timeout: float = 2.0) -> tuple[str | None, str | None]:
    """``(branch, short commit)`` of the repository at ``cwd``; ``(None, None)`` when
    there is no repository or no ``git``."""
    if not cwd or not Path(cwd).is_dir():
        return None, None

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", cwd, *args], capture_output=True, text=True, timeout=timeout,
                stdin=subprocess.DEVNULL, creationflags=getattr(subprocess, "CREATE_NO_WINDOW", 0),
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if out.returncode != 0:
            return None
        return out.stdout.strip() or None

    commit = git("rev-parse", "--short", "HEAD")
    if commit is None:
        return None, None
    branch = git("rev-parse", "--abbrev-ref", "HEAD")
    return (None if branch == "HEAD" else branch), commit


# -- hand-off: creating the child --------------------------------------------------------
def new_session_id() -> str:
    """A session id in the host's own format (``YYYYmmdd_HHMMSS_<6 hex>``)."""
    return f"{datetime.now().strftime('%Y%m%d_%H%M%S')}_{uuid.uuid4().hex[:6]}"


def create_child_session(
    db: Any, agent: Any, parent: str, child: str, messages: list[dict[str, Any]], system_prompt: str | None,
    *, transcript_order: str | None = None,
) -> None:
    """Create ``child`` (``parent_session_id=parent``) through Hermes's own SessionDB
    API, holding ``messages`` as its live transcript. Raises on failure (the caller
    then removes whatever was created). ``transcript_order`` as in :func:`persist_compacted`."""
    row = session_row(db, parent) or {}
    kwargs: dict[str, Any] = {
        "source": getattr(agent, "platform", None) or row.get("source")
        or os.environ.get("HERMES_SESSION_SOURCE", "cli"),
        "model": getattr(agent, "model", None) or row.get("model"),
        "parent_session_id": parent,
    }
    model_config = getattr(agent, "_session_init_model_config", None)
    if model_config is not None:
        kwargs["model_config"] = model_config
    for inherited in ("user_id", "cwd"):  # cwd: 0.19 rows only
        if row.get(inherited):
            kwargs[inherited] = row[inherited]
    db.create_session(session_id=child, **kwargs)
    ordered = in_timestamp_order(db, parent, messages) if transcript_order == "timestamp" else messages
    db.replace_messages(child, ordered)
    if system_prompt:
        try:
            db.update_system_prompt(child, system_prompt)
        except Exception as exc:
            log.debug("session guard: update_system_prompt(%s) failed: %s", child, exc)
    try:
        title = db.get_session_title(parent)
        if title:
            db.set_session_title(child, db.get_next_title_in_lineage(title))
    except Exception as exc:
        log.debug("session guard: title for %s not carried over: %s", child, exc)
    try:  # 0.19: a persistent /goal lives per session id
        from hermes_cli.goals import migrate_goal_to_session

        migrate_goal_to_session(parent, child, reason="handoff")
    except Exception as exc:
        log.debug("session guard: goal not carried over to %s: %s", child, exc)


def discard_session(db: Any, sid: str) -> None:
    """Remove a child that never went live (rollback of a failed hand-off)."""
    db.delete_session(sid)


def system_prompt_of(agent: Any) -> str | None:
    value = getattr(agent, "_cached_system_prompt", None)
    return value if isinstance(value, str) and value else None


# -- hand-off: moving the live conversation ---------------------------------------------
def switch_agent_session(agent: Any, child: str, seeded: list[Any]) -> Callable[[], None]:
    """Move the agent to ``child`` everywhere the host keeps the live id (agent,
    ``HERMES_SESSION_ID``, the gateway/tools ContextVar, the log tag, the session
    log file) and re-base the flush bookkeeping on ``seeded`` (already stored).
    Returns an undo callable."""
    before = {name: getattr(agent, name) for name in _IDENTITY_ATTRS if hasattr(agent, name)}
    env_before = os.environ.get("HERMES_SESSION_ID")
    token = None
    ctx_before: Any = None
    log_ctx: Any = None
    try:
        import hermes_logging

        log_ctx = hermes_logging._session_context
        ctx_before = getattr(log_ctx, "session_id", None)
    except Exception:
        log_ctx = None

    def undo() -> None:
        for name, value in before.items():
            setattr(agent, name, value)
        if env_before is None:
            os.environ.pop("HERMES_SESSION_ID", None)
        else:
            os.environ["HERMES_SESSION_ID"] = env_before
        if token is not None:
            try:
                token.var.reset(token)
            except Exception:
                pass
        if log_ctx is not None:
            log_ctx.session_id = ctx_before

    try:
        agent.session_id = child
        os.environ["HERMES_SESSION_ID"] = child
        try:
            from gateway.session_context import _SESSION_ID

            token = _SESSION_ID.set(child)
        except Exception:
            token = None
        if log_ctx is not None:
            import hermes_logging

            hermes_logging.set_session_context(child)
        logs_dir = getattr(agent, "logs_dir", None)
        if logs_dir is not None and hasattr(agent, "session_log_file"):
            agent.session_log_file = Path(logs_dir) / f"session_{child}.json"
        agent._session_db_created = True
        agent._last_flushed_db_idx = len(seeded)
        agent._flushed_db_message_ids = {id(m) for m in seeded if isinstance(m, dict)}
        agent._flushed_db_message_session_id = child
    except BaseException:
        undo()
        raise
    return undo


_IDENTITY_ATTRS = (
    "session_id", "session_log_file", "_session_db_created", "_last_flushed_db_idx", "_flushed_db_message_ids",
    "_flushed_db_message_session_id",
)


def notify_handoff(agent: Any, child: str, parent: str) -> None:
    """Tell the context engine and memory providers the conversation moved to a new
    session (boundary reason ``handoff``), as the host does for its own boundaries."""
    cc = getattr(agent, "context_compressor", None)
    if cc is not None and hasattr(cc, "on_session_start"):
        try:
            cc.on_session_start(child, boundary_reason="handoff", old_session_id=parent,
                                platform=getattr(agent, "platform", None) or "cli")
        except TypeError:
            try:
                cc.on_session_start(child, boundary_reason="handoff", old_session_id=parent)
            except Exception as exc:
                log.debug("session guard: context engine on_session_start (handoff): %s", exc)
        except Exception as exc:
            log.debug("session guard: context engine on_session_start (handoff): %s", exc)
    mm = getattr(agent, "_memory_manager", None)
    if mm is not None:
        try:
            mm.on_session_switch(child, parent_session_id=parent, reset=False, reason="handoff")
        except Exception as exc:
            log.debug("session guard: memory on_session_switch (handoff): %s", exc)


def emit_status(agent: Any, text: str) -> bool:
    """Show ``text`` to the user through the agent's lifecycle status channel (CLI
    output; the gateway forwards it to the chat). True when a gateway/UI callback
    was attached, i.e. the text left the process."""
    attached = getattr(agent, "status_callback", None) is not None
    fn = getattr(agent, "_emit_status", None)
    if callable(fn):
        try:
            fn(text)
        except Exception as exc:
            log.debug("session guard: _emit_status failed: %s", exc)
            return False
    return attached


# -- hand-off: the gateway ------------------------------------------------------------
def live_gateway_runner() -> Any:
    """The ``GatewayRunner`` of this process, if a gateway runs here (never imports it)."""
    module = sys.modules.get("gateway.run")
    ref = getattr(module, "_gateway_runner_ref", None) if module is not None else None
    try:
        return ref() if callable(ref) else None
    except Exception:
        return None


def gateway_routes_to(session_id: str) -> bool:
    """True when a gateway chat in this process is bound to ``session_id``."""
    runner = live_gateway_runner()
    store = getattr(runner, "session_store", None) if runner is not None else None
    entries = getattr(store, "_entries", None) if store is not None else None
    if not entries:
        return False
    with getattr(store, "_lock", None) or nullcontext():
        return any(getattr(entry, "session_id", None) == session_id for entry in entries.values())


@dataclass
class RoutingMove:
    keys: list[str]
    undo: Callable[[], None]


def move_gateway_routing(parent: str, child: str) -> RoutingMove | None:
    """Point every gateway session key bound to ``parent`` at ``child`` and persist
    the routing index (sessions.json; 0.19 also its ``gateway_routing`` table), under
    the store's own lock. ``None`` when no gateway runs in this process. On a failed
    save the in-memory binding is restored before the error propagates."""
    runner = live_gateway_runner()
    store = getattr(runner, "session_store", None) if runner is not None else None
    entries = getattr(store, "_entries", None) if store is not None else None
    if entries is None:
        return None
    lock = getattr(store, "_lock", None) or nullcontext()
    moved: list[tuple[str, Any, int]] = []

    def restore() -> None:
        with lock:
            for _, entry, tokens in moved:
                entry.session_id = parent
                entry.last_prompt_tokens = tokens
            store._save()

    with lock:
        for key, entry in list(entries.items()):
            if getattr(entry, "session_id", None) == parent:
                moved.append((key, entry, getattr(entry, "last_prompt_tokens", 0)))
        if not moved:
            return RoutingMove([], lambda: None)
        for _, entry, _ in moved:
            entry.session_id = child
            entry.last_prompt_tokens = 0
        try:
            store._save()
        except BaseException:
            for _, entry, tokens in moved:
                entry.session_id = parent
                entry.last_prompt_tokens = tokens
            raise
    recorder = getattr(store, "_record_gateway_session_peer", None)
    if callable(recorder):
        for key, entry, _ in moved:
            try:
                recorder(child, key, getattr(entry, "origin", None))
            except Exception as exc:
                log.debug("session guard: gateway peer record for %s failed: %s", child, exc)
    return RoutingMove([key for key, _, _ in moved], restore)


async def gateway_send(runner: Any, source: Any, text: str) -> None:
    adapter = getattr(runner, "adapters", {}).get(getattr(source, "platform", None))
    if adapter is not None and getattr(source, "chat_id", None):
        await adapter.send(source.chat_id, text)


_gateway_message: contextvars.ContextVar[tuple[Any, Any] | None] = contextvars.ContextVar(
    "session_guard_gateway_message", default=None
)


@contextmanager
def gateway_message_context(runner: Any, event: Any) -> Iterator[None]:
    """While the gateway handles ``event``, remember where it came from, so a plugin
    slash command (whose handler only receives its argument text) can tell which
    conversation it was typed in."""
    token = _gateway_message.set((weakref.ref(runner), getattr(event, "source", None)))
    try:
        yield
    finally:
        _gateway_message.reset(token)


def current_conversation_session() -> str | None:
    """The session a slash command was typed in: the gateway chat's routed session,
    else this process's ``HERMES_SESSION_ID`` (the CLI)."""
    current = _gateway_message.get()
    if current is not None:
        runner, source = current[0](), current[1]
        if runner is not None and source is not None:
            try:
                key = runner._session_key_for_source(source)
                entry = runner.session_store._entries.get(key)
            except Exception:
                entry = None
            return getattr(entry, "session_id", None) if entry is not None else None
    return os.environ.get("HERMES_SESSION_ID") or None


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


def runner_session_db(runner: Any) -> Any:
    """The gateway's SessionDB with synchronous methods: 0.19 wraps it in an
    ``AsyncSessionDB`` whose every method returns a coroutine (the real one is ``_db``)."""
    db = getattr(runner, "_session_db", None)
    return getattr(db, "_db", db)


def runner_lock_holder(runner: Any, session_id: str) -> str | None:
    """Who holds Hermes's own compression lock on ``session_id`` (0.16+; the guard
    holds it for a whole compression from 0.18.2), read as the gateway's own
    in-flight check reads it. None on hosts without the lock API."""
    read = getattr(runner_session_db(runner), "get_compression_lock_holder", None)
    if not callable(read):
        return None
    found = read(str(session_id))
    return str(found) if found else None


def runner_db_path(runner: Any) -> Path:
    db = getattr(runner, "_session_db", None)
    path = getattr(db, "db_path", None) if db is not None else None
    return Path(path) if path else state_db_path()


def transcript_has_user_text(runner: Any, session_id: str | None, text: str | None, since: float | None) -> bool:
    """Whether the session's live transcript holds a user message containing ``text``
    written at or after ``since`` (used to settle a message whose turn outlived its process)."""
    db = runner_session_db(runner)
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
