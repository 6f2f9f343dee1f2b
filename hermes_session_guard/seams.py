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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import buffering
from .compression import DETACH_DB, HOST_IN_PLACE, guarded_compression
from .gateway_transcript import rebase_after_compaction
from .hostinfo import Version
from .runtime import Runtime

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
            return guarded_compression(runtime, strategy, agent, messages, call_host)
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


def gateway_turn_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """After a gateway turn in which the guard compacted the session in place, bring
    the gateway's transcript bookkeeping in line (see gateway_transcript)."""

    async def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            sid = kwargs["session_id"] if "session_id" in kwargs else args[4]
            mark = runtime.compactions.mark()
        except Exception:
            sid = None
        result = await wrapped(*args, **kwargs)
        if sid:
            try:
                compaction = runtime.compactions.since(sid, mark)
                if compaction is not None:
                    rebase_after_compaction(instance.session_store, sid, compaction, result)
            except Exception as exc:
                log.error(
                    "session guard: seam %s failed after the turn (%s: %s); the gateway's JSONL transcript "
                    "for %s may still hold pre-compaction history (state.db is correct). Run "
                    "`hermes-session-guard doctor`.", row.target, type(exc).__name__, exc, sid,
                )
        return result

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
        behaviour={"strategy": DETACH_DB},
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
        note="gateway keeps a JSONL copy and slices new messages at len(history); rebase both after a compaction",
    ),
    SeamRow(
        seam="gateway_turn",
        since=(0, 18, 2),
        until=(0, 20, 0),
        module="gateway.run",
        attribute="GatewayRunner._run_agent",
        params=(),
        wrapper=None,
        failure_policy="",
        note="not needed: the gateway re-baselines on agent._last_compaction_in_place and keeps no JSONL",
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
        behaviour={"strategy": HOST_IN_PLACE},
        note="host has in-place compaction and a native lock; force in-place on",
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
