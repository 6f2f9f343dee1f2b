"""The one table of host seams: which Hermes function the guard wraps, per version range.

A row says: for Hermes versions in ``[since, until)``, wrap ``module:attribute``
(whose parameters must start with ``params``) with the wrapper built by
``wrapper``; what to do when the guard itself fails inside it
(``failure_policy``); and version-specific behaviour as data (``behaviour``).
Adding a Hermes release is adding or widening rows here, plus tests.

Failure policies (the ADR explains each choice):

``open``
    a guard error before the host runs hands the call to the host untouched
    (with an ERROR log line naming the seam); Hermes keeps working with its own
    behaviour.
``closed``
    a guard error refuses the guarded action (and logs why); used where
    proceeding would lose or fork data.

Behaviour values of the compression rows:

``strategy``
    how the host is kept from rotating the id (see :mod:`.compression`).
``lock``
    which cross-process lease serialises compressions of one session
    (see :mod:`.session_lock`): ``guard`` (the guard's ``session_guard_locks``)
    or ``native`` (Hermes's ``compression_locks``, held by the guard and
    re-entered by the host through the ``native_lock_reentry`` seam).
``lock_failure``
    ``closed``: when the lease table itself fails, the compression is skipped
    (transcript unchanged, Hermes retries on a later turn) instead of running
    unlocked, because an unlocked compression can fork the session.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from . import buffering
from . import host_adapter as host
from . import summary_seams as ss
from .compression import DETACH_DB, HOST_IN_PLACE, LockPolicy, guarded_compression
from .gateway_transcript import rebase_after_compaction
from .hostinfo import Version
from .runtime import Runtime
from .session_lock import LOCK_GUARD, LOCK_NATIVE

log = logging.getLogger("hermes_session_guard")

Wrapper = Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]


@dataclass(frozen=True)
class SeamRow:
    seam: str
    since: Version
    until: Version
    module: str
    attribute: str
    params: tuple[str, ...]
    wrapper: Callable[[Runtime, SeamRow], Wrapper] | None
    failure_policy: str
    behaviour: dict[str, str] = field(default_factory=dict)
    note: str = ""
    lazy: bool = False  # patch when Hermes imports the module; never import it for that

    @property
    def target(self) -> str:
        return f"{self.module}:{self.attribute}"

    def covers(self, version: Version) -> bool:
        return self.since <= version < self.until

    @property
    def range_text(self) -> str:
        return f">={'.'.join(map(str, self.since))},<{'.'.join(map(str, self.until))}"


def compression_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """Adapt the host's compression call shape to :func:`guarded_compression`.

    ``AIAgent._compress_context(self, messages, system_message, ...)`` (method) and
    ``compress_context(agent, messages, system_message, ...)`` (module function)
    differ only in where the agent comes from."""
    strategy = row.behaviour["strategy"]
    lock = LockPolicy(mode=row.behaviour.get("lock", LOCK_GUARD),
                      on_failure=row.behaviour.get("lock_failure", "closed"))

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        called = False

        def call_host() -> Any:
            nonlocal called
            called = True
            return wrapped(*args, **kwargs)

        try:
            if instance is not None:
                agent, rest = instance, args
            else:
                agent, rest = (args[0], args[1:]) if args else (kwargs.get("agent"), ())
            messages = rest[0] if rest else kwargs.get("messages")
            system_message = rest[1] if len(rest) > 1 else kwargs.get("system_message")
            return guarded_compression(
                runtime, strategy, agent, messages, call_host,
                native_summary_key=row.behaviour.get("native_summary_key") or None,
                system_message=system_message, lock=lock,
            )
        except Exception as exc:
            if called:
                raise
            log.error(
                "session guard: seam %s failed before the host ran (%s: %s); failing open, "
                "Hermes compresses unguarded this time. Run `hermes-session-guard selftest`.",
                row.target, type(exc).__name__, exc,
            )
            return wrapped(*args, **kwargs)

    return wrapper


def native_lock_reentry_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """``SessionDB.try_acquire_compression_lock(self, session_id, holder, ...)``: True
    without touching the table when this thread's guarded operation already holds
    the lock on that session; otherwise Hermes's own acquire, unchanged."""

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            sid = args[0] if args else kwargs.get("session_id")
            if host.native_lock_held_here(instance, sid):
                return True
        except Exception as exc:
            log.error("session guard: seam %s failed (%s: %s); failing open to Hermes's own lock.",
                      row.target, type(exc).__name__, exc)
        return wrapped(*args, **kwargs)

    return wrapper


def gateway_turn_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """Around one gateway turn: a turn addressed to a session the guard handed off
    runs in its child; guard notices for the chat (hand-off packet written, fork)
    are sent as messages of their own, before the turn (decided during gateway
    hygiene) and after it (decided during the turn); then,
    where the row says so (``transcript: jsonl_and_offset``), bring the gateway's
    transcript bookkeeping in line after the guard compacted in place (see
    gateway_transcript). After a hand-off fork the turn belongs to the child, and
    the host's own split handling already writes it whole (history offset 0)."""
    rebase = row.behaviour.get("transcript") == "jsonl_and_offset"

    async def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        sid: Any = None
        source: Any = None
        try:
            sid = kwargs["session_id"] if "session_id" in kwargs else args[4]
            source = kwargs["source"] if "source" in kwargs else args[3]
            target = runtime.compactions.fork_target(sid) if sid else sid
            if target != sid:
                # A turn still addressed to a handed-off session (the host drains queued
                # follow-ups with the id the turn started on): run it in the child.
                runtime.audit.operation(sid).info("handoff.redirected", child_session_id=target)
                if "session_id" in kwargs:
                    kwargs = {**kwargs, "session_id": target}
                else:
                    args = (*args[:4], target, *args[5:])
                sid = target
            mark = runtime.compactions.mark()
            notices = runtime.notices.pop(sid) if sid else []
        except Exception as exc:
            _fail_open(row, exc, "this turn runs as Hermes routed it, without the guard's notices or "
                                 "transcript re-base")
            sid, notices = None, []
        await _deliver(instance, source, sid, notices)
        result = await wrapped(*args, **kwargs)
        if sid:
            try:
                after = runtime.notices.pop(sid)
                moved_to = runtime.compactions.fork_target(sid)
                if moved_to != sid:
                    after += runtime.notices.pop(moved_to)
            except Exception:
                after = []
            await _deliver(instance, source, sid, after)
        if sid and rebase:
            try:
                compaction = runtime.compactions.since(sid, mark)
                if compaction is not None:
                    forked = runtime.compactions.fork_since(sid, mark) is not None
                    rebase_after_compaction(instance.session_store, sid, compaction, None if forked else result)
            except Exception as exc:
                log.error(
                    "session guard: seam %s failed after the turn (%s: %s); the gateway's JSONL transcript "
                    "for %s may still hold pre-compaction history (state.db is correct). Run "
                    "`hermes-session-guard doctor`.", row.target, type(exc).__name__, exc, sid,
                )
        return result

    return wrapper


async def _deliver(runner: Any, source: Any, sid: str | None, notices: list[str]) -> None:
    for text in notices:
        try:
            await host.gateway_send(runner, source, text)
        except Exception as exc:
            log.warning("session guard: could not deliver a notice to the chat of %s: %s", sid, exc)


def gateway_message_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """Remember which chat the message being handled came from, so the guard's
    ``/handoff-packet`` slash command (whose handler only gets its argument text)
    knows which session it was typed in."""

    async def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with ExitStack() as stack:
            try:
                stack.enter_context(host.gateway_message_context(instance, args[0] if args else kwargs.get("event")))
            except Exception as exc:
                _fail_open(row, exc, "guard slash commands in this message cannot tell which chat they came from")
            return await wrapped(*args, **kwargs)

    return wrapper


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else None


def _fail_open(row: SeamRow, exc: BaseException, consequence: str) -> None:
    log.error("session guard: seam %s failed (%s: %s); failing open: %s. Run `hermes-session-guard selftest`.",
              row.target, type(exc).__name__, exc, consequence)


def busy_message_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """A message for a busy session: buffer it while the session compresses (see buffering)."""

    async def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        called = False

        async def call_host() -> Any:
            nonlocal called
            called = True
            return await wrapped(*args, **kwargs)

        try:
            event = _arg(args, kwargs, 0, "event")
            session_key = _arg(args, kwargs, 1, "session_key")
            return await buffering.on_busy_message(runtime, instance, event, session_key, call_host)
        except Exception as exc:
            if called:
                raise
            _fail_open(row, exc, "Hermes handles this message as it would without the guard")
            return await wrapped(*args, **kwargs)

    return wrapper


def buffer_drain_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """Where a finished turn picks its follow-up: the oldest buffered message when Hermes has none."""

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        picked = wrapped(*args, **kwargs)
        try:
            session_key = _arg(args, kwargs, 0, "session_key")
            return buffering.on_drain(runtime, instance, session_key, picked)
        except Exception as exc:
            _fail_open(row, exc, "buffered messages wait for the next turn or restart")
            return picked

    return wrapper


def buffer_handoff_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """After a message's handling ends (any outcome but cancellation), keep the buffered queue moving."""

    def after(instance: Any, event: Any) -> None:
        try:
            buffering.on_handler_done(runtime, instance, event)
        except Exception as exc:
            _fail_open(row, exc, "buffered messages wait for the next turn or restart")

    async def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        event = _arg(args, kwargs, 0, "event")
        try:
            buffering.on_handler_start(instance, event)
        except Exception as exc:
            _fail_open(row, exc, "buffered messages are still delivered")
        try:
            result = await wrapped(*args, **kwargs)
        except asyncio.CancelledError:
            raise
        except Exception:
            after(instance, event)
            raise
        after(instance, event)
        return result

    return wrapper


def buffer_replay_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """Gateway startup (and 0.19 platform reconnect): replay what an earlier runner left buffered."""

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        try:
            buffering.replay(runtime, instance, _arg(args, kwargs, 0, "platform"))
        except Exception as exc:
            _fail_open(row, exc, "buffered messages stay in session_guard_inbox for the next start")
        return result

    return wrapper


# The release ranges the guard supports, oldest first.
_SUPPORTED: tuple[tuple[Version, Version], ...] = (((0, 14, 0), (0, 15, 0)), ((0, 18, 2), (0, 20, 0)))

_COMPRESSION_METHOD_PARAMS = ("self", "messages", "system_message")
_COMPRESSION_FUNCTION_PARAMS = ("agent", "messages", "system_message")

SEAMS: tuple[SeamRow, ...] = (
    SeamRow(
        seam="compression",
        since=(0, 14, 0),
        until=(0, 15, 0),
        module="run_agent",
        attribute="AIAgent._compress_context",
        params=_COMPRESSION_METHOD_PARAMS,
        wrapper=compression_wrapper,
        failure_policy="open",
        behaviour={"strategy": DETACH_DB, "lock": LOCK_GUARD, "lock_failure": "closed"},
        note="compression lives in the method and always rotates; run it with the SessionDB detached",
    ),
    SeamRow(
        seam="gateway_turn",
        since=(0, 14, 0),
        until=(0, 15, 0),
        module="gateway.run",
        attribute="GatewayRunner._run_agent",
        params=("self", "message", "context_prompt", "history", "source", "session_id"),
        wrapper=gateway_turn_wrapper,
        failure_policy="open",
        behaviour={"transcript": "jsonl_and_offset"},
        note="gateway keeps a JSONL copy and slices new messages at len(history): rebase both after a compaction; "
        "hand-off notices and redirects",
    ),
    SeamRow(
        seam="gateway_turn",
        since=(0, 18, 2),
        until=(0, 20, 0),
        module="gateway.run",
        attribute="GatewayRunner._run_agent",
        params=("self", "message", "context_prompt", "history", "source", "session_id"),
        wrapper=gateway_turn_wrapper,
        failure_policy="open",
        behaviour={"transcript": "host"},
        note="hand-off notices and redirects only; the gateway re-baselines on agent._last_compaction_in_place",
    ),
    SeamRow(
        seam="gateway_message",
        since=(0, 14, 0),
        until=(0, 15, 0),
        module="gateway.run",
        attribute="GatewayRunner._handle_message",
        params=("self", "event"),
        wrapper=gateway_message_wrapper,
        failure_policy="open",
        note="tells plugin slash commands which chat (and so which session) they were typed in",
    ),
    SeamRow(
        seam="gateway_message",
        since=(0, 18, 2),
        until=(0, 20, 0),
        module="gateway.run",
        attribute="GatewayRunner._handle_message",
        params=("self", "event"),
        wrapper=gateway_message_wrapper,
        failure_policy="open",
        note="tells plugin slash commands which chat (and so which session) they were typed in",
    ),
    SeamRow(
        seam="compression",
        since=(0, 18, 2),
        until=(0, 20, 0),
        module="agent.conversation_compression",
        attribute="compress_context",
        params=_COMPRESSION_FUNCTION_PARAMS,
        wrapper=compression_wrapper,
        failure_policy="open",
        behaviour={
            "strategy": HOST_IN_PLACE, "lock": LOCK_NATIVE, "lock_failure": "closed",
            "native_summary_key": "_compressed_summary",
        },
        note="host has in-place compaction and a native lock; force in-place on",
    ),
    SeamRow(
        seam="native_lock_reentry",
        since=(0, 14, 0),
        until=(0, 15, 0),
        module="hermes_state",
        attribute="SessionDB.try_acquire_compression_lock",
        params=(),
        wrapper=None,
        failure_policy="",
        note="not needed: 0.14 has no native compression lock; the guard's session_guard_locks table is used",
    ),
    SeamRow(
        seam="native_lock_reentry",
        since=(0, 18, 2),
        until=(0, 20, 0),
        module="hermes_state",
        attribute="SessionDB.try_acquire_compression_lock",
        params=("self", "session_id", "holder"),
        wrapper=native_lock_reentry_wrapper,
        failure_policy="open",
        note="the guard holds Hermes's compression lock for the whole operation; the host's acquire re-enters it",
    ),
    *(
        # Summaries carry the recall line; the body the host re-summarises must not.
        SeamRow(
            seam="summary_strip",
            since=since,
            until=until,
            module="agent.context_compressor",
            attribute="ContextCompressor._strip_summary_prefix",
            params=("summary",),
            wrapper=ss.summary_strip_wrapper,
            failure_policy="open",
            note="rehydrated summary bodies lose the [Original context] line before the next summary call",
        )
        for since, until in _SUPPORTED
    ),
    *(
        SeamRow(
            seam="transcript_load",
            since=since,
            until=until,
            module="hermes_state",
            attribute="SessionDB.get_messages_as_conversation",
            params=("self", "session_id"),
            wrapper=ss.transcript_load_wrapper,
            failure_policy="open",
            behaviour={"native_summary_key": native},
            note="CLI resume, gateway load_transcript, TUI, ACP and the API server load through it; re-tag summaries",
        )
        for (since, until), native in zip(_SUPPORTED, ("", "_compressed_summary"), strict=True)
    ),
    *(
        SeamRow(
            seam="wire",
            since=since,
            until=until,
            module="run_agent",
            attribute="AIAgent._sanitize_api_messages",
            params=("messages",),
            wrapper=ss.wire_wrapper,
            failure_policy="closed",
            behaviour={"host_strips": host_strips},
            note=note,
        )
        for (since, until), host_strips, note in zip(
            _SUPPORTED,
            ("nothing", "underscore keys"),
            ("0.14 sends every message key: strip is_compressed_summary and _compressed_summary",
             "host strips only _-prefixed keys (chat completions): strip is_compressed_summary too"),
            strict=True,
        )
    ),
    *(
        SeamRow(
            seam="request_tools",
            since=since,
            until=until,
            module="run_agent",
            attribute="AIAgent._build_api_kwargs",
            params=("self", "api_messages"),
            wrapper=ss.request_tools_wrapper,
            failure_policy="open",
            note="offer session_guard_recall only to sessions with snapshots",
        )
        for since, until in _SUPPORTED
    ),
    *(
        SeamRow(
            seam="system_prompt",
            since=since,
            until=until,
            module="run_agent",
            attribute="AIAgent._build_system_prompt",
            params=("self", "system_message"),
            wrapper=ss.system_prompt_wrapper,
            failure_policy="open",
            note="recall rule once the session has compacted history",
        )
        for since, until in _SUPPORTED
    ),
    *(
        SeamRow(
            seam="tool_session",
            since=since,
            until=until,
            module="run_agent",
            attribute="handle_function_call",
            params=("function_name", "function_args", "task_id", "tool_call_id", "session_id"),
            wrapper=ss.tool_session_wrapper,
            failure_policy="open",
            note="the host passes the calling agent's session_id; recall reads only that session",
        )
        for since, until in _SUPPORTED
    ),
    SeamRow(
        seam="cli_resume_history",
        since=(0, 14, 0),
        until=(0, 15, 0),
        module="cli",
        attribute="HermesCLI._display_resumed_history",
        params=("self",),
        wrapper=ss.cli_history_wrapper,
        failure_policy="open",
        lazy=True,
        note="resume recap renders a display copy without summaries",
    ),
    SeamRow(
        seam="cli_resume_history",
        since=(0, 18, 2),
        until=(0, 20, 0),
        module="hermes_cli.cli_agent_setup_mixin",
        attribute="CLIAgentSetupMixin._display_resumed_history",
        params=("self",),
        wrapper=ss.cli_history_wrapper,
        failure_policy="open",
        lazy=True,
        note="resume recap moved to a mixin; display copy without summaries",
    ),
    *(
        SeamRow(
            seam="cli_history",
            since=since,
            until=until,
            module="cli",
            attribute="HermesCLI.show_history",
            params=("self",),
            wrapper=ss.cli_history_wrapper,
            failure_policy="open",
            lazy=True,
            note="/history renders a display copy without summaries",
        )
        for since, until in _SUPPORTED
    ),
    *(
        SeamRow(
            seam="tui_history",
            since=since,
            until=until,
            module="tui_gateway.server",
            attribute="_history_to_messages",
            params=("history",),
            wrapper=ss.tui_history_wrapper,
            failure_policy="open",
            lazy=True,
            note="session.resume / session.history payloads",
        )
        for since, until in _SUPPORTED
    ),
    SeamRow(
        seam="api_session_messages",
        since=(0, 14, 0),
        until=(0, 15, 0),
        module="gateway.platforms.api_server",
        attribute="APIServerAdapter._handle_session_messages",
        params=(),
        wrapper=None,
        failure_policy="",
        note="not needed: 0.14's API server has no session messages endpoint",
    ),
    SeamRow(
        seam="api_session_messages",
        since=(0, 18, 2),
        until=(0, 20, 0),
        module="gateway.platforms.api_server",
        attribute="APIServerAdapter._handle_session_messages",
        params=("self", "request"),
        wrapper=ss.api_messages_wrapper,
        failure_policy="open",
        lazy=True,
        note="GET /api/sessions/{id}/messages",
    ),
    *(
        SeamRow(
            seam="platform_delivery",
            since=since,
            until=until,
            module="gateway.platforms.base",
            attribute="BasePlatformAdapter.set_message_handler",
            params=("self", "handler"),
            wrapper=ss.delivery_wrapper,
            failure_policy="open",
            lazy=True,
            note="each adapter the gateway wires up gets its send/edit_message/send_draft text filtered",
        )
        for since, until in _SUPPORTED
    ),
    SeamRow(
        seam="busy_message",
        since=(0, 14, 0),
        until=(0, 15, 0),
        module="gateway.run",
        attribute="GatewayRunner._handle_active_session_busy_message",
        params=("self", "event", "session_key"),
        wrapper=busy_message_wrapper,
        failure_policy="open",
        behaviour={"storage": "session_guard_inbox"},
        note="0.14 interrupts the agent and keeps one pending message (a second replaces the first); buffer instead",
    ),
    SeamRow(
        seam="buffer_drain",
        since=(0, 14, 0),
        until=(0, 15, 0),
        module="gateway.run",
        attribute="GatewayRunner._promote_queued_event",
        params=("self", "session_key", "adapter", "pending_event"),
        wrapper=buffer_drain_wrapper,
        failure_policy="open",
        note="end of _run_agent picks the follow-up turn here; it recurses with the same session id",
    ),
    SeamRow(
        seam="buffer_handoff",
        since=(0, 14, 0),
        until=(0, 15, 0),
        module="gateway.run",
        attribute="GatewayRunner._handle_message",
        params=("self", "event"),
        wrapper=buffer_handoff_wrapper,
        failure_policy="open",
        note="turns that never drain (/compress, a failed turn) hand the queue to the adapter's next-up slot",
    ),
    SeamRow(
        seam="buffer_replay",
        since=(0, 14, 0),
        until=(0, 15, 0),
        module="gateway.run",
        attribute="GatewayRunner._schedule_resume_pending_sessions",
        params=("self",),
        wrapper=buffer_replay_wrapper,
        failure_policy="open",
        note="start() calls it once adapters are connected",
    ),
    SeamRow(
        seam="busy_message",
        since=(0, 18, 2),
        until=(0, 20, 0),
        module="gateway.run",
        attribute="GatewayRunner._handle_active_session_busy_message",
        params=("self", "event", "session_key"),
        wrapper=busy_message_wrapper,
        failure_policy="open",
        behaviour={"storage": "session_guard_inbox"},
        note="0.19 demotes interrupt to queue while its lock is held but caps the queue at 32; buffer instead",
    ),
    SeamRow(
        seam="buffer_drain",
        since=(0, 18, 2),
        until=(0, 20, 0),
        module="gateway.run",
        attribute="GatewayRunner._promote_queued_event",
        params=("self", "session_key", "adapter", "pending_event"),
        wrapper=buffer_drain_wrapper,
        failure_policy="open",
        note="end of _run_agent picks the follow-up turn here; it recurses with the same session id",
    ),
    SeamRow(
        seam="buffer_handoff",
        since=(0, 18, 2),
        until=(0, 20, 0),
        module="gateway.run",
        attribute="GatewayRunner._handle_message",
        params=("self", "event"),
        wrapper=buffer_handoff_wrapper,
        failure_policy="open",
        note="turns that never drain (/compress, a failed turn) hand the queue to the adapter's next-up slot",
    ),
    SeamRow(
        seam="buffer_replay",
        since=(0, 18, 2),
        until=(0, 20, 0),
        module="gateway.run",
        attribute="GatewayRunner._schedule_resume_pending_sessions",
        params=("self",),
        wrapper=buffer_replay_wrapper,
        failure_policy="open",
        note="start() calls it once adapters are connected (and on platform reconnect)",
    ),
)


def seam_names() -> list[str]:
    seen: list[str] = []
    for row in SEAMS:
        if row.seam not in seen:
            seen.append(row.seam)
    return seen


def rows_for(seam: str) -> list[SeamRow]:
    return [row for row in SEAMS if row.seam == seam]


def select_row(seam: str, version: Version | None) -> SeamRow | None:
    if version is None:
        return None
    for row in rows_for(seam):
        if row.covers(version):
            return row
    return None
