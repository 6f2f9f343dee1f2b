"""Wrapper factories for the summary and recall rows of the seam table.

Each wrapper adapts one host call shape to a plain function elsewhere
(:mod:`summaries`, :mod:`visibility`, :mod:`wire`, :mod:`recall_tool`) and does as
little as possible itself. All of them fail open (the host's own result goes
through, with one ERROR line) except ``wire``, which fails closed.
"""

from __future__ import annotations

import bisect
import json
import logging
from pathlib import Path
from typing import Any

from .. import host
from ..fail_open import failing_open, report
from ..hostinfo import state_db_path
from ..runtime import Runtime
from ..store import message_text, text_hash
from ..summaries.recall_tool import (
    RECALL_TOOL,
    SYSTEM_RULE,
    TOOLSET,
    calling_session,
    has_compacted_history,
    offered,
    register_waiting,
)
from ..summaries.tags import is_summary_text, strip_recall_header, tag_recorded
from ..summaries.visibility import HIDDEN, display_messages, outgoing_text, tag_rendered
from ..summaries.wire import carries_guard_keys, provider_messages
from .envelope import Hermes, fails_as
from .row import Wrapper, agent_call, call_arg

log = logging.getLogger("hermes_session_guard")



# -- summaries inside the host ----------------------------------------------------------


def summary_strip_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``ContextCompressor._strip_summary_prefix``: the body the host carries into the
    next summarisation must not contain the guard's recall line."""

    @fails_as("the recall line may reach the next summary prompt")
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        return strip_recall_header(result) if isinstance(result, str) else result

    return wrapper


def transcript_load_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``SessionDB.get_messages_as_conversation``: put the summary tags back (state.db
    has no column for them; the guard's ``session_guard_summaries`` table has). On 0.13-0.14
    the row's wrapper is :func:`~hermes_session_guard.seams.legacy.search.transcript_load_wrapper`,
    which calls this one."""
    native_key = row.behaviour.native_summary_key or None

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        sid = call_arg(args, kwargs, 0, "session_id")
        # a sub-step: summaries that load untagged still get the session's snapshots inside a
        # session_search call (the transcript_load case of tests/integration/test_seam_failures.py)
        with failing_open(row, "summaries load untagged"):
            if isinstance(result, list):
                _tag_loaded(runtime, instance, sid, result, native_key)
        return result

    return wrapper


def resume_load_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``SessionDB.get_resume_conversations`` (0.20+: CLI and TUI resume read the model's
    and the recap's lists in one query, not through ``get_messages_as_conversation``):
    put the summary tags back on both."""
    native_key = row.behaviour.native_summary_key or None

    @fails_as("summaries load untagged")
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        sid = call_arg(args, kwargs, 0, "session_id")
        for part in result if isinstance(result, tuple) else ():
            if isinstance(part, list):
                _tag_loaded(runtime, instance, sid, part, native_key)
        return result

    return wrapper


def _tag_loaded(runtime: Runtime, db: Any, sid: Any, messages: list[Any], native_key: str | None) -> None:
    found = [m for m in messages if isinstance(m, dict) and is_summary_text(message_text(m))]
    path = getattr(db, "db_path", None)
    if not sid or not path:
        return
    if not found:
        # Summaries in a context engine's own format carry no prefix: the hashes
        # recorded when the compaction produced them identify them.
        if not runtime.has_snapshots(str(sid), Path(path)):
            return
        found = [m for m in messages if isinstance(m, dict)]
    hashes, snapshots = runtime.store_for(path).summary_marks([sid])
    tag_recorded(found, hashes, snapshots, native_key)


# -- what goes to the provider ------------------------------------------------------------


def wire_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``AIAgent._sanitize_api_messages`` (every request path calls it, 0.14 and
    0.19): drop the guard's message keys from the provider copy. Fails closed for a
    request that carries them (it is not sent); one without them has nothing to
    strip and goes out as Hermes built it."""

    def refuse(exc: Exception, hermes: Hermes, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        messages = hermes.result
        if carries_guard_keys(messages):
            report(row, exc, "this request carries the guard's summary keys and is not sent", failing="closed")
            raise exc
        report(row, exc, "the request carries none of the guard's keys and is sent as Hermes built it")
        return messages

    @fails_as("the request is not sent", refuse=refuse)
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return provider_messages(wrapped(*args, **kwargs))

    return wrapper


def request_tools_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``AIAgent._build_api_kwargs``: offer ``session_guard_recall`` only to sessions
    with compacted history; remember which state.db the session lives in."""

    @fails_as("the recall tool is offered as the host configured it")
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        agent = agent_call(instance, args, kwargs)[0]
        sid = host.session_id(agent)
        runtime.remember_session(sid, host.db_path(agent))
        hide = set() if RECALL_TOOL not in host.tool_names(agent) or offered(runtime, agent) else {RECALL_TOOL}
        with host.tools_hidden(agent, hide):
            return wrapped(*args, **kwargs)

    return wrapper


def system_prompt_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``AIAgent._build_system_prompt``: add the recall rule once the session has
    compacted history (also while its first compaction runs: the host rebuilds
    the prompt before the snapshot is written)."""

    @fails_as("the system prompt has no recall rule")
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        prompt = wrapped(*args, **kwargs)
        from .compression import compressing_session

        agent = agent_call(instance, args, kwargs)[0]
        sid = host.session_id(agent)
        if (
            isinstance(prompt, str) and SYSTEM_RULE not in prompt
            and RECALL_TOOL in host.tool_names(agent) and runtime.config.recall.enabled
            and (compressing_session() == sid or has_compacted_history(runtime, sid, host.db_path(agent)))
        ):
            return f"{prompt.rstrip()}\n\n{SYSTEM_RULE}" if prompt.strip() else SYSTEM_RULE
        return prompt

    return wrapper


def tool_session_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``run_agent.handle_function_call(name, args, task_id, tool_call_id, session_id, ...)``:
    the host passes the calling agent's ``session_id``; recall reads that, never its arguments."""

    @fails_as("the recall tool gets only the session id Hermes hands it (with none it reads nothing)")
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if call_arg(args, kwargs, 0, "function_name") != RECALL_TOOL:
            return wrapped(*args, **kwargs)
        with calling_session(call_arg(args, kwargs, 4, "session_id")):
            return wrapped(*args, **kwargs)

    return wrapper


def toolset_keys_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``hermes_cli.plugins._persist_plugin_toolset_keys`` (0.20): Hermes writes the plugin
    toolset keys its background discovery registered, then the recall tool registers. The
    next launch's CLI then never lists ``session_guard`` before its plugins have loaded (its
    unknown-toolset check printed a warning on stdout); ``agent_toolsets`` gives the
    toolset back to the agents it belongs to."""

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return wrapped(*args, **kwargs)
        finally:
            with failing_open(row, "the agent runs without the session_guard_recall tool"):
                register_waiting()

    return wrapper


def agent_toolsets_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``AIAgent.__init__`` (0.20): an agent whose toolsets Hermes resolved from the plugin
    toolset keys of the last launch (written before the recall tool registered) gets
    ``session_guard`` when Hermes's own resolution for its platform, with the plugins loaded
    now, is exactly its list plus ``session_guard``; any other list is left as it is."""

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with failing_open(row, "the agent keeps the toolsets Hermes gave it"):
            _with_recall_toolset(kwargs)
        return wrapped(*args, **kwargs)

    return wrapper


def _with_recall_toolset(kwargs: dict[str, Any]) -> None:
    toolsets, platform = kwargs.get("enabled_toolsets"), kwargs.get("platform")
    if (not isinstance(toolsets, list) or TOOLSET in toolsets or not isinstance(platform, str) or not platform
            or not host.discovered_in_background()):
        return
    resolved = host.platform_toolsets(platform)
    if TOOLSET in resolved and resolved - {TOOLSET} == set(toolsets):
        # the caller's own list (the CLI keeps it for its banner and /reload-mcp), kept sorted as Hermes sorts it
        bisect.insort(toolsets, TOOLSET)


# -- what people see ------------------------------------------------------------------


def cli_history_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``HermesCLI.show_history`` / ``_display_resumed_history``: render display copies
    of the lists they read (the agent keeps the real ones): ``conversation_history``, and
    on 0.20+ the resume recap's own lineage list ``_resume_display_history``."""

    @fails_as("history is shown as the host renders it")
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        swapped: list[tuple[str, list[Any], list[Any]]] = []
        for name in _CLI_HISTORY_LISTS:
            history = getattr(instance, name, None)
            if isinstance(history, list):
                swapped.append((name, history, display_messages(history, runtime.config.summaries.visible)))
        if not swapped:
            return wrapped(*args, **kwargs)
        for name, _history, shown in swapped:
            setattr(instance, name, shown)
        try:
            return wrapped(*args, **kwargs)
        finally:
            for name, history, shown in swapped:
                if getattr(instance, name, None) is shown:
                    setattr(instance, name, history)

    return wrapper


# What the CLI's history screens read: the agent's list, and (0.20+) the recap's lineage list.
_CLI_HISTORY_LISTS = ("conversation_history", "_resume_display_history")


def tui_history_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``tui_gateway.server._history_to_messages(history)``: what the TUI shows on
    resume and ``session.history``."""

    @fails_as("history is shown as the host renders it")
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        mode = runtime.config.summaries.visible
        history = call_arg(args, kwargs, 0, "history")
        if isinstance(history, list) and mode == HIDDEN:
            return wrapped(display_messages(history, mode))
        result = wrapped(*args, **kwargs)
        return tag_rendered(result, history if isinstance(history, list) else None) \
            if isinstance(result, list) else result

    return wrapper


def api_messages_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``APIServerAdapter._handle_session_messages`` (GET /api/sessions/{id}/messages)."""

    @fails_as("session messages are returned as the host built them")
    async def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        response = await wrapped(*args, **kwargs)
        if getattr(response, "status", None) != 200 or not getattr(response, "text", None):
            return response
        payload = json.loads(response.text)
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list):
            return response
        mode = runtime.config.summaries.visible
        # the rows come straight from state.db, untagged: the guard's hashes for the session say which are summaries
        sid, path = _requested_session(instance, args, payload)
        payload["data"] = display_messages(data, mode, _recorded_hashes(runtime, path, sid, data)
                                           if sid and path else set())
        if mode != HIDDEN:
            _tag_rows_the_host_hid(runtime, sid, path, payload["data"])
        return host.json_response_like(response, payload)

    return wrapper


def _requested_session(adapter: Any, args: tuple[Any, ...], payload: dict[str, Any]) -> tuple[str | None, Any]:
    """The session a ``/api/sessions/{id}/messages`` answer holds (0.20+ name the id they resolved
    the requested one to; else the request's), and the state.db the adapter read it from (found
    as that release finds it: ``host.request_db_path``)."""
    request = args[0] if args else None
    sid = payload.get("session_id") if isinstance(payload.get("session_id"), str) else None
    sid = sid or (getattr(request, "match_info", {}).get("session_id") if request is not None else None)
    return (str(sid) if sid else None), host.request_db_path(adapter)


def _tag_rows_the_host_hid(runtime: Runtime, sid: str | None, path: Any, rows: list[Any]) -> None:
    """0.21+ blanks a summary row itself on this endpoint (``content`` empty, ``display_kind``
    ``hidden``, its row id kept). With ``visible: tagged`` such a row says what it is when
    state.db holds a summary the guard recorded for the session under that id."""
    hidden = [m for m in rows if isinstance(m, dict) and m.get("display_kind") == "hidden"
              and not m.get("content") and isinstance(m.get("id"), int)]
    if not hidden or not sid or not path:
        return
    recorded, _ = runtime.store_for(path).summary_marks([sid])
    stored = host.stored_messages(Path(path), [m["id"] for m in hidden])
    for m in hidden:
        text = stored.get(m["id"])
        if text is not None and text_hash(text) in recorded:
            m["is_compressed_summary"] = True


def _recorded_hashes(runtime: Runtime, path: Any, sid: str, rows: list[Any]) -> set[str]:
    """Content hashes of the summaries among ``rows`` the guard recorded for ``sid``; rows
    recalling one of its snapshots in the guard's line count too."""
    copies = [dict(m) for m in rows if isinstance(m, dict) and is_summary_text(message_text(m))]
    if not copies:
        return set()
    hashes, snapshots = runtime.store_for(path).summary_marks([sid])
    return set(hashes) | {text_hash(message_text(m)) for m in tag_recorded(copies, set(), snapshots, None)}


def hide_in_dashboard(runtime: Runtime) -> bool:
    """Hermes's web dashboard in this process (``hermes dashboard``, where the dashboard
    plugin switched the guard on): its session messages view shows no summary. False
    when this process has no dashboard app or the row does not hold here."""
    app = host.dashboard_app()
    state = next((str(s.state) for s in runtime.seams if s.name == "dashboard_messages_shim"), "")
    # pending: Hermes loads dashboard plugins while its web server module is still importing
    if app is None or state not in ("patched", "pending"):
        return False

    def keep(session_id: str, messages: list[Any]) -> list[Any]:
        return display_messages(messages, runtime.config.summaries.visible,
                                _recorded_hashes(runtime, state_db_path(), session_id, messages))

    host.shim_dashboard(app, keep)
    return True


def delivery_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``BasePlatformAdapter.set_message_handler``: every adapter the gateway wires up
    gets its outgoing text filtered (``send``, ``edit_message``, ``send_draft``)."""

    @fails_as("this adapter delivers unfiltered")
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        host.shim_adapter(instance, lambda text: outgoing_text(text, runtime.config.summaries.visible))
        return result

    return wrapper
