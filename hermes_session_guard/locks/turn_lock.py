"""One turn per session at a time, in arrival order, across threads and processes.

A *turn* is one ``AIAgent.run_conversation`` on a session that has a SessionDB
(every entry point: CLI, platform gateway, API server, TUI, ACP, cron). Turns of
one session are taken in two steps, both inside one wait budget
(``session_guard.turns.wait_seconds``):

1. the in-process queue: a ticket per turn, appended on arrival; only the ticket at
   the head of its session's queue may go on, so threads of one process run their
   turns in the order they arrived (FIFO, not whoever wakes first);
2. the cross-process lease: a row of ``session_guard_turn_locks`` (expiry
   ``session_guard.turns.lease_seconds``, refreshed while held), so a CLI and an API
   server on one ``HERMES_HOME`` take turns too. Across processes the order is
   "one at a time", not strict arrival order.

A compression runs *inside* a turn and takes its own lock (:mod:`.session_lock`,
another table), so the two never wait on each other. A compression that starts
*outside* any turn (a background compactor, gateway hygiene, ``/compress``) holds the
session's turn for as long as it runs when the turn is free (:meth:`TurnLocks.try_hold`,
never waiting), so turns that arrive meanwhile queue behind it and start on the
compacted transcript. A turn that cannot get in within the budget raises
:class:`TurnBusy` before anything is written.

The API server reserves a turn before its handler runs (the wait happens on the
event loop, a refusal can still be an HTTP status); the ``run_conversation`` that
handler starts *claims* that reservation instead of queueing behind it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..store import GuardStore, database_key
from ..store.schema import TURN_TABLE
from .session_lock import GuardLeases, LeaseTable, LockBusy, LockUnavailable, SessionLocks

log = logging.getLogger("hermes_session_guard")

# Hermes's own cross-process turn lease (0.20+): where a row names it, the guard keeps only the
# in-process queue and leaves the lease to Hermes (never two lease tables, ADR 0002).
HOST_TURN_LEASES = "session_turn_leases"


class TurnBusy(RuntimeError):
    """A turn waited the whole budget for the turns before it (nothing was written)."""

    def __init__(self, session_id: str, waited: float, retry_after: int, scope: str) -> None:
        self.session_id = session_id
        self.waited = waited
        self.retry_after = retry_after
        self.scope = scope
        super().__init__(
            f"session {session_id} is busy: an earlier turn or a compression of it is still running "
            f"after {waited:.0f}s (session_guard.turns.wait_seconds); nothing was written, "
            f"retry in {retry_after}s"
        )


def turn_leases(store: GuardStore) -> GuardLeases:
    """The cross-process turn leases of 0.13-0.19, in ``session_guard_turn_locks``
    (created on first use)."""
    return GuardLeases(store, table=TURN_TABLE, name="turn")


@dataclass(eq=False)
class TurnTicket:
    """One turn's place in its session's queue; holds the turn once ``grant`` is set."""

    session_id: str
    arrived: float
    grant: Any = None  # a LockGrant, or _PROCESS_ONLY without a lease table
    waited: float = 0.0
    queued_behind: int = 0  # turns ahead of it on arrival (this process)
    owner_thread: int | None = None
    delegated: bool = False  # reserved by an HTTP handler for the run_conversation it starts
    claimed: bool = False
    refs: int = 0
    done: bool = False
    wake: Callable[[], None] | None = None  # an event-loop waiter's wake-up (called when it reaches the head)

    @property
    def held(self) -> bool:
        return self.grant is not None and not self.done


class TurnLocks:
    """The turn queues of one state.db in this process."""

    def __init__(self, leases: LeaseTable | None, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._leases = leases
        self._monotonic = monotonic
        self._cond = threading.Condition(threading.Lock())
        self._queues: dict[str, deque[TurnTicket]] = {}  # session id -> its tickets, in arrival order
        self._locks = SessionLocks()

    # -- queueing --------------------------------------------------------------------
    def enqueue(self, session_id: str) -> TurnTicket:
        with self._cond:
            queue = self._queues.setdefault(session_id, deque())
            ticket = TurnTicket(session_id, self._monotonic(), queued_behind=len(queue))
            queue.append(ticket)
            return ticket

    def held_by_thread(self, session_id: str) -> TurnTicket | None:
        """The ticket this thread already holds on ``session_id`` (a nested turn)."""
        me = threading.get_ident()
        with self._cond:
            queue = self._queues.get(session_id)
            if queue and queue[0].held and queue[0].owner_thread == me:
                return queue[0]
        return None

    def claim_delegated(self, session_id: str) -> TurnTicket | None:
        """The held, not yet claimed reservation of an HTTP handler on ``session_id``."""
        with self._cond:
            queue = self._queues.get(session_id)
            if queue:
                head = queue[0]
                if head.held and head.delegated and not head.claimed:
                    head.claimed = True
                    head.refs += 1
                    head.owner_thread = threading.get_ident()
                    return head
        return None

    def _at_head(self, ticket: TurnTicket) -> bool:
        queue = self._queues.get(ticket.session_id)
        return bool(queue and queue[0] is ticket)

    def _leave(self, ticket: TurnTicket) -> None:
        with self._cond:
            ticket.done = True
            queue = self._queues.get(ticket.session_id)
            if queue is not None:
                try:
                    queue.remove(ticket)
                except ValueError:
                    pass
                if not queue:
                    del self._queues[ticket.session_id]
                elif queue[0].wake is not None:
                    queue[0].wake()
            self._cond.notify_all()

    def _lease(self, ticket: TurnTicket, remaining: float, lease_seconds: float, retry: int,
               lease: LeaseTable | None = None) -> None:
        """At the head of the in-process queue: take the cross-process lease (this queue's
        table, else ``lease``) or raise."""
        table = self._leases or lease
        if table is None:
            return
        try:
            got = self._locks.acquire(ticket.session_id, f"turn-{uuid.uuid4().hex[:8]}",
                                      wait_seconds=remaining, lease_seconds=lease_seconds, lease=table)
        except LockUnavailable:
            self._leave(ticket)
            raise
        if isinstance(got, LockBusy):
            self._leave(ticket)
            raise TurnBusy(ticket.session_id, self._monotonic() - ticket.arrived, retry, got.scope)
        ticket.grant = got

    def _granted(self, ticket: TurnTicket) -> TurnTicket:
        if ticket.grant is None:  # no lease table: the in-process queue alone
            ticket.grant = _PROCESS_ONLY
        ticket.waited = self._monotonic() - ticket.arrived
        ticket.refs += 1
        return ticket

    def wait(self, ticket: TurnTicket, wait_seconds: float, lease_seconds: float, retry: int) -> TurnTicket:
        """Block this thread until ``ticket`` holds its session's turn."""
        deadline = ticket.arrived + max(0.0, wait_seconds)
        with self._cond:
            while not self._at_head(ticket):
                remaining = deadline - self._monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            at_head = self._at_head(ticket)
        if not at_head:
            self._leave(ticket)
            raise TurnBusy(ticket.session_id, self._monotonic() - ticket.arrived, retry, "process")
        self._lease(ticket, max(0.0, deadline - self._monotonic()), lease_seconds, retry)
        ticket.owner_thread = threading.get_ident()
        return self._granted(ticket)

    def try_hold(self, session_id: str, lease_seconds: float, lease: LeaseTable | None = None) -> TurnTicket | None:
        """Take ``session_id``'s turn for this thread only if it is free now: nobody queued
        in this process and the cross-process lease (this queue's table, else ``lease``:
        Hermes's own on 0.20+) free. Never waits; None when the turn is taken."""
        with self._cond:
            if self._queues.get(session_id):
                return None
            ticket = TurnTicket(session_id, self._monotonic())
            self._queues[session_id] = deque([ticket])
        try:
            self._lease(ticket, 0.0, lease_seconds, 1, lease)
        except TurnBusy:
            return None  # _lease left the queue
        ticket.owner_thread = threading.get_ident()
        return self._granted(ticket)

    async def wait_async(self, ticket: TurnTicket, wait_seconds: float, lease_seconds: float,
                         retry: int) -> TurnTicket:
        """Wait on the event loop (no worker thread per waiter) until ``ticket`` holds the turn."""
        deadline = ticket.arrived + max(0.0, wait_seconds)
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(woken.set)

        try:
            while True:
                with self._cond:
                    if self._at_head(ticket):
                        ticket.wake = None
                        break
                    ticket.wake = wake
                remaining = deadline - self._monotonic()
                if remaining <= 0:
                    self._leave(ticket)
                    raise TurnBusy(ticket.session_id, self._monotonic() - ticket.arrived, retry, "process")
                try:  # woken when the turn before it ends; polled now and then all the same
                    await asyncio.wait_for(woken.wait(), timeout=min(remaining, 0.5))
                except TimeoutError:
                    pass
                woken.clear()
            await asyncio.to_thread(self._lease, ticket, max(0.0, deadline - self._monotonic()), lease_seconds,
                                    retry)
        except asyncio.CancelledError:
            self._leave(ticket)
            if ticket.grant is not None and ticket.grant is not _PROCESS_ONLY:
                ticket.grant.release()
            raise
        ticket.delegated = True
        return self._granted(ticket)

    def release(self, ticket: TurnTicket) -> None:
        """Drop one reference; the last one gives the turn to the next ticket."""
        with self._cond:
            ticket.refs -= 1
            if ticket.refs > 0 or ticket.done:
                return
        grant = ticket.grant
        if grant is not None and grant is not _PROCESS_ONLY:
            grant.release()
        self._leave(ticket)

    def cancel(self, ticket: TurnTicket) -> None:
        """A reservation that was never granted (its request failed before waiting)."""
        if ticket.grant is None:
            self._leave(ticket)

    def close(self) -> None:
        self._locks.close()


_PROCESS_ONLY: Any = object()  # marker: held without a lease table

_registry: dict[tuple[Path, bool], TurnLocks] = {}
_registry_lock = threading.Lock()


def turn_locks_for(db_path: Path, store: GuardStore | None) -> TurnLocks:
    """The process's turn queues for one state.db (one per database per process); without a
    ``store`` the queues alone, with no lease table (the host holds the lease)."""
    key = (database_key(db_path), store is None)
    with _registry_lock:
        locks = _registry.get(key)
        if locks is None:
            locks = _registry[key] = TurnLocks(turn_leases(store) if store is not None else None)
        return locks


def retry_after(wait_seconds: float) -> int:
    """The ``Retry-After`` a refused turn is given: a quarter of the wait, 1-30 s."""
    return max(1, min(30, math.ceil(wait_seconds / 4)))
