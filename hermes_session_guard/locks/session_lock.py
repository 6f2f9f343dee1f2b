"""One compression per session at a time, across threads and processes.

A :class:`SessionLocks` belongs to one state.db. Taking a session's lock is two
steps, both bounded by one wait budget (``session_guard.lock.wait_seconds``):

1. the in-process lock: a condition-guarded table of holders, so threads of one
   process queue without touching the database and a waiter wakes the moment the
   holder lets go;
2. the cross-process lease: a row in a lease table with an expiry
   (``session_guard.lock.lease_seconds``, 30 s by default), refreshed by one
   background keeper thread while held. The holder string carries the process
   identity (host, boot time, pid, process start time; :mod:`.liveness`): a
   contender on the same machine that finds the holder's process gone (or its pid
   reused by a process started at another time) takes the lock over at once; a
   holder on another machine, or one Hermes wrote, is waited out until its lease
   lapses.

Which lease table is used is the seam table's ``lock`` behaviour:

``guard``
    the guard's own ``session_guard_locks`` table (hosts without a native lock).
``native``
    Hermes's own ``compression_locks`` (0.16+), through its SessionDB methods, so
    the guard and Hermes share one lock instead of stacking two.

Releasing is holder-qualified at both levels: a late holder never frees a lock
a successor has taken. Only sqlite, threading and the standard clock are used
(no fcntl, no signals), so this runs unchanged on Windows services.

Why one module: the in-process table and the cross-process lease are the
two halves of one lock with one wait budget.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..fail_open import failing_open
from ..seam_behaviour import LockMode
from ..store import GuardStore
from ..store.schema import LOCK_TABLE
from . import liveness

log = logging.getLogger("hermes_session_guard")


_POLL_FIRST = 0.005
_POLL_MAX = 0.1
_KEEPER_LINGER = 30.0


MAX_WAIT_SECONDS = 600.0
MAX_LEASE_SECONDS = 3600.0


def bounded(value: float, low: float, high: float) -> float:
    """``value`` within ``[low, high]``; NaN counts as ``low``."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return low
    if math.isnan(value):
        return low
    return min(max(value, low), high)


class LockUnavailable(RuntimeError):
    """The lease table could not be read or written (the caller fails closed)."""


class LeaseTable(Protocol):
    """A cross-process lease store keyed by session id."""

    name: str  # the scope a busy answer names: a LockMode, or "turn"

    def try_acquire(self, session_id: str, holder: str, ttl_seconds: float) -> bool: ...

    def refresh(self, session_id: str, holder: str, ttl_seconds: float) -> bool: ...

    def release(self, session_id: str, holder: str) -> None: ...

    def holder(self, session_id: str) -> str | None: ...


class GuardLeases:
    """Leases in one of the guard's own lease tables (``table``: ``session_guard_locks`` for
    compressions, ``session_guard_turn_locks`` for turns on 0.13-0.19), through the store's
    one lease implementation (:mod:`hermes_session_guard.store.leases`). ``name`` is the
    scope a busy answer names."""

    def __init__(self, store: GuardStore, clock: Callable[[], float] | None = None, *, table: str = LOCK_TABLE,
                 name: str = LockMode.GUARD) -> None:
        self.store, self.table, self.name = store, table, name
        # Wall-clock seconds (expiry times are compared across processes), read when used.
        self._clock = clock or (lambda: time.time())

    def try_acquire(self, session_id: str, holder: str, ttl_seconds: float) -> bool:
        return self.store.try_acquire_lease(session_id, holder, ttl_seconds, now=self._clock(), table=self.table)

    def refresh(self, session_id: str, holder: str, ttl_seconds: float) -> bool:
        return self.store.refresh_lease(session_id, holder, ttl_seconds, now=self._clock(), table=self.table)

    def release(self, session_id: str, holder: str) -> None:
        self.store.release_lease(session_id, holder, table=self.table)

    def holder(self, session_id: str) -> str | None:
        return self.store.lease_holder(session_id, now=self._clock(), table=self.table)


def holder_id(op_id: str) -> str:
    """Who holds a lock, as audit lines and Hermes's diagnostics show it: process,
    thread and the guard operation (never a session id), then the process identity
    (host, boot, start time; :mod:`.liveness`) that lets any process on this machine
    tell whether the holder is still alive. Hermes's own holders also start with
    ``pid=…:tid=…``, so its diagnostics read the same."""
    ident = liveness.this_process()
    return (f"pid={ident.pid}:tid={threading.get_ident()}:guard-op={op_id}:nonce={uuid.uuid4().hex[:6]}"
            f":{ident.fields()}")


def op_of_holder(holder: str | None) -> str | None:
    """The guard operation named in a holder written by :func:`holder_id` (None for
    a holder the guard did not write, such as Hermes's own)."""
    for part in (holder or "").split(":"):
        if part.startswith("guard-op="):
            return part[len("guard-op="):] or None
    return None


@dataclass(eq=False)
class LockGrant:
    """A held session lock. Release it exactly once (``release`` is idempotent)."""

    session_id: str
    holder: str
    lease_seconds: float
    lease: LeaseTable | None
    waited: float
    waited_for: str | None
    _owner: SessionLocks = field(repr=False)
    lost: bool = False
    released: bool = False
    next_refresh: float = 0.0
    took_over: str | None = None  # the dead holder whose lock this grant took over, if any

    @property
    def scope(self) -> str:
        return self.lease.name if self.lease is not None else "process"

    def still_held(self) -> bool:
        """True while this grant owns the lease (checked before anything is written)."""
        if self.released or self.lost:
            return False
        if self.lease is None:
            return True
        with failing_open(f"confirming the compression lease of {self.session_id}",
                          "the lease is taken as not held and nothing is written", advice=None,
                          level=logging.WARNING):
            return self.lease.holder(self.session_id) == self.holder
        return False

    def refresh(self) -> bool:
        if self.lease is None or self.released:
            return not self.released
        # not a fault yet: the lease stays valid until it expires, and a lost lease is
        # reported by the outcome (still_held is checked before anything is written)
        with failing_open(f"compression lease refresh of {self.session_id}",
                          "retrying; the lease is still valid until it expires", advice=None,
                          level=logging.INFO) as failed:
            ok = self.lease.refresh(self.session_id, self.holder, self.lease_seconds)
        if failed:
            return True  # transient: the lease is still valid until it expires
        if not ok:
            self.lost = True
        return ok

    def release(self) -> None:
        self._owner._release(self)


@dataclass(frozen=True)
class LockBusy:
    """Another operation held the lock for the whole wait."""

    holder: str | None
    waited: float
    scope: str  # "process" or the lease table's name


@dataclass
class _InProcess:
    holder: str
    grant: LockGrant | None = None


class SessionLocks:
    """The compression locks of one state.db (one instance per database per process)."""

    def __init__(
        self,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        keeper: bool = True,
    ) -> None:
        self._monotonic = monotonic
        self._sleep = sleep
        self._use_keeper = keeper
        self._cond = threading.Condition(threading.Lock())
        self._held: dict[str, _InProcess] = {}
        self._leased: list[LockGrant] = []
        self._keeper: threading.Thread | None = None
        self._keeper_until = 0.0
        self._wake = threading.Event()
        self._closed = False
        # Leases whose release failed (the database refused the write): retried before
        # the next acquire, so the next compression after the fault clears is not kept
        # waiting for the lease to lapse.
        self._unreleased: list[LockGrant] = []

    # -- taking and giving back -----------------------------------------------------
    def acquire(
        self,
        session_id: str,
        op_id: str,
        *,
        wait_seconds: float,
        lease_seconds: float,
        lease: LeaseTable | None,
    ) -> LockGrant | LockBusy:
        """Take ``session_id``'s lock, waiting up to ``wait_seconds`` in total.
        Raises :class:`LockUnavailable` if the lease table fails."""
        started = self._monotonic()
        # Validated config is finite and bounded; a caller that built its own config is
        # clamped too, so a wait of "infinity" can never overflow the timeout below.
        wait_seconds = bounded(wait_seconds, 0.0, MAX_WAIT_SECONDS)
        lease_seconds = bounded(lease_seconds, 1.0, MAX_LEASE_SECONDS)
        deadline = started + wait_seconds
        holder = holder_id(op_id)
        stuck = self.retry_releases(session_id)
        if stuck is not None:
            # This process's own earlier lease on the session is still in the table: the
            # database keeps refusing writes, so waiting for it would only name ourselves.
            raise LockUnavailable(f"an earlier lease on this session could not be released: {stuck}")
        waited_for: str | None = None
        took_over: str | None = None
        with self._cond:
            while session_id in self._held:
                waited_for = self._held[session_id].holder
                remaining = deadline - self._monotonic()
                if remaining <= 0:
                    return LockBusy(waited_for, self._monotonic() - started, "process")
                self._cond.wait(remaining)
            entry = self._held[session_id] = _InProcess(holder)
        try:
            if lease is not None:
                delay = _POLL_FIRST
                while not lease.try_acquire(session_id, holder, lease_seconds):
                    current = lease.holder(session_id)
                    if current is not None and liveness.holder_dead(current):
                        # Its process is gone (crashed, killed, restarted): take the lock over
                        # now instead of waiting out its lease. Holder-qualified, so a live
                        # successor that took it meanwhile is never touched.
                        lease.release(session_id, current)
                        took_over = current
                        log.warning("session guard: took over the compression lock of %s from a dead holder "
                                    "(%s)", session_id, current)
                        continue
                    waited_for = current or waited_for
                    remaining = deadline - self._monotonic()
                    if remaining <= 0:
                        self._drop(session_id, entry)
                        return LockBusy(waited_for, self._monotonic() - started, lease.name)
                    self._sleep(min(delay, remaining))
                    delay = min(delay * 2, _POLL_MAX)
        except Exception as exc:
            self._drop(session_id, entry)
            raise LockUnavailable(f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            self._drop(session_id, entry)
            raise
        grant = LockGrant(session_id, holder, lease_seconds, lease, self._monotonic() - started, waited_for, self,
                          took_over=took_over)
        entry.grant = grant
        if lease is not None:
            self._keep(grant)
        return grant

    def _drop(self, session_id: str, entry: _InProcess) -> None:
        with self._cond:
            if self._held.get(session_id) is entry:
                del self._held[session_id]
                self._cond.notify_all()

    def _release(self, grant: LockGrant) -> None:
        with self._cond:
            if grant.released:
                return
            grant.released = True
            if grant in self._leased:
                self._leased.remove(grant)
        if grant.lease is not None:
            # retried before the next acquire; at worst it lapses by itself.
            # INFO: the operation's own outcome already reports the database fault behind it.
            with failing_open(f"releasing the compression lease of {grant.session_id}",
                              f"retried before the next compression, and it expires in {grant.lease_seconds:.0f}s "
                              "at the latest", advice=None, level=logging.INFO) as failed:
                grant.lease.release(grant.session_id, grant.holder)
            if failed:
                with self._cond:
                    self._unreleased.append(grant)
        with self._cond:
            entry = self._held.get(grant.session_id)
            if entry is not None and entry.grant is grant:
                del self._held[grant.session_id]
                self._cond.notify_all()

    def retry_releases(self, session_id: str | None = None) -> Exception | None:
        """Release the leases (of ``session_id``, or all) whose release failed earlier
        (holder-qualified, so a lease another holder has taken since is never touched).
        Returns the error of one that still fails, if any."""
        with self._cond:
            pending = [g for g in self._unreleased if session_id is None or g.session_id == session_id]
            if not pending:
                return None
            self._unreleased = [g for g in self._unreleased if g not in pending]
        failed, error = [], None
        for grant in pending:
            with failing_open(f"releasing the compression lease of {grant.session_id} again",
                              "it stays queued for the next retry", advice=None, level=logging.DEBUG) as attempt:
                grant.lease.release(grant.session_id, grant.holder)  # type: ignore[union-attr]
            if attempt:
                failed.append(grant)
                error = attempt.exc
        if failed:
            with self._cond:
                self._unreleased[:0] = failed
        return error

    def holder(self, session_id: str) -> str | None:
        """The in-process holder of ``session_id``, if any."""
        with self._cond:
            entry = self._held.get(session_id)
            return entry.holder if entry else None

    def held_sessions(self) -> list[str]:
        with self._cond:
            return sorted(self._held)

    # -- keeping leases alive -------------------------------------------------------
    def refresh_due(self) -> float:
        """Refresh every lease whose refresh is due; return when the next one is."""
        now = self._monotonic()
        self.retry_releases()
        with self._cond:
            grants = list(self._leased)
        next_due = now + _KEEPER_LINGER
        for grant in grants:
            if grant.next_refresh <= now:
                grant.refresh()
                grant.next_refresh = now + grant.lease_seconds / 3.0
            next_due = min(next_due, grant.next_refresh)
        return next_due

    def _keep(self, grant: LockGrant) -> None:
        grant.next_refresh = self._monotonic() + grant.lease_seconds / 3.0
        with self._cond:
            self._leased.append(grant)
            if not self._use_keeper or self._closed:
                return
            if self._keeper is None:
                self._keeper_until = grant.next_refresh
                self._keeper = threading.Thread(target=self._keeper_loop, name="session-guard-lease-keeper",
                                                daemon=True)
                self._keeper.start()
                return
            wake = grant.next_refresh < self._keeper_until
        if wake:
            self._wake.set()

    def _keeper_loop(self) -> None:
        idle_since: float | None = None
        while True:
            next_due = self.refresh_due()
            now = self._monotonic()
            with self._cond:
                if self._closed:
                    self._keeper = None
                    return
                if self._leased:
                    idle_since = None
                else:
                    idle_since = idle_since if idle_since is not None else now
                    if now - idle_since >= _KEEPER_LINGER:
                        self._keeper = None
                        return
                self._keeper_until = next_due
            self._wake.wait(max(0.005, next_due - now))
            self._wake.clear()

    def close(self) -> None:
        with self._cond:
            self._closed = True
        self._wake.set()
