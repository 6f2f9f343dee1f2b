"""The wrappers on Hermes's compression entry points: they pin the session and op id, pick the
row's strategy and lock, and hand the agent to :func:`~.compression.guarded_compression`;
plus the re-entry of Hermes's own native lock from inside a guarded compression (0.18+)."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from typing import Any

from .. import host
from ..audit import new_op_id
from ..fail_open import failing_open
from ..runtime import Runtime
from ..seam_behaviour import FailurePolicy, LockMode
from ..store.connection import arrived, carry, compaction_commit, take_riders
from .compaction_steps import STEPS
from .compression import LockPolicy, guarded_compression
from .envelope import Hermes, fails_as
from .row import HostCall, SeamRow, Wrapper, agent_call
from .turns import held_for_compaction

log = logging.getLogger("hermes_session_guard")


def compression_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """Adapt the host's compression call shape to :func:`guarded_compression`.

    ``AIAgent._compress_context(self, messages, system_message, ...)`` (method) and
    ``compress_context(agent, messages, system_message, ...)`` (module function)
    differ only in where the agent comes from."""
    strategy = row.behaviour.strategy
    if strategy is None:
        raise ValueError(f"seam row {row.seam} {row.range_text} names no strategy")
    lock = LockPolicy(mode=row.behaviour.lock or LockMode.GUARD,
                      on_failure=row.behaviour.lock_failure or FailurePolicy.CLOSED)
    # Hermes alone keeps the id (in place): a guard error before it runs steps aside
    steps_aside = strategy in STEPS and STEPS[strategy].host_keeps_id

    def refuse(exc: Exception, hermes: Hermes, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The row's ``closed`` policy (ADR 0008, ADR 0019): a guard error before the host ran
        skips the compression, or steps aside where Hermes alone keeps the id; after the
        host ran, :func:`guarded_compression` has said it and the host never runs twice."""
        if hermes.ran:
            raise exc
        agent, messages, system_message = _compression_call(instance, args, kwargs)
        if steps_aside:
            return stepped_aside(runtime, row, agent, args, kwargs, exc, hermes.call)
        return skipped_before_host(runtime, row, agent, messages, system_message, exc)

    @fails_as("the compression is skipped", refuse=refuse)
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call_host = HostCall(wrapped, *args, **kwargs)
        agent, messages, system_message = _compression_call(instance, args, kwargs)
        with held_for_compaction(runtime, agent):  # a compaction outside any turn holds the session's turn
            return guarded_compression(
                runtime, strategy, agent, messages, call_host,
                native_summary_key=row.behaviour.native_summary_key or None,
                system_message=system_message, lock=lock, behaviour=row.behaviour,
            )

    return wrapper


def _compression_call(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The agent, messages (Hermes's argument, passed on as given) and system message of a compression call."""
    agent, rest = agent_call(instance, args, kwargs)
    return (agent, rest[0] if rest else kwargs.get("messages"),
            rest[1] if len(rest) > 1 else kwargs.get("system_message"))


def _said_before_host(runtime: Runtime, row: SeamRow, agent: Any, exc: BaseException, consequence: str,
                      **event: Any) -> None:
    """The one ERROR line and the ``compression.failed`` event (``stage=before_host``) of a
    guard error before the host's compression ran; ``consequence`` names ``{sid}``."""
    cause = f"{type(exc).__name__}: {exc}"
    sid = None
    with failing_open(row, "the line names no session", when="reading the session id", level=logging.DEBUG,
                      advice=None):
        sid = host.session_id(agent)
    log.error("session guard: seam %s failed before the host ran (%s); %s. Run `hermes-session-guard selftest`.",
              row.target, cause, consequence.format(sid=sid or "(unknown session)"))
    with failing_open(row, "no compression.failed event records it", when="auditing it", level=logging.DEBUG,
                      advice=None):
        runtime.audit.operation(sid or "-", new_op_id()).error(
            "compression.failed", reason=f"guard error before the host ran: {cause}", stage="before_host",
            session_id_after=sid, **event)


def skipped_before_host(runtime: Runtime, row: SeamRow, agent: Any, messages: Any, system_message: Any,
                        exc: BaseException) -> Any:
    """A guard error before the host's compression ran (ADR 0008, ADR 0019): this compression
    is skipped, never run unguarded (an unguarded host rotates the id on 0.13-0.17 and
    can fork on every release). The caller's messages come back unchanged, with the
    prompt Hermes itself returns on a skip; Hermes tries again at its next threshold
    check. One ERROR line and a ``compression.failed`` event name the cause."""
    count = len(messages) if isinstance(messages, list) else None
    _said_before_host(runtime, row, agent, exc, "failing closed: compression of {sid} skipped, messages "
                      "unchanged, Hermes retries at its next threshold check", messages_before=count,
                      messages_after=count)
    with failing_open(row, "the skip returns the agent's cached system prompt (or the one Hermes passed)",
                      when="reading the system prompt", level=logging.DEBUG, advice=None) as failed:
        prompt = host.current_system_prompt(agent, system_message)
    if failed:
        prompt = str(getattr(agent, "_cached_system_prompt", None) or system_message or "")
    return messages, prompt


def stepped_aside(runtime: Runtime, row: SeamRow, agent: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                  exc: BaseException, wrapped: Any) -> Any:
    """A guard error before the host's compression ran, on a host that compacts in place
    (0.18+): the guard steps aside and Hermes's own compaction runs as without the guard,
    in place (the id is kept), so installing the guard never stops compaction. One ERROR
    line and a ``compression.failed`` event (``stage=before_host``, ``stepped_aside``) name
    the cause. On a rotating host the ADR 0019 rule stands instead (:func:`skipped_before_host`)."""
    _said_before_host(runtime, row, agent, exc, "stepping aside: Hermes compacts {sid} in place on its own "
                      "this time", stepped_aside=True)
    with ExitStack() as forced:
        # an agent that refuses the attribute: Hermes's own setting decides
        with failing_open(row, "Hermes's own setting decides whether it compacts in place",
                          when="forcing in-place compaction", level=logging.DEBUG, advice=None):
            forced.enter_context(host.forced_in_place(agent))
        return wrapped(*args, **kwargs)


def host_commit_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """``SessionDB._execute_write(self, fn, ...)`` (0.20+): the rows of the guard's waiting
    on this thread (:class:`~hermes_session_guard.store.connection.Rider`) are written in
    the transaction Hermes runs, after its own ``fn``, and committed, or rolled back, with
    it. No rider waiting (every other write of Hermes's): Hermes's call, unchanged."""

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        riders = take_riders()
        if not riders:
            return wrapped(*args, **kwargs)
        # a sub-step with a fallback of its own: the riders taken off this thread are told they
        # did not ride, so they write on their own (test_commit_riders.py: riders that cannot board)
        with failing_open(row, "the guard writes its rows on its own", advice=None) as failed:
            call_args, call_kwargs = args, dict(kwargs)
            if args:
                call_args = (carry(riders, args[0]), *args[1:])
            else:
                call_kwargs["fn"] = carry(riders, kwargs["fn"])
        if failed:
            arrived(riders, committed=False)
            return wrapped(*args, **kwargs)
        committed = False
        try:
            result = wrapped(*call_args, **call_kwargs)
            committed = True
        finally:  # Hermes's transaction ended: its riders committed, or rolled back with it
            arrived(riders, committed=committed)
        return result

    return wrapper


def compaction_commit_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """``SessionDB.archive_and_compact`` (0.20+): while it runs, the write transaction
    Hermes commits on this thread is the compaction's own, and carries the snapshot
    reference waiting for it (``host_commit``), not an earlier commit of Hermes's."""

    @fails_as("the snapshot reference is written after Hermes's commit")
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with compaction_commit():
            return wrapped(*args, **kwargs)

    return wrapper

