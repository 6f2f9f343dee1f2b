"""The per-session compression lock: threads, leases across processes, expiry,
stale-holder recovery and holder-only release (no Hermes needed)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
from freezegun import freeze_time

from hermes_session_guard.locks.session_lock import (
    GuardLeases,
    LockBusy,
    LockGrant,
    LockUnavailable,
    SessionLocks,
)
from hermes_session_guard.store import GuardStore

from ..integration.waiting import parked_in, place, wait_for

SID = "20260528_155201_68dc5996"
OTHER = "20260528_093510_66bfaec7"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


def _process(db_path: Path, *, keeper: bool = False) -> tuple[SessionLocks, GuardLeases]:
    """What one process has: its own locks table and its own sqlite connection."""
    return SessionLocks(keeper=keeper), GuardLeases(GuardStore(db_path))


def _take(locks: SessionLocks, leases: GuardLeases | None, op: str, *, wait: float = 0.0, lease: float = 60.0,
          sid: str = SID) -> LockGrant | LockBusy:
    return locks.acquire(sid, op, wait_seconds=wait, lease_seconds=lease, lease=leases)


def test_uncontended_acquire_writes_a_lease_and_release_removes_it(db_path: Path) -> None:
    locks, leases = _process(db_path)
    grant = _take(locks, leases, "op1")
    assert isinstance(grant, LockGrant)
    assert grant.scope == "guard" and "guard-op=op1" in grant.holder
    assert leases.holder(SID) == grant.holder
    assert locks.held_sessions() == [SID]
    assert grant.still_held()
    grant.release()
    assert leases.holder(SID) is None
    assert locks.held_sessions() == []
    assert not grant.still_held()


def test_threads_of_one_process_compress_one_session_at_a_time(db_path: Path) -> None:
    locks, leases = _process(db_path)
    inside, peak, done = 0, 0, []
    guard = threading.Lock()

    def worker(n: int) -> None:
        nonlocal inside, peak
        grant = _take(locks, leases, f"op{n}", wait=10.0)
        assert isinstance(grant, LockGrant)
        try:
            with guard:
                inside += 1
                peak = max(peak, inside)
            time.sleep(0.01)
            with guard:
                inside -= 1
            done.append(n)
        finally:
            grant.release()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(done) == list(range(8))
    assert peak == 1
    assert leases.holder(SID) is None


def test_contender_in_the_same_process_skips_and_names_the_holder(db_path: Path) -> None:
    locks, leases = _process(db_path)
    held = _take(locks, leases, "winner")
    assert isinstance(held, LockGrant)
    started = time.monotonic()
    busy = _take(locks, leases, "loser", wait=0.05)
    assert isinstance(busy, LockBusy)
    assert busy.scope == "process" and busy.holder == held.holder
    assert 0.04 <= busy.waited < 1.0 and time.monotonic() - started < 1.0
    held.release()


def test_waiter_in_the_same_process_wakes_when_the_holder_releases(db_path: Path) -> None:
    locks, leases = _process(db_path)
    held = _take(locks, leases, "winner")
    result: list[LockGrant | LockBusy] = []
    t = threading.Thread(target=lambda: result.append(_take(locks, leases, "waiter", wait=5.0)))
    t.start()
    # parked on the lock's condition: it found the holder and waits for its release
    assert wait_for(lambda: parked_in([place("wait", "threading.py")], t)), "the waiter never waited"
    held.release()
    t.join(5)
    (grant,) = result
    assert isinstance(grant, LockGrant)
    assert grant.waited_for == held.holder
    assert 0 < grant.waited < 5.0
    grant.release()


def test_other_sessions_are_not_blocked(db_path: Path) -> None:
    locks, leases = _process(db_path)
    held = _take(locks, leases, "a", sid=SID)
    other = _take(locks, leases, "b", sid=OTHER)
    assert isinstance(held, LockGrant) and isinstance(other, LockGrant)
    held.release()
    other.release()


def test_a_second_process_is_held_off_by_the_lease(db_path: Path) -> None:
    locks1, leases1 = _process(db_path)
    locks2, leases2 = _process(db_path)
    held = _take(locks1, leases1, "p1")
    busy = _take(locks2, leases2, "p2", wait=0.1)
    assert isinstance(busy, LockBusy)
    assert busy.scope == "guard" and busy.holder == held.holder
    assert locks2.held_sessions() == []  # the in-process entry was given back
    held.release()
    grant = _take(locks2, leases2, "p2")
    assert isinstance(grant, LockGrant)
    grant.release()


def test_a_second_process_waits_for_the_lease(db_path: Path) -> None:
    locks1, leases1 = _process(db_path)
    locks2, leases2 = _process(db_path)
    held = _take(locks1, leases1, "p1")
    threading.Timer(0.2, held.release).start()
    grant = _take(locks2, leases2, "p2", wait=5.0)
    assert isinstance(grant, LockGrant)
    assert grant.waited_for == held.holder and 0.15 <= grant.waited < 2.0
    grant.release()


def test_crashed_holder_blocks_for_at_most_its_lease(db_path: Path) -> None:
    locks1, leases1 = _process(db_path)
    locks2, leases2 = _process(db_path)
    with freeze_time("2026-05-28 16:12:31") as clock:
        crashed = _take(locks1, leases1, "crashed", lease=10.0)
        assert isinstance(crashed, LockGrant)
        # the holder process dies: nothing refreshes or releases its lease
        clock.tick(9.0)
        assert isinstance(_take(locks2, leases2, "p2"), LockBusy)
        clock.tick(2.0)
        recovered = _take(locks2, leases2, "p2")
        assert isinstance(recovered, LockGrant)
        assert leases2.holder(SID) == recovered.holder
        # the stale holder cannot refresh, confirm or free what it lost
        assert not crashed.refresh() and crashed.lost
        assert not crashed.still_held()
        crashed.release()
        assert leases2.holder(SID) == recovered.holder
        recovered.release()


def test_refreshed_lease_outlives_its_first_expiry(db_path: Path) -> None:
    locks1, leases1 = _process(db_path)
    locks2, leases2 = _process(db_path)
    with freeze_time("2026-05-28 16:12:31") as clock:
        held = _take(locks1, leases1, "p1", lease=10.0)
        assert isinstance(held, LockGrant)
        clock.tick(8.0)
        # what the keeper thread does every lease/3
        assert held.refresh() and not held.lost
        clock.tick(7.0)  # 15 s after acquire, 7 s after the refresh
        assert isinstance(_take(locks2, leases2, "p2"), LockBusy)
        clock.tick(4.0)  # 11 s after the refresh: lapsed
        assert isinstance(_take(locks2, leases2, "p2"), LockGrant)


def test_release_is_by_holder_only(db_path: Path) -> None:
    locks, leases = _process(db_path)
    first = _take(locks, leases, "first")
    assert isinstance(first, LockGrant)
    assert leases.store.release_lease(SID, "pid=1:tid=1:guard-op=intruder") is False
    assert leases.holder(SID) == first.holder
    first.release()
    second = _take(locks, leases, "second")
    assert isinstance(second, LockGrant)
    first.release()  # a late second release of the old grant frees nothing
    assert locks.holder(SID) == second.holder
    assert leases.holder(SID) == second.holder
    second.release()


class _Clocks:
    """A wall clock for the leases and a monotonic one for the locks, moved by the test."""

    def __init__(self) -> None:
        self.wall, self.mono = 1_000_000.0, 50.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@pytest.mark.parametrize("refreshed", [True, False])
def test_due_refreshes_keep_a_hold_past_its_lease_and_without_them_it_lapses(db_path: Path, refreshed: bool) -> None:
    clocks = _Clocks()
    locks1 = SessionLocks(monotonic=lambda: clocks.mono, keeper=False)
    leases1 = GuardLeases(GuardStore(db_path), clock=lambda: clocks.wall)
    locks2, leases2 = SessionLocks(keeper=False), GuardLeases(GuardStore(db_path), clock=lambda: clocks.wall)
    held = _take(locks1, leases1, "long", lease=1.0)
    assert isinstance(held, LockGrant)
    for _ in range(8):  # 1.6 s in steps of 0.2 s, longer than the lease
        clocks.advance(0.2)
        if refreshed:
            locks1.refresh_due()
    second = _take(locks2, leases2, "p2")
    if refreshed:
        assert isinstance(second, LockBusy) and second.holder == held.holder
        assert not held.lost
    else:
        assert isinstance(second, LockGrant)  # the lease lapsed: another process takes the session
        second.release()
    held.release()


def test_the_keeper_thread_runs_the_due_refreshes(db_path: Path) -> None:
    refreshed = threading.Event()

    class Spy(GuardLeases):
        def refresh(self, session_id: str, holder: str, ttl_seconds: float) -> bool:
            refreshed.set()
            return super().refresh(session_id, holder, ttl_seconds)

    locks = SessionLocks(keeper=True)
    held = _take(locks, Spy(GuardStore(db_path)), "long", lease=0.3)  # first refresh due after 0.1 s
    assert isinstance(held, LockGrant)
    try:
        assert refreshed.wait(10), "the keeper thread never refreshed the lease"
    finally:
        held.release()
        locks.close()


def test_broken_lease_table_raises_and_leaves_no_in_process_holder(db_path: Path) -> None:
    class Broken(GuardLeases):
        def try_acquire(self, session_id: str, holder: str, ttl_seconds: float) -> bool:
            raise sqlite3.OperationalError("database is locked")

    locks, leases = _process(db_path)
    with pytest.raises(LockUnavailable, match="database is locked"):
        _take(locks, Broken(leases.store), "op")
    assert locks.held_sessions() == []
    grant = _take(locks, leases, "op2")
    assert isinstance(grant, LockGrant)
    grant.release()


def test_process_only_lock_without_a_lease_table(db_path: Path) -> None:
    locks = SessionLocks(keeper=False)
    grant = _take(locks, None, "op")
    assert isinstance(grant, LockGrant) and grant.scope == "process" and grant.still_held()
    assert isinstance(_take(locks, None, "op2"), LockBusy)
    grant.release()
