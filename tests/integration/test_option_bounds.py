"""Numeric options are finite and bounded, and an absurd value never switches the guard
off nor lets Hermes rotate the id (real host).

* ``session_guard.lock.wait_seconds: .inf`` (and ``1e10``, ``.nan``, ``1e308``,
  ``10**30``) in config.yaml: Hermes's plugin discovery loads the guard, which
  uses that key's default instead, says so in one WARNING naming key and value,
  and stays on. Before, the guard refused the option and switched itself off,
  so on 0.13-0.17 two agents compressing one session ended on two new ids.
* Two agent processes sharing one home whose config.yaml says ``.inf``/``1e10``,
  crossing the compression threshold together: one compaction, both stay on the
  id, no fork.
* The same values reaching the lock directly (a caller that builds ``GuardConfig``
  itself, past validation), two agents compressing one session at once: the
  contender waits within the bound and adopts, or skips; nobody raises, nobody
  rotates. Before the fix, ``inf`` overflowed the lock's timeout
  (``OverflowError``) and the seam failed open: Hermes compressed unguarded and on
  0.13-0.17 the contender ended on a new id.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from . import test_one_compression_per_session as one
from .conftest import HOST_HAS_IN_PLACE, HOST_ROW, MODE_PARAMS
from .process_fleet import marker_answer, plan_for, run_fleet, seed_homes
from .test_one_compression_per_session import (
    SID,
    _agents_on_one_session,
    _compress,
    _in_thread,
    _ops,
    _outcomes,
)
from .waiting import wait_for

dbs = one.dbs  # fixtures shared with the one-compression tests
lock_config = one.lock_config

ROOT = Path(__file__).resolve().parents[2]
_DISCOVER = (
    "import hermes_session_guard, logging, sys\n"
    "from hermes_session_guard.selftest import probe\n"
    "logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format='%(name)s %(levelname)s %(message)s')\n"
    "probe.discover_guard()\n"
    "runtime = hermes_session_guard.current_runtime()\n"
    "print('RUNTIME', runtime is not None)\n"
    "print('VALUE', runtime and getattr(getattr(runtime.config, sys.argv[1]), sys.argv[2]))\n"
)


@pytest.mark.parametrize(("section", "key", "value", "problem", "default"), [
    ("lock", "wait_seconds", math.inf, "finite", 2.0),
    ("lock", "wait_seconds", 1e10, "<= 600", 2.0),
    ("lock", "wait_seconds", math.nan, "finite", 2.0),
    ("lock", "lease_seconds", 1e308, "<= 3600", 30.0),
    ("recall", "max_chars", 10**30, "<= 1e+06", 8000),
])
def test_absurd_numbers_in_config_yaml_fall_back_to_the_default_naming_key_and_value(
    home: Path, llm: FakeLLMServer, section: str, key: str, value: Any, problem: str, default: Any
) -> None:
    probe.write_config(home, llm.base_url, extra={"session_guard": {section: {key: value}}})
    env = dict(os.environ, HERMES_HOME=str(home), PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    done = subprocess.run([sys.executable, "-c", _DISCOVER, section, key], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "RUNTIME True" in done.stdout, done.stderr[-2000:]
    assert f"VALUE {default}" in done.stdout
    assert "DISABLED" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if f"session_guard.{section}.{key}" in line]
    assert len(lines) == 1, done.stderr[-2000:]
    assert "WARNING" in lines[0] and problem in lines[0] and f"default {default}" in lines[0], lines
    assert repr(float(value) if key != "max_chars" else value)[:12] in lines[0], lines


@pytest.mark.slow
@pytest.mark.parametrize("value", [math.inf, 1e10], ids=["inf", "1e10"])
@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_absurd_wait_in_config_yaml_two_processes_one_session_never_fork(
    discovered: Any, llm: FakeLLMServer, tmp_path: Path, mode: str, value: float
) -> None:
    """Two agent processes on one home and session whose config.yaml says ``wait_seconds:
    .inf`` (or 1e10) cross the threshold together: the guard stays on with the default
    wait, one compaction, both keep the id. Before: guard off, 0.14 forked into two ids."""
    llm.reset()
    llm.configure(summary_latency=1.0, reply_fn=marker_answer)
    in_place = (mode == "in_place") if HOST_HAS_IN_PLACE else None
    plan = plan_for(tmp_path, 0, 2)
    seed_homes(plan, llm.base_url, in_place=in_place)
    home, sid = plan[0][0], plan[0][1]
    probe.write_config(home, llm.base_url, in_place=in_place,
                       extra={"session_guard": {"lock": {"wait_seconds": value}}})
    reports, procs, _ = run_fleet(tmp_path, plan, llm.base_url, in_place=in_place, timeout=100)
    assert all("error" not in r for r in reports), [r.get("traceback") for r in reports if "error" in r]
    assert all(p.returncode == 0 for p in procs)
    rows = probe.sessions_table(home / "state.db")
    assert [(r["id"], r["parent_session_id"], r["ended_at"]) for r in rows] == [(sid, None, None)], rows
    assert [r["session_id_after"] for r in reports] == [sid, sid], reports
    assert all(r["guard_loaded"] for r in reports)
    assert len(llm.summary_requests()) == 1


@pytest.mark.skipif(HOST_ROW is not None and HOST_ROW.behaviour.lock == "host",
                    reason="native mode (compression row lock: host): the guard takes no lock and never reads "
                           "lock.wait_seconds; Hermes's own lease decides the contender")
@pytest.mark.parametrize("value", [math.inf, 1e10, math.nan], ids=["inf", "1e10", "nan"])
@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_absurd_wait_under_contention_never_rotates(
    guard: Any, lock_config: Any, db: Any, dbs: Any, llm: FakeLLMServer, home: Path, mode: str, value: float
) -> None:
    lock_config(wait_seconds=value)
    gate = threading.Event()
    llm.configure(summary_gate=gate)
    (a, b), (list_a, list_b) = _agents_on_one_session(db, dbs, llm, mode)
    ta, box_a = _in_thread(lambda: _compress(a, list_a))
    try:
        assert llm.summary_started.wait(10), "the first compression never reached the summary call"
        tb, box_b = _in_thread(lambda: _compress(b, list_b))
        assert wait_for(lambda: len(_ops(guard)) == 2)
        # b waits on the lock (or has already skipped, for NaN = no wait)
        assert wait_for(lambda: one._parked_on_lock(tb) or not tb.is_alive())
    finally:
        gate.set()
    ta.join(60)
    tb.join(60)
    assert "error" not in box_a and "error" not in box_b, (box_a, box_b)
    assert a.session_id == b.session_id == SID
    rows = probe.sessions_table(home / "state.db")
    assert [(r["id"], r["parent_session_id"], r["ended_at"]) for r in rows] == [(SID, None, None)], rows
    events = sorted(e["event"] for e in _outcomes(guard))
    expected = "compression.skipped" if math.isnan(value) else "compression.adopted"
    assert events == sorted(["compression.done", expected]), events
    assert len(llm.summary_requests()) == 1


def test_selftest_says_which_default_an_invalid_option_runs_on(home: Path, llm: FakeLLMServer) -> None:
    from .test_home_check_commands import run_cli

    probe.write_config(home, llm.base_url, extra={"session_guard": {"lock": {"wait_seconds": math.inf}}})
    proc = run_cli(["selftest"], home, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    warned = [x for x in proc.stdout.splitlines() if "session_guard.lock.wait_seconds" in x]
    assert len(warned) == 1 and "WARNING" in warned[0] and "= inf" in warned[0], proc.stdout[-3000:]
    assert "using the default 2.0" in warned[0]
    assert "selftest: PASSED (this home is protected" in proc.stdout
    proc = run_cli(["selftest", "--json"], home, timeout=240)
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["home"]["config_valid"] is False
    assert [x.split(" = ")[0] for x in report["home"]["option_defaults_used"]] == ["session_guard.lock.wait_seconds"]
