"""An ``AIAgent`` as the guard sees it: its session id and SessionDB, the context
manager switches around the host's compression (detached DB, forced in-place, pinned
log tag), memory/engine notifications, its tools and its status channel."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..fail_open import failing_open
from ..hostinfo import state_db_path

log = logging.getLogger("hermes_session_guard")


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
    except (ImportError, AttributeError) as exc:  # pragma: no cover - host without the logging context
        log.debug("session guard: Hermes's log context is unavailable (%s: %s); the log tag is not pinned",
                  type(exc).__name__, exc)
        yield
        return
    before = getattr(ctx, "session_id", None)
    setter(sid)
    try:
        yield
    finally:
        ctx.session_id = before


def context_engine(agent: Any) -> Any:
    """The agent's active context engine (the built-in compressor or a plugin's)."""
    return getattr(agent, "context_compressor", None)


def commit_memory(agent: Any, messages: list[Any]) -> None:
    fn = getattr(agent, "commit_memory_session", None)
    if callable(fn):
        with failing_open("commit_memory_session", "the memory providers do not get these messages",
                          level=logging.DEBUG, advice=None):
            fn(messages)


def compacted_in_place(agent: Any) -> bool:
    """0.18.2+: whether the host's in-place compaction reached state.db (Hermes sets the
    flag only once ``archive_and_compact`` committed; it logs a failed write and goes on)."""
    return bool(getattr(agent, "_last_compaction_in_place", False))


def mark_compacted_in_place(agent: Any) -> None:
    """0.18.2+: tell the caller (turn loop, gateway) that the list it gets back replaced
    the transcript on the same id and is already persisted."""
    agent._last_compaction_in_place = True


def await_real_usage(agent: Any) -> None:
    """The turn goes on with a transcript compacted by another turn: the provider's last
    reading on this agent priced the list that was replaced. Reset it as Hermes's own
    compaction does (0.19+, ``conversation_compression``): no stale prompt size, the
    one-response latch set, the usage anchor dropped (0.21+). Without this, 0.21+ floors
    the next request's estimate at the stale reading and compacts the adopted transcript
    again at once. Attributes this release lacks are left alone."""
    cc = getattr(agent, "context_compressor", None)
    if cc is not None and hasattr(cc, "awaiting_real_usage_after_compression"):
        cc.last_prompt_tokens = -1
        cc.last_completion_tokens = 0
        cc.awaiting_real_usage_after_compression = True
    if getattr(agent, "_usage_anchor", None) is not None:
        try:
            from agent.usage_anchor import set_usage_anchor  # 0.21+: also clears the copy on the session row
        except ImportError:
            agent._usage_anchor = None
        else:
            set_usage_anchor(agent, None)


def failure_cooldown_mark(agent: Any) -> float:
    """Where Hermes's compression-failure cooldown ends (its monotonic deadline; 0.0 on a
    release that keeps none): read before a compaction, compared after it."""
    cc = getattr(agent, "context_compressor", None)
    mark = getattr(cc, "_summary_failure_cooldown_until", 0.0)
    return float(mark) if isinstance(mark, (int, float)) else 0.0


def failure_cooldown_class(agent: Any) -> str | None:
    """The failure class Hermes recorded with its cooldown (``session_split_failed``, ...;
    the text before the first colon, never the error's details); None without one."""
    error = getattr(getattr(agent, "context_compressor", None), "_last_summary_error", None)
    if not isinstance(error, str) or not error.strip():
        return None
    head = error.split(":", 1)[0].strip()
    return head if head.replace("_", "").isalnum() else "an earlier failure"


def commit_failed_since(agent: Any, mark: float) -> bool:
    """0.21+: Hermes armed its split-failure cooldown after ``mark`` was read: its commit of
    the compacted transcript failed and it handed the list back as it was
    (``conversation_compression``: ``session_split_failed``, the failure class it records)."""
    return failure_cooldown_mark(agent) > mark and failure_cooldown_class(agent) == "session_split_failed"


def current_system_prompt(agent: Any, system_message: str | None) -> str:
    """The prompt a compression that changed nothing returns (what Hermes returns on a skip)."""
    cached = getattr(agent, "_cached_system_prompt", None)
    if cached:
        return str(cached)
    build = getattr(agent, "_build_system_prompt", None)
    return str(build(system_message)) if callable(build) else str(system_message or "")


def notify_boundary(agent: Any, sid: str, parent: str | None = None, reason: str = "compression") -> None:
    """Tell the context engine and memory providers a boundary happened: a compaction on
    the same id, as the host's in-place path does (0.18.2+), or (``reason="handoff"``) the
    conversation's move from ``parent`` to the new session ``sid``."""
    parent = parent or sid
    what = "" if reason == "compression" else f" ({reason})"
    cc = getattr(agent, "context_compressor", None)
    if cc is not None and hasattr(cc, "on_session_start"):
        with failing_open(f"the context engine's on_session_start{what}", "the engine is not told of the boundary",
                          level=logging.DEBUG, advice=None):
            if reason == "compression":
                cc.on_session_start(sid, boundary_reason=reason, old_session_id=parent)
            else:
                try:
                    cc.on_session_start(sid, boundary_reason=reason, old_session_id=parent,
                                        platform=getattr(agent, "platform", None) or "cli")
                except TypeError:
                    cc.on_session_start(sid, boundary_reason=reason, old_session_id=parent)
    mm = getattr(agent, "_memory_manager", None)
    if mm is not None:
        with failing_open(f"memory's on_session_switch{what}", "the memory providers are not told of the boundary",
                          level=logging.DEBUG, advice=None):
            mm.on_session_switch(sid, parent_session_id=parent, reset=False, reason=reason)


# Hermes 0.20+ may defer plugin tools behind its tool-search bridge: the agent's tool list
# then names the bridge (tool_search, tool_describe, tool_call), not the tools it reaches.
_BRIDGE_CALL = "tool_call"


def tool_names(agent: Any) -> set[str]:
    """Tools the host enabled for this agent (its toolset configuration decided),
    including those it reaches through Hermes's tool-search bridge."""
    names = set(getattr(agent, "valid_tool_names", None) or ())
    if _BRIDGE_CALL in names:
        names |= bridged_tool_names(agent)
    return names


def bridged_tool_names(agent: Any) -> set[str]:
    """The tools ``tool_call`` may reach for this agent: Hermes's own scope for its bridge
    (the deferrable tools of the agent's toolsets, before the bridge collapses them)."""
    # no bridge on this host, or it cannot be read: the list as it is
    with failing_open("reading the tool-search bridge's tools", "the agent's tool list is taken as it is",
                      level=logging.DEBUG, advice=None):
        import model_tools
        from tools import tool_search

        defs = model_tools.get_tool_definitions(
            enabled_toolsets=getattr(agent, "enabled_toolsets", None),
            disabled_toolsets=getattr(agent, "disabled_toolsets", None),
            quiet_mode=True, skip_tool_search_assembly=True,
        ) or []
        return set(tool_search.scoped_deferrable_names(defs))
    return set()


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


def serves_api_server(agent: Any) -> bool:
    """Whether ``agent`` runs a turn of the gateway's API server (``platform="api_server"``,
    how every release's API handlers build their agents)."""
    return getattr(agent, "platform", None) == "api_server"


def persistence_disabled(agent: Any) -> bool:
    """0.19's background-review fork shares the live session id but must never write
    to it (``_persist_disabled``): it is not the conversation and must not hand it off."""
    return bool(getattr(agent, "_persist_disabled", False))


def todo_items(agent: Any) -> list[dict[str, Any]] | None:
    store = getattr(agent, "_todo_store", None)
    read = getattr(store, "read", None)
    if not callable(read):
        return None
    with failing_open("reading the agent's todo list", "the hand-off packet goes without the todo list",
                      level=logging.DEBUG, advice=None):
        return [dict(item) for item in read()]
    return None


def system_prompt_of(agent: Any) -> str | None:
    value = getattr(agent, "_cached_system_prompt", None)
    return value if isinstance(value, str) and value else None


def emit_status(agent: Any, text: str) -> bool:
    """Show ``text`` to the user through the agent's lifecycle status channel (CLI
    output; the gateway forwards it to the chat). True when a gateway/UI callback
    was attached, i.e. the text left the process."""
    attached = getattr(agent, "status_callback", None) is not None
    fn = getattr(agent, "_emit_status", None)
    if callable(fn):
        with failing_open("_emit_status", "the status text is not shown", level=logging.DEBUG, advice=None) as failed:
            fn(text)
        if failed:
            return False
    return attached
