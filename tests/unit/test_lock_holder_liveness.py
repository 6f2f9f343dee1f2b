"""Lock holders carry a process identity; a provably dead holder is taken over at once
(no Hermes needed: the guard's own lease table, real child processes for pids)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from hermes_session_guard.locks import liveness
from hermes_session_guard.locks.session_lock import GuardLeases, LockBusy, LockGrant, SessionLocks, holder_id
from hermes_session_guard.store import GuardStore

SID = "20260528_155201_68dc5996"


def _holder_for(pid: int, start: float, *, host: str | None = None, boot: float | None = None) -> str:
    me = liveness.this_process()
    ident = liveness.ProcessIdentity(host or me.host, me.boot if boot is None else boot, pid, start)
    return f"pid={pid}:tid=1:guard-op=op-dead:nonce=abcdef:{ident.fields()}"


def _dead_pid() -> tuple[int, float]:
    """A pid whose process has exited (and its start time while it ran)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = psutil.Process(child.pid).create_time()
    child.wait()
    assert not psutil.pid_exists(child.pid) or psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
    return child.pid, start


def test_own_holder_round_trips_and_is_alive() -> None:
    holder = holder_id("op1")
    ident = liveness.parse(holder)
    assert ident == liveness.this_process()
    assert liveness.holder_liveness(holder) == liveness.ALIVE


def test_host_names_with_separators_round_trip() -> None:
    ident = liveness.ProcessIdentity("svc:host=1", 1.5, 42, 2.5)
    assert liveness.parse(f"pid=42:{ident.fields()}") == ident


def test_exited_process_is_dead() -> None:
    pid, start = _dead_pid()
    assert liveness.holder_liveness(_holder_for(pid, start)) == liveness.DEAD


def test_reused_pid_with_another_start_time_is_dead() -> None:
    """A live pid that belongs to a process started at another time than the holder's."""
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = psutil.Process(live.pid).create_time()
        assert liveness.holder_liveness(_holder_for(live.pid, start)) == liveness.ALIVE
        assert liveness.holder_liveness(_holder_for(live.pid, start - 120.0)) == liveness.DEAD
    finally:
        live.kill()
        live.wait()


@pytest.mark.parametrize("holder", [
    f"pid={os.getppid()}:tid=2:agent=7f:0a1b2c",  # Hermes's own format, its pid running: the lease decides
    f"pid={os.getppid()}:tid=1:guard-op=x:nonce=y",  # a holder written before identities existed
    "turn-1a2b", "pid=x:tid=1", None,
])
def test_holders_without_identity_are_unknown(holder: str | None) -> None:
    assert liveness.holder_liveness(holder) == liveness.UNKNOWN


def test_a_pid_only_holder_is_judged_on_this_machine() -> None:
    """Hermes's own ``pid=…:tid=…:agent=…``: its pid gone here, dead; this process, alive."""
    pid, _ = _dead_pid()
    assert liveness.holder_liveness(f"pid={pid}:tid=1:agent=7f:0a1b2c") == liveness.DEAD
    assert liveness.holder_liveness(f"pid={pid}:tid=1:guard-op=x:nonce=y") == liveness.DEAD
    assert liveness.holder_liveness(f"pid={os.getpid()}:tid=1:agent=7f:0a1b2c") == liveness.ALIVE
    assert liveness.holder_liveness(f"pid={pid}:tid=1:agent=7f:host=elsewhere") == liveness.UNKNOWN


def test_other_host_or_other_boot_is_unknown() -> None:
    pid, start = _dead_pid()
    assert liveness.holder_liveness(_holder_for(pid, start, host="elsewhere")) == liveness.UNKNOWN
    assert liveness.holder_liveness(_holder_for(pid, start, boot=liveness.this_process().boot - 3600)) \
        == liveness.UNKNOWN


def _plant(store: GuardStore, holder: str, ttl: float = 300.0) -> None:
    assert store.try_acquire_lease(SID, holder, ttl)


def test_dead_holder_is_taken_over_at_once(tmp_path: Path) -> None:
    store = GuardStore(tmp_path / "state.db")
    pid, start = _dead_pid()
    dead = _holder_for(pid, start)
    _plant(store, dead)
    grant = SessionLocks(keeper=False).acquire(SID, "op2", wait_seconds=0.0, lease_seconds=30.0,
                                               lease=GuardLeases(store))
    assert isinstance(grant, LockGrant), grant
    assert grant.took_over == dead and store.lease_holder(SID) == grant.holder
    grant.release()


def test_reused_pid_holder_is_taken_over(tmp_path: Path) -> None:
    store = GuardStore(tmp_path / "state.db")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        reused = _holder_for(live.pid, psutil.Process(live.pid).create_time() - 120.0)
        _plant(store, reused)
        grant = SessionLocks(keeper=False).acquire(SID, "op2", wait_seconds=0.0, lease_seconds=30.0,
                                                   lease=GuardLeases(store))
        assert isinstance(grant, LockGrant) and grant.took_over == reused
    finally:
        live.kill()
        live.wait()


@pytest.mark.parametrize("kind", ["live", "hermes", "other_host"])
def test_live_or_unknown_holders_are_waited_for(tmp_path: Path, kind: str) -> None:
    store = GuardStore(tmp_path / "state.db")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        holder = {
            "live": _holder_for(live.pid, psutil.Process(live.pid).create_time()),
            "hermes": f"pid={live.pid}:tid=1:agent=7f:0a1b2c",  # its pid running: no proof either way
            "other_host": _holder_for(live.pid + 100000, 1.0, host="elsewhere"),
        }[kind]
        _plant(store, holder)
        busy = SessionLocks(keeper=False).acquire(SID, "op2", wait_seconds=0.05, lease_seconds=30.0,
                                                  lease=GuardLeases(store))
        assert isinstance(busy, LockBusy) and busy.holder == holder
        assert store.lease_holder(SID) == holder
    finally:
        live.kill()
        live.wait()


def test_default_lease_is_short() -> None:
    from hermes_session_guard.config import GuardConfig

    assert GuardConfig().lock.lease_seconds <= 30.0
