"""The turn order of Hermes 0.13-0.19, which has no turn lease of its own: the ``turn_order``
rows' wrapper on ``AIAgent.run_conversation`` takes the session's turn in the guard's queue and
lease (:mod:`...locks.turn_lock`, ``session_guard_turn_locks``) and starts the turn on the live
transcript (:mod:`..turns`; from 0.20 Hermes's ``session_turn_leases`` order turns and the
guard's ``turn_history`` row only reloads the history).
"""

from __future__ import annotations

import logging
from typing import Any

from ... import host
from ...fail_open import failing_open
from ...locks.turn_lock import TurnBusy, TurnTicket, retry_after
from ...runtime import Runtime
from .. import turns
from ..envelope import fails_as
from ..row import Wrapper

log = logging.getLogger("hermes_session_guard")


def run_conversation_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``AIAgent.run_conversation``: one turn per session at a time (see module doc).
    Policy ``open``: a guard error before the turn starts runs it unguarded (ERROR log);
    only a turn that waited the whole ``turns.wait_seconds`` is refused (TurnBusy)."""

    @fails_as("this turn runs without the per-session turn order")
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        cfg = runtime.config.turns
        try:
            ticket: TurnTicket | None = None
            sid = host.session_id(instance)
            if cfg.enabled and sid and turns.is_conversation_agent(instance):
                locks = turns._locks(runtime, host.db_path(instance))
                if locks.held_by_thread(sid) is None:  # else a turn inside this thread's own turn
                    # an API request's reservation is its own run's: a gateway or CLI turn that
                    # starts before that run claims it queues behind it instead of taking it
                    ticket = locks.claim_delegated(sid) if host.serves_api_server(instance) else None
                    if ticket is None:
                        ticket = locks.wait(locks.enqueue(sid), cfg.wait_seconds, cfg.lease_seconds,
                                            retry_after(cfg.wait_seconds))
        except TurnBusy as busy:
            runtime.audit.operation(busy.session_id).warning("turn.refused", waited_ms=round(busy.waited * 1000),
                                                             scope=busy.scope)
            log.warning("session guard: %s", busy)
            raise
        if ticket is None:  # unordered (off, no session, nested): Hermes's call, once
            return wrapped(*args, **kwargs)
        try:
            # the lines below carry this session's [session] tag, whatever the thread served last
            with host.pinned_log_context(sid):
                # a sub-step: the turn keeps its place in the order and runs on the history its
                # caller passed (the envelope would run it unordered)
                with failing_open(row, f"the turn of {sid} runs on the history its caller passed",
                                  when="reading the live transcript before the turn", advice=None):
                    args, kwargs = turns._with_live_history(runtime, instance, sid, ticket, args, kwargs)
                if ticket.queued_behind:
                    runtime.audit.operation(sid).info("turn.dequeued", behind=ticket.queued_behind,
                                                      waited_ms=round(ticket.waited * 1000))
            return wrapped(*args, **kwargs)
        finally:
            locks.release(ticket)

    return wrapper
