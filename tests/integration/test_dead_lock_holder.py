"""A compression lock whose holder's process is gone: ``doctor`` names it
(``dead_lock_holder``), ``status`` shows the dead holder, ``repair --apply`` clears
it; live holders and holders of unknown liveness (Hermes's own format, another
machine) are left alone. Against the real host's state.db: the guard's
``session_guard_locks`` on every release and Hermes's ``compression_locks`` on 0.16+
(written through Hermes's own SessionDB)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from hermes_session_guard.locks import liveness
from hermes_session_guard.selftest import probe
from hermes_session_guard.store import GuardStore

ROOT = Path(__file__).resolve().parents[2]
SID = "20260601_101500_deadbeef"
OTHER = "20260601_101600_cafef00d"


def _cli(home: Path, *args: str) -> tuple[int, str, str]:
    env = dict(os.environ, HERMES_HOME=str(home), PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    done = subprocess.run([sys.executable, "-m", "hermes_session_guard.commands.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, done.stderr


def _holder(pid: int, start: float, host: str | None = None) -> str:
    me = liveness.this_process()
    ident = liveness.ProcessIdentity(host or me.host, me.boot, pid, start)
    return f"pid={pid}:tid=1:guard-op=op-x:nonce=abcdef:{ident.fields()}"


@pytest.fixture
def sleeper() -> Iterator[psutil.Process]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield psutil.Process(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def _exited() -> tuple[int, float]:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start = psutil.Process(proc.pid).create_time()
    proc.wait()
    return proc.pid, start


def _tables(db: Any) -> list[str]:
    return ["guard", *(["native"] if hasattr(db, "try_acquire_compression_lock") else [])]


def _plant(home: Path, db: Any, table: str, sid: str, holder: str) -> None:
    if table == "native":
        assert db.try_acquire_compression_lock(sid, holder, ttl_seconds=300.0)
    else:
        store = GuardStore(home / "state.db")
        try:
            assert store.try_acquire_lease(sid, holder, 300.0)
        finally:
            store.close()


def _status_locks(home: Path) -> list[dict[str, Any]]:
    code, out, err = _cli(home, "status", "--json")
    assert code == 0, err
    return json.loads(out)["locks"]


def test_dead_and_reused_pid_holders_are_named_and_cleared(home: Path, db: Any, sleeper: psutil.Process) -> None:
    probe.seed_session(db, SID, probe.seed_messages(4))
    probe.seed_session(db, OTHER, probe.seed_messages(4))
    pid, start = _exited()
    dead = {SID: _holder(pid, start),  # the process exited
            OTHER: _holder(sleeper.pid, sleeper.create_time() - 300.0)}  # its pid now runs another process
    tables = _tables(db)
    for table in tables:
        for sid, holder in dead.items():
            _plant(home, db, table, sid, holder)

    code, out, _ = _cli(home, "doctor", "--json")
    report = json.loads(out)
    assert code == 1
    found = sorted((f["extra"]["kind"], f["session_id"], f["extra"]["holder"]) for f in report["findings"]
                   if f["signature"] == "dead_lock_holder")
    assert found == sorted((t, sid, h) for t in tables for sid, h in dead.items())

    assert sorted((lk["kind"], lk["holder_process"]) for lk in _status_locks(home)) == \
        sorted((t, "dead") for t in tables for _ in dead)
    code, text, _ = _cli(home, "status")
    assert code == 0 and text.count("DEAD HOLDER") == len(tables) * len(dead), text

    code, out, err = _cli(home, "repair", "--apply", "--json")
    assert code == 0, (out, err)
    assert json.loads(out)["done"]["locks"] == len(tables) * len(dead)
    assert _status_locks(home) == []
    code, out, _ = _cli(home, "doctor", "--json")
    assert (code, json.loads(out)["findings"]) == (0, [])


def test_live_and_unknown_holders_are_not_dead(home: Path, db: Any, sleeper: psutil.Process) -> None:
    probe.seed_session(db, SID, probe.seed_messages(4))
    probe.seed_session(db, OTHER, probe.seed_messages(4))
    live = _holder(sleeper.pid, sleeper.create_time())
    pid, start = _exited()
    unknown = _holder(pid, start, host="another-machine")  # same pid gone here, but it ran elsewhere
    _plant(home, db, "guard", SID, live)
    _plant(home, db, "guard", OTHER, unknown)
    if "native" in _tables(db):
        hermes_format = f"pid={sleeper.pid}:tid=1:agent=7f00:0a1b2c3d"  # Hermes's own holder, its pid running
        _plant(home, db, "native", SID, hermes_format)
    code, out, _ = _cli(home, "doctor", "--json")
    assert [f for f in json.loads(out)["findings"] if f["signature"] == "dead_lock_holder"] == []
    states = {(lk["kind"], lk["session_id"]): lk["holder_process"] for lk in _status_locks(home)}
    assert states[("guard", SID)] == "alive" and states[("guard", OTHER)] == "unknown"
    if "native" in _tables(db):
        assert states[("native", SID)] == "unknown"


def test_native_lease_is_kept_alive_on_every_release_with_a_native_lock(home: Path, db: Any) -> None:
    """0.18.2+ through Hermes's refresh_compression_lock; 0.16-0.17, which have none,
    through the guard's holder-qualified extension of its own row."""
    from hermes_session_guard.host import NativeLeases

    if "native" not in _tables(db):
        pytest.skip("this Hermes has no compression_locks")
    leases = NativeLeases(db)
    holder = _holder(os.getpid(), liveness.this_process().start)
    assert leases.try_acquire(SID, holder, 5.0)
    import time

    before = time.time()
    assert leases.refresh(SID, holder, 120.0)
    assert not leases.refresh(SID, "pid=1:tid=1:agent=someone-else", 120.0)
    import sqlite3

    conn = sqlite3.connect(str(home / "state.db"))
    try:
        (expires,) = conn.execute("SELECT expires_at FROM compression_locks WHERE session_id = ?", (SID,)).fetchone()
    finally:
        conn.close()
    assert expires - before > 100.0
    leases.release(SID, holder)


def test_a_dead_pid_only_native_holder_is_taken_over_at_once(guard: Any, home: Path, db: Any, llm: Any,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """Hermes's own holder format (``pid=…:tid=…:agent=…``, written by a Hermes process
    without the guard), its pid gone on this machine: doctor names it, and the next
    compression takes the lock over at once instead of waiting out its 300 s lease
    (here the guard waits at most 1 s for the lock, so waiting would skip the compression)."""
    import logging

    from hermes_session_guard.config import parse_config

    if "native" not in _tables(db):
        pytest.skip("this Hermes has no compression_locks")
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    pid, _ = _exited()
    hermes_format = f"pid={pid}:tid=1:agent=7f00:0a1b2c3d"
    _plant(home, db, "native", SID, hermes_format)
    assert liveness.holder_liveness(hermes_format) == liveness.DEAD
    code, out, _ = _cli(home, "doctor", "--json")
    assert [(f["extra"]["kind"], f["extra"]["holder"]) for f in json.loads(out)["findings"]
            if f["signature"] == "dead_lock_holder"] == [("native", hermes_format)]

    before = guard.config
    guard.config = parse_config({"lock": {"wait_seconds": 1}})
    try:
        agent = probe.make_agent(db, llm.base_url, SID)
        probe.mark_flushed(agent, messages)
        with caplog.at_level(logging.INFO, logger="hermes_session_guard"):
            compressed, _ = agent._compress_context(list(messages), "You are a test agent.", approx_tokens=150_000)
    finally:
        guard.config = before
    assert agent.session_id == SID and len(compressed) < len(messages)
    done = [r.getMessage() for r in caplog.records if "compression.done" in r.getMessage()]
    assert len(done) == 1 and f"took_over_from={hermes_format}" in done[0], done
