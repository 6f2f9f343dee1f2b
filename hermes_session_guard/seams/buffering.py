"""Messages that arrive while a session is compressing: buffered durably, answered in order.

The gateway seams call these functions; they reach the runner, its adapters and
MessageEvent only through :mod:`hermes_session_guard.host`, and keep the
messages in the :class:`~hermes_session_guard.inbox.repository.Inbox`.

Buffering (busy-message seam). A message for a busy session is appended to the
session's inbox, instead of interrupting the agent or replacing the one queued
before it, when

* the session is compressing: this process's registry, a durable
  ``session_guard_compressions`` row younger than ``lock.lease_seconds``, or a
  compression lease held on the session (the guard's ``session_guard_locks``, or
  Hermes's ``compression_locks``, which the guard holds for a whole compression
  from 0.18.2), or
* earlier buffered messages of the session are not delivered yet (a later
  message must not overtake them).

The sender's receipt goes out only after the row is committed. Slash commands,
synthetic events, unauthorised senders, a draining gateway, and the answer to a
pending approval go to Hermes as before.

Delivery, in arrival order, to the session's live id:

* drain seam: where the gateway picks the follow-up for the next turn after a
  turn ends (``_promote_queued_event``), an empty pick becomes the oldest
  buffered message; the turn it starts runs on the same session id;
* handler seam: when a message's handling ends with messages still buffered and
  nothing else queued (``/compress``, a failed turn), the oldest is put in the
  adapter's next-up slot, which the adapter runs next;
* startup seam: a new gateway runner replays what a previous one left behind
  (a dispatched message is first looked up in the transcript, so it runs once).
"""

from __future__ import annotations

import logging
import queue
import uuid
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .. import host
from ..fail_open import failing_open, report
from ..inbox.repository import BUFFERED, DISPATCHED, Inbox, InboxEntry, InboxFull
from ..locks import liveness, presence
from ..locks.session_lock import op_of_holder
from ..runtime import Runtime, current_runtime
from ..store import GuardStore
from .row import HostCall

log = logging.getLogger("hermes_session_guard")


@dataclass
class _RunnerState:
    """What one gateway runner has in flight: its owner token, the messages it
    handed to an adapter that has not started them yet, and its inbox."""

    owner: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    handed: set[int] = field(default_factory=set)
    inbox: Inbox | None = None
    runtime: Runtime | None = None


_states: weakref.WeakKeyDictionary[Any, _RunnerState] = weakref.WeakKeyDictionary()


def runner_state(runner: Any) -> _RunnerState:
    state = _states.get(runner)
    if state is None:
        state = _states[runner] = _RunnerState()
    return state


def inbox_for(runtime: Runtime, runner: Any) -> Inbox:
    state = runner_state(runner)
    if state.inbox is None or state.runtime is not runtime:
        state.inbox = Inbox(runtime.store_for(host.runner_db_path(runner)))
        state.runtime = runtime
        presence.announce_quietly(state.inbox.store.db_path, kind="gateway")  # operators' commands see a gateway
    return state.inbox


def compression_op_for(runtime: Runtime, store: GuardStore, ids: list[str],
                       native_holder: Callable[[str], str | None]) -> str | None:
    """The op id of a compression running on any of the session ids ``ids``: this
    process's registry, a durable compression row younger than the lease, or a live
    holder of the session's lock (the guard's lease table, or Hermes's
    ``compression_locks`` read through ``native_holder``, which the guard holds from 0.18.2)."""
    for sid in ids:
        op = runtime.compressing.op_for(sid)
        if op:
            return op
    for sid in dict.fromkeys(ids):
        op = store.compression_in_flight(sid, runtime.config.lock.lease_seconds)
        if op:
            return op
        holder = store.lease_holder(sid) or native_holder(sid)
        if holder and not liveness.holder_dead(holder):
            return op_of_holder(holder) or holder
    return None


#: Where an entry point's session keeps the prompts held back during a compaction (the
#: TUI gateway's session dict: its own next-turn slot holds one, and merges a second into it).
HELD_PROMPTS = "_session_guard_held_prompts"


def _agent_compacting(runtime: Runtime, agent: Any) -> tuple[str, str | None]:
    """``(session id, op id of a compaction running on it or None)`` for ``agent``."""
    sid = host.session_id(agent) if agent is not None else ""
    if not sid:
        return "", None
    leases = host.native_leases(agent)
    return sid, compression_op_for(runtime, runtime.store_for(host.db_path(agent)), [sid],
                                   leases.holder if leases is not None else (lambda _sid: None))


def hold_or_enqueue(runtime: Runtime, session: dict[str, Any], enqueue: Callable[[], Any]) -> Any:
    """An entry point queues a prompt for its session's next turn (``enqueue``: the host's
    own call, which keeps one slot and merges a second prompt into the first). While the
    session compacts, or while prompts held earlier are still waiting, a prompt that
    would be merged is held back instead, in arrival order; :func:`release_held_prompt`
    puts the oldest in the slot once the slot is free. Returns what ``enqueue`` returned,
    None when the prompt was held."""
    held = session.get(HELD_PROMPTS) or None
    if held is None and session.get("queued_prompt"):
        sid, op = _agent_compacting(runtime, session.get("agent"))
        if op is not None:
            held = session[HELD_PROMPTS] = []
            runtime.audit.operation(sid, op).info("turn.prompt_held", reason="session compacting")
    if held is None:
        return enqueue()
    held.append(enqueue)
    return None


def release_held_prompt(session: dict[str, Any], lock: Any) -> bool:
    """Before the entry point drains its next-turn slot: an empty slot gets the oldest held prompt."""
    with lock:
        held = session.get(HELD_PROMPTS)
        if not held or session.get("queued_prompt"):
            return False
        held.pop(0)()
        if not held:
            session.pop(HELD_PROMPTS, None)
        return True


APART_PROMPTS = "_session_guard_apart_prompts"


def enqueue_apart(runtime: Runtime, session: dict[str, Any], enqueue: Callable[[], Any]) -> Any:
    """0.21+'s TUI queue (``session["queued_prompt"]`` at the head, ``queued_prompts`` after
    it; one per turn, in order): ``enqueue`` (the host's call) merges a text-only prompt into
    a text-only head when nothing else waits. A prompt queued while the session compacts
    is kept apart: the next one goes in an envelope of its own after it (the host's own
    queueing, with the head set aside for the call), also once the compaction has ended
    while that prompt still waits at the head. Returns what ``enqueue`` returns."""
    waiting = [session.get("queued_prompt"), *(session.get("queued_prompts") or [])]
    apart = [e for e in session.get(APART_PROMPTS) or () if any(e is w for w in waiting)]
    sid, op = _agent_compacting(runtime, session.get("agent"))
    head = session.get("queued_prompt")
    if head and not session.get("queued_prompts") and (op is not None or any(e is head for e in apart)):
        session["queued_prompt"] = None
        try:
            envelope = enqueue()
        finally:
            queued = session.get("queued_prompt")
            session["queued_prompt"] = head
            if queued:
                session["queued_prompts"] = [queued, *(session.get("queued_prompts") or [])]
    else:
        envelope = enqueue()
    if op is not None and envelope is not None:
        apart.append(envelope)
        runtime.audit.operation(sid, op).info("turn.prompt_queued_apart", reason="session compacting")
    if apart:
        session[APART_PROMPTS] = apart
    else:
        session.pop(APART_PROMPTS, None)
    return envelope


def interrupt_or_queue(runtime: Runtime, agent: Any, interrupt: Callable[[], Any]) -> bool:
    """An entry point is about to interrupt ``agent``'s running turn for a new prompt it
    has already queued (the TUI gateway's ``interrupt`` busy-input mode). While that
    session compacts the interrupt is left out: the compacting turn gets its own answer
    and the queued prompt runs as the next turn, as the platform gateway does (0.18+
    demote ``interrupt`` to ``queue`` while the lock is held). Outside a compaction the
    interrupt goes ahead. Returns whether it did."""
    sid, op = _agent_compacting(runtime, agent)
    if op is None:
        interrupt()
        return True
    runtime.audit.operation(sid, op).info("turn.interrupt_deferred", reason="session compacting")
    return False


class _CompactionAwareQueue(queue.Queue[Any]):
    """The interactive CLI's interrupt queue (``HermesCLI._interrupt_queue``; its class is
    switched to this one in place, so the items, the lock and every reference stay).
    The CLI's turn watches it and interrupts the agent for what is put on it; while the
    agent's session compacts an item goes to the CLI's input queue instead, where its
    loop runs each item as a turn of its own, in order, after the running one."""

    _session_guard: tuple[Runtime, weakref.ReferenceType[Any]]

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        runtime, cli_ref = self._session_guard
        cli = cli_ref()
        pending = getattr(cli, "_pending_input", None)
        if cli is None or pending is None or current_runtime() is not runtime:
            return super().put(item, block, timeout)
        interrupt = HostCall(super().put, item, block, timeout)
        try:
            interrupted = interrupt_or_queue(runtime, getattr(cli, "agent", None), interrupt)
        except Exception as exc:
            if interrupt.ran:  # the queue's own put failed: its error, and the item is not put twice
                raise
            log.error("session guard: could not tell whether the CLI's session compacts (%s: %s); the input "
                      "interrupts the turn as without the guard", type(exc).__name__, exc)
            return super().put(item, block, timeout)
        if not interrupted:
            pending.put(item)


def defer_cli_interrupts(runtime: Runtime, cli: Any) -> None:
    """Make the interactive CLI ``cli`` hold back input typed while its session compacts
    (:class:`_CompactionAwareQueue`). Idempotent; a queue of another kind is left alone."""
    interrupts = getattr(cli, "_interrupt_queue", None)
    if type(interrupts) is queue.Queue:
        interrupts.__class__ = _CompactionAwareQueue
    if isinstance(interrupts, _CompactionAwareQueue):
        interrupts._session_guard = (runtime, weakref.ref(cli))


def _entry_audit(runtime: Runtime, entry: InboxEntry) -> Any:
    return runtime.audit.operation(entry.session_id or entry.session_key, entry.op_id)


def _overflow_text(template: str, waiting: int, limit: int) -> str:
    try:
        return template.format(waiting=waiting, limit=limit)
    except (KeyError, IndexError, ValueError):
        return template


async def on_busy_message(
    runtime: Runtime, runner: Any, event: Any, session_key: str, call_host: Callable[[], Awaitable[bool]]
) -> bool:
    """The busy-message seam: buffer ``event`` or hand it to Hermes (``call_host``).
    Once a message is stored this never raises and never calls the host."""
    cfg = runtime.config.buffer
    seq = host.event_inbox_seq(event)
    if seq is not None:
        # A replayed message found its session busy again: back in the queue; the
        # running turn's drain takes it in order.
        runner_state(runner).handed.discard(seq)
        inbox_for(runtime, runner).requeue(seq)
        return True
    if (
        not cfg.enabled
        or not session_key
        or not host.event_is_plain_message(event)
        or host.runner_draining(runner)
        or not host.user_authorized(runner, event)
    ):
        return await call_host()
    inbox = inbox_for(runtime, runner)
    # the session behind ``session_key`` (the gateway's routing, else its running agent's) and
    # the op id of a compression running on either
    ids = [i for i in (host.gateway_session_id(runner, session_key),
                       host.running_agent_session_id(runner, session_key)) if i]
    op_id = compression_op_for(runtime, inbox.store, ids, lambda sid: host.runner_lock_holder(runner, sid))
    compressing = op_id is not None
    if not compressing:
        if host.approval_pending(session_key) or not inbox.has_undelivered(session_key):
            return await call_host()
        op_id = inbox.latest_op(session_key)
    sid = ids[0] if ids else None
    adapter = host.adapter_for(runner, event.source)
    audit = runtime.audit.operation(sid or session_key, op_id)
    try:
        with failing_open("session_guard_inbox", f"could not store a message for {session_key}: Hermes queues it in "
                          "memory as it would without the guard", advice=None, lets_through=(InboxFull,)) as failed:
            entry = inbox.append(
                session_key=session_key,
                session_id=sid,
                op_id=op_id,
                payload=host.event_payload(event),
                text=host.event_text(event),
                user_id=host.event_user_id(event),
                max_messages=cfg.max_messages,
            )
    except InboxFull as full:
        audit.warning("message.refused", session_key=session_key, user_id=host.event_user_id(event),
                      waiting=full.waiting, limit=full.limit, reason="buffer.max_messages reached")
        log.warning(
            "session guard: message from %s to %s REFUSED while compressing: %d messages already buffered "
            "(session_guard.buffer.max_messages=%d); the sender was told to resend.",
            host.event_user_id(event), session_key, full.waiting, full.limit,
        )
        await _notify(runner, adapter, event, _overflow_text(cfg.overflow_text, full.waiting, full.limit))
        return True
    if failed:
        return await call_host()
    # stored: it must not also go to Hermes
    with failing_open(f"the message.buffered event of message #{entry.seq} for {session_key}",
                      "the message is buffered all the same", level=logging.WARNING, advice=None):
        audit.info("message.buffered", seq=entry.seq, position=entry.position, session_key=session_key,
                   user_id=entry.user_id, while_compressing=compressing)
    if cfg.receipt and adapter is not None:
        await _notify(runner, adapter, event, cfg.receipt_text)
    return True


async def _notify(runner: Any, adapter: Any, event: Any, text: str) -> None:
    if adapter is None or not text:
        return
    with failing_open("sending a notice", "the chat does not get this notice", level=None) as failed:
        await host.send_notice(runner, adapter, event, text)
    if failed.exc is not None:  # the chat is named only when there is something to say
        report(f"sending a notice to chat {host.event_chat_id(event)}", failed.exc,
               "the chat does not get this notice", level=logging.WARNING, advice=None)


def _event_for(runtime: Runtime, inbox: Inbox, entry: InboxEntry) -> Any | None:
    with failing_open(f"buffered message #{entry.seq} for {entry.session_key}", "it cannot be rebuilt for this "
                      "Hermes and is kept in session_guard_inbox with state 'failed'", advice=None) as failed:
        return host.event_from_payload(entry.payload, entry.seq)
    inbox.fail(entry.seq)
    _entry_audit(runtime, entry).error("message.undeliverable", seq=entry.seq, position=entry.position,
                                       reason=failed.reason)
    return None


def _next_event(runtime: Runtime, inbox: Inbox, session_key: str, state: _RunnerState,
                dispatch: bool, via: str) -> Any | None:
    """Settle what this runner finished, then dispatch the oldest buffered message."""
    while True:
        settled, nxt = inbox.settle_and_dispatch(session_key, state.owner, keep=state.handed, dispatch=dispatch)
        for entry in settled:
            _entry_audit(runtime, entry).info("message.delivered", seq=entry.seq, position=entry.position,
                                              session_key=entry.session_key)
        if nxt is None:
            return None
        event = _event_for(runtime, inbox, nxt)
        if event is not None:
            _entry_audit(runtime, nxt).info("message.dispatched", seq=nxt.seq, position=nxt.position,
                                            session_key=session_key, via=via)
            return event


def on_drain(runtime: Runtime, runner: Any, session_key: str | None, pending_event: Any) -> Any:
    """The drain seam: after Hermes picked (or did not pick) the next follow-up of
    ``session_key``, settle the buffered messages whose turns ended and, if Hermes has
    nothing queued, return the oldest buffered message as the next turn."""
    if not session_key:
        return pending_event
    inbox = inbox_for(runtime, runner)
    if not inbox.has_undelivered(session_key):
        return pending_event
    event = _next_event(runtime, inbox, session_key, runner_state(runner), dispatch=pending_event is None, via="drain")
    return event if event is not None else pending_event


def on_handler_start(runner: Any, event: Any) -> None:
    seq = host.event_inbox_seq(event)
    if seq is not None:
        runner_state(runner).handed.discard(seq)


def on_handler_done(runtime: Runtime, runner: Any, event: Any) -> None:
    """The handler seam: a message's handling ended. If the session is idle with
    messages still buffered, put the oldest in the adapter's next-up slot."""
    source = getattr(event, "source", None)
    if source is None:
        return
    session_key = host.session_key_for(runner, source)
    inbox = inbox_for(runtime, runner)
    if not inbox.has_undelivered(session_key) or host.session_running(runner, session_key):
        return
    adapter = host.adapter_for(runner, source)
    if adapter is None or host.adapter_has_pending(adapter, session_key):
        return
    state = runner_state(runner)
    nxt = _next_event(runtime, inbox, session_key, state, dispatch=True, via="handoff")
    if nxt is not None:
        state.handed.add(host.event_inbox_seq(nxt) or 0)
        host.stage_pending(adapter, session_key, nxt)


def replay(runtime: Runtime, runner: Any, platform: Any = None) -> int:
    """The startup seam: deliver what an earlier gateway runner left in the inbox.
    Returns the number of sessions whose queue was restarted."""
    inbox = inbox_for(runtime, runner)
    state = runner_state(runner)
    wanted = host.platform_value(platform)
    started = 0
    for session_key in inbox.undelivered_keys():
        for entry in inbox.entries(session_key, states=(DISPATCHED,)):
            if entry.owner == state.owner:
                continue  # in flight in this runner
            if host.transcript_has_user_text(runner, entry.session_id, entry.text, entry.dispatched_at):
                inbox.mark_delivered([entry.seq])
                _entry_audit(runtime, entry).info("message.delivered", seq=entry.seq, position=entry.position,
                                                  session_key=session_key, found_in_transcript=True)
            else:
                inbox.requeue(entry.seq)
        waiting = inbox.entries(session_key, states=(BUFFERED,))
        if not waiting:
            continue
        plat = host.event_platform(waiting[0].payload)
        if wanted is not None and plat != wanted:
            continue
        adapter = host.adapter_for_platform(runner, plat)
        if adapter is None:
            log.warning("session guard: %d buffered message(s) for %s wait for platform %s to connect",
                        len(waiting), session_key, plat)
            continue
        if host.adapter_busy(adapter, session_key) or host.session_running(runner, session_key):
            continue  # the running turn's drain takes them in order
        event = _next_event(runtime, inbox, session_key, state, dispatch=True, via="replay")
        if event is None:
            continue
        state.handed.add(host.event_inbox_seq(event) or 0)
        runtime.audit.operation(waiting[0].session_id or session_key, waiting[0].op_id).info(
            "message.replayed", session_key=session_key, waiting=len(waiting), first_seq=waiting[0].seq,
        )
        host.redeliver(runner, adapter, event)
        started += 1
    return started
