"""Seam wrappers that make turns of one session run one at a time, in arrival order.

``AIAgent.run_conversation`` is where every entry point starts a turn (CLI, platform
gateway, API server, TUI gateway, ACP, cron). Up to 0.19 its wrapper
(:mod:`.legacy.turns`) takes the session's turn (:mod:`..locks.turn_lock`) and, once it has
it, runs against the session's *live*
transcript when state.db holds messages the caller's history lacks (a turn that
waited behind another turn or a compression, or another process's turn, would
otherwise answer from the history its caller read before: the pre-compression
transcript). The API server's session endpoints reserve the turn before their
handler runs, so the wait happens without a worker thread and a refusal is an
HTTP 503 with ``Retry-After`` instead of a failed turn.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .. import host
from ..contract.generations import keys_of
from ..fail_open import failing_open
from ..hostinfo import state_db_path
from ..locks.session_lock import LockUnavailable
from ..locks.turn_lock import HOST_TURN_LEASES, TurnBusy, TurnLocks, TurnTicket, retry_after, turn_locks_for
from ..runtime import Runtime
from ..seam_behaviour import NO_BEHAVIOUR, SessionFrom
from .envelope import fails_as
from .row import Wrapper

log = logging.getLogger("hermes_session_guard")

_MAX_SESSION_ID = 256


def _locks(runtime: Runtime, db_path: Any, lease_table: str | None = None) -> TurnLocks:
    """The session turn queues of ``db_path``: with the guard's lease table, or (a row naming
    Hermes's ``session_turn_leases``) the in-process queue alone, the lease left to Hermes."""
    if lease_table == HOST_TURN_LEASES:
        return turn_locks_for(db_path, None)
    return turn_locks_for(db_path, runtime.store_for(db_path))


def _history_slot(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, bool]:
    """``conversation_history`` of ``run_conversation(user_message, system_message,
    conversation_history, ...)`` and whether it came positionally."""
    if len(args) > 2:
        return args[2], True
    return kwargs.get("conversation_history"), False


def fresher_history(live: list[Any], history: list[Any] | None) -> bool:
    """True when state.db holds messages the caller's history does not: another turn
    (or a compaction) of the session was written after the caller read it."""
    if history is None or not live:
        return False
    live_keys, own_keys = keys_of(live), keys_of(history)
    if live_keys == own_keys:
        return False
    return bool(Counter(live_keys) - Counter(own_keys))


def _with_live_history(runtime: Runtime, agent: Any, sid: str, ticket: TurnTicket | None,
                       args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    history, positional = _history_slot(args, kwargs)
    if history is None or host.session_db(agent) is None:
        return args, kwargs
    # The turn's own prompt, written by its entry point before the turn (0.21+'s TUI), is
    # this turn's message, not one another writer stored: Hermes adopts that row itself.
    staged = host.staged_turn_row(agent)
    brief = host.live_brief(agent, sid, leave_out_row=staged)  # as stored: only its "nothing newer" counts
    if brief is not None and not fresher_history(brief, history):
        return args, kwargs
    live = host.live_transcript(agent, sid, leave_out_row=staged)
    if not fresher_history(live, history):
        return args, kwargs
    # Input the caller holds only in memory by Hermes's own mark (0.22: a follow-up that
    # interrupted a lease wait) stays, as Hermes's reload after its admission keeps it.
    live = [*live, *host.carried_unpersisted(history)]
    # The agent's flush cursor must describe the list it now continues (0.13-0.16 slice
    # at an index that may still count the longer pre-compression history).
    host.rebase_flush(agent, sid, live, runtime.behaviour.get("compression", NO_BEHAVIOUR).flush_cursor)
    runtime.audit.operation(sid).info("turn.live_history", caller_messages=len(history), live_messages=len(live),
                                      waited_ms=round(ticket.waited * 1000) if ticket is not None else 0)
    if positional:
        return (*args[:2], live, *args[3:]), kwargs
    return args, {**kwargs, "conversation_history": live}


def is_conversation_agent(agent: Any) -> bool:
    """An agent whose turns are the session's conversation: it writes them to a SessionDB.
    Background forks that only share the id (the memory/skill review: no SessionDB on
    0.13-0.18, ``_persist_disabled`` on 0.19) never take the session's turn; they run
    while their parent's turn ends and would otherwise queue behind it."""
    if host.session_db(agent) is None or host.persistence_disabled(agent):
        return False
    return getattr(agent, "_memory_write_origin", None) != "background_review"


def _hold_outside_turn(runtime: Runtime, agent: Any) -> tuple[TurnLocks, TurnTicket] | None:
    """The session's turn for a compaction that starts outside any turn, when it is free now."""
    cfg = runtime.config.turns
    sid = host.session_id(agent)
    if not (cfg.enabled and sid and is_conversation_agent(agent)) or host.in_host_turn(agent):
        return None  # turns off, no session, a background fork, or inside the agent's own turn (0.20+)
    native = host.host_turn_leases(agent)  # 0.20+: Hermes's turn lease; earlier, the guard's
    locks = _locks(runtime, host.db_path(agent), HOST_TURN_LEASES if native is not None else None)
    if locks.held_by_thread(sid) is not None:
        return None  # inside this thread's own turn (0.13-0.19)
    ticket = locks.try_hold(sid, cfg.lease_seconds, native)
    if ticket is None:
        return None  # a turn is running or waiting: the compaction runs beside it, as before
    return locks, ticket


@contextmanager
def held_for_compaction(runtime: Runtime, agent: Any) -> Iterator[None]:
    """Around one compaction of ``agent``'s session. Inside a turn (the usual case) nothing
    changes. Outside any turn (a background or timer thread, gateway hygiene, ``/compress``)
    the compaction holds the session's turn while it runs, when the turn is free: the
    in-process queue every entry point's turn waits in, and the cross-process lease
    (0.13-0.19 the guard's ``session_guard_turn_locks``, 0.20+ Hermes's own
    ``session_turn_leases``, keyed by the lineage root). Turns that arrive meanwhile (the
    API server, the gateway, the CLI) wait, then run one by one on the compacted
    transcript; the gateway buffers what arrives for a session it finds busy. Never waits:
    a turn already running keeps it, and the compaction runs beside it as without this.
    Policy ``open``: an error leaves the compaction as without this hold (ERROR log)."""
    held: tuple[TurnLocks, TurnTicket] | None = None
    try:
        with failing_open("the turn order around a compaction outside a turn", "turns that arrive during this "
                          "compaction run beside it, as without the guard", when="before the compaction",
                          lets_through=(LockUnavailable,)):
            held = _hold_outside_turn(runtime, agent)
    except LockUnavailable as exc:
        # state.db cannot take a lease now: the compaction itself meets the same fault and says it,
        # once (its outcome line); this hold only steps aside
        log.debug("session guard: no turn held for a compaction outside a turn: %s", exc)
    try:
        yield
    finally:
        if held is not None:
            with failing_open("the turn a compaction held", "the turn lease expires on its own",
                              when="after the compaction"):
                held[0].release(held[1])


def live_history_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """0.20+ ``AIAgent.run_conversation``: Hermes's turn lease orders the turns and reloads
    the history when its own admission waited; a caller that read the history before
    waiting elsewhere (0.22's API server loads it before its own run admission) hands the
    turn a stale one, and an admission that then finds the lease free reloads nothing. The
    turn starts on the live transcript when state.db holds messages that history lacks (a
    compaction or another process's turn). No queue, no lease of its own; when the turn
    ends it gives back the turn lease a hand-off took for its child during the turn
    (:func:`host.carry_turn_lease`). Policy ``open``: an error runs the turn on the history
    its caller passed (ERROR log); one giving the child's lease back leaves it to expire."""

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with failing_open(row, "the turn runs on the history its caller passed", when="before the turn"):
            sid = host.session_id(instance)
            if runtime.config.turns.enabled and sid and is_conversation_agent(instance):
                with host.pinned_log_context(sid):
                    args, kwargs = _with_live_history(runtime, instance, sid, None, args, kwargs)
        try:
            return wrapped(*args, **kwargs)
        finally:
            # the child's lease then expires on its own (its ttl)
            with failing_open(row, "a hand-off child's turn lease is left to expire", when="after the turn"):
                host.release_carried_turn_leases(instance)

    return wrapper


async def _body_session(instance: Any, request: Any) -> str:
    """The existing session a ``/v1/responses`` or ``/v1/runs`` body continues, read the
    way the handler reads it: ``session_id`` (runs), else, when the body brings no
    ``conversation_history`` of its own, the session stored with ``previous_response_id``
    (or the latest response of ``conversation``). ``""``: a new session."""
    with failing_open("the JSON body of an API request", "the request is taken to start a new session (no turn "
                      "order)", level=logging.DEBUG, advice=None) as failed:
        body = await request.json()  # aiohttp keeps the body: the handler reads it again
    if failed:
        return ""
    if not isinstance(body, dict):
        return ""
    if request.path.rstrip("/").endswith("/runs") and isinstance(body.get("session_id"), str):
        return str(body["session_id"])
    if body.get("conversation_history"):
        return ""
    store = getattr(instance, "_response_store", None)
    previous = body.get("previous_response_id")
    conversation = body.get("conversation")
    if store is None:
        return ""
    if not previous and isinstance(conversation, str) and conversation:
        previous = store.get_conversation(conversation)
    stored = store.get(previous) if isinstance(previous, str) and previous else None
    sid = stored.get("session_id") if isinstance(stored, dict) else None
    return sid if isinstance(sid, str) else ""


async def _request_session(instance: Any, request: Any, source: str) -> str | None:
    """The session a request continues (``path``: ``/api/sessions/{id}/...``; ``header``:
    ``X-Hermes-Session-Id``; ``body``: see :func:`_body_session`), only for a request the
    host will authenticate."""
    check = getattr(instance, "_check_auth", None)
    if callable(check) and check(request) is not None:
        return None
    if source == SessionFrom.PATH:
        sid = request.match_info.get("session_id", "")
    elif source == SessionFrom.BODY:
        sid = await _body_session(instance, request)
    else:
        sid = request.headers.get("X-Hermes-Session-Id", "")
    sid = str(sid or "").strip()
    if not sid or len(sid) > _MAX_SESSION_ID or any(ch in sid for ch in "\r\n\x00"):
        return None
    return sid


def busy_response(busy: TurnBusy) -> Any:
    """HTTP 503 + ``Retry-After``, naming the session (the id is unchanged)."""
    from aiohttp import web

    payload = {"error": {"message": str(busy), "type": "session_busy", "code": "session_busy",
                         "session_id": busy.session_id, "retry_after": busy.retry_after}}
    headers = {"Retry-After": str(busy.retry_after), "X-Hermes-Session-Id": busy.session_id}
    return web.json_response(payload, status=503, headers=headers)


def api_turn_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """An API server handler that runs a turn on an existing session: take a place in
    the session's turn queue on arrival, wait for it on the event loop, then run the
    handler (which reads the session's history only now, after the turns before it).
    ``behaviour['session_from']``: ``path`` or ``header``; ``behaviour['lease_table']``
    ``session_turn_leases`` (0.20+): the queue is in-process only and the turn takes
    Hermes's own lease, so waiting requests hold neither a lease nor one of Hermes's
    run slots. Policy ``open``."""
    source = row.behaviour.session_from or SessionFrom.PATH
    lease_table = row.behaviour.lease_table

    @fails_as("this turn runs without the per-session turn order")
    async def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        cfg = runtime.config.turns
        request = args[0] if args else kwargs["request"]
        sid = await _request_session(instance, request, source) if cfg.enabled else None
        if not sid:  # a new session, or turns off: Hermes's handler, once
            return await wrapped(*args, **kwargs)
        locks = _locks(runtime, state_db_path(runtime.home), lease_table)
        ticket = locks.enqueue(sid)
        try:
            # a sub-step with a cleanup of its own: a lease that fails gives the queued place
            # back before the handler runs unordered
            with failing_open(f"the turn lease of {sid}", "this turn runs without the per-session turn order",
                              advice=None, lets_through=(TurnBusy,)) as failed:
                await locks.wait_async(ticket, cfg.wait_seconds, cfg.lease_seconds, retry_after(cfg.wait_seconds))
        except TurnBusy as busy:
            runtime.audit.operation(ticket.session_id).warning("turn.refused", waited_ms=round(busy.waited * 1000),
                                                               scope=busy.scope, http_status=503)
            log.warning("session guard: %s", busy)
            return busy_response(busy)
        if failed:
            locks.cancel(ticket)
            return await wrapped(*args, **kwargs)
        before = set(_run_tasks(instance))
        handed_off = False
        try:
            response = await wrapped(*args, **kwargs)
            # /v1/runs answers 202 at once and runs the turn in a task of its own: the
            # reservation goes with that task (its run_conversation claims it) until it ends.
            started = [t for k, t in _run_tasks(instance).items()
                       if k not in before and hasattr(t, "add_done_callback")]
            if len(started) == 1 and not started[0].done():
                started[0].add_done_callback(lambda _task: locks.release(ticket))
                handed_off = True
            return response
        finally:
            if not handed_off:
                locks.release(ticket)

    return wrapper


def _run_tasks(instance: Any) -> dict[Any, Any]:
    """The API server's running ``/v1/runs`` tasks by run id (empty on other handlers)."""
    tasks = getattr(instance, "_active_run_tasks", None)
    return dict(tasks) if isinstance(tasks, dict) else {}
