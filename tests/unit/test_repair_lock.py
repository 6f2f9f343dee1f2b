"""The repair slot: one holder at a time; a dead holder's slot is taken over."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil

from hermes_session_guard.locks import liveness, repair_lock


def test_one_holder_at_a_time_and_release_is_holder_qualified(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    first, second = repair_lock.new_holder("op1"), repair_lock.new_holder("op2")
    assert repair_lock.acquire(db, first)[0]
    taken, other, since = repair_lock.acquire(db, second)
    assert not taken and other == first and since is not None
    repair_lock.release(db, second)  # not its slot: nothing happens
    assert not repair_lock.acquire(db, second)[0]
    repair_lock.release(db, first)
    assert repair_lock.acquire(db, second)[0]


def test_a_dead_holders_slot_is_taken_over(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = psutil.Process(child.pid).create_time()
    child.wait()
    me = liveness.this_process()
    dead = f"pid={child.pid}:repair-op=x:{liveness.ProcessIdentity(me.host, me.boot, child.pid, start).fields()}"
    assert repair_lock.acquire(db, dead)[0]
    assert repair_lock.acquire(db, repair_lock.new_holder("op2"))[0]
