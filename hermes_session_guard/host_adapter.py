"""Every agent attribute and SessionDB call the guard relies on, in one place.

This module and :mod:`hermes_session_guard.seams` are the only ones that know
Hermes's internals. :data:`HOST_NAMES` lists every host name used here so the
surface can be diffed against a new release (``selftest`` checks it).
"""

from __future__ import annotations

import inspect
import logging
import os
import sqlite3
import threading
import types
import weakref
from collections.abc import Callable, Iterator
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
    "AIAgent tool and prompt attributes": ("tools", "valid_tool_names"),
    "agent.context_compressor": (
        "SUMMARY_PREFIX", "LEGACY_SUMMARY_PREFIX", "_HISTORICAL_SUMMARY_PREFIXES", "_MERGED_PRIOR_CONTEXT_HEADER",
        "_MERGED_SUMMARY_DELIMITER",
    ),
    "ContextCompressor attributes": ("_last_summary_error", "_last_compress_aborted", "on_session_start"),
    "SessionDB methods": ("db_path", "replace_messages", "update_system_prompt", "get_messages"),
    "state.db columns (read only)": (
        "sessions.id", "sessions.parent_session_id", "sessions.end_reason",
        "messages.id", "messages.session_id", "messages.role", "messages.content", "messages.active",
        "messages.compacted",
    ),
    "gateway.platforms.base": ("BasePlatformAdapter.send", "BasePlatformAdapter.edit_message", "SendResult"),
    "hermes_logging": ("set_session_context", "_session_context"),
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
    still recognises (0.19) and the legacy one."""
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
    _markers["prefixes"] = found or _DEFAULT_SUMMARY_PREFIXES
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
        if verdict.decorate is not None and isinstance(out, list) and out is not messages:
            try:
                verdict.decorate(list(messages), out)
            except Exception as exc:  # fail open: the summary stays as the host wrote it
                log.error("session guard: tagging the compaction summary failed (%s: %s); the summary is "
                          "kept untagged and without its recall line.", type(exc).__name__, exc)
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
