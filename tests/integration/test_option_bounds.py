"""Numeric options are finite and bounded, and an absurd lock wait can never make the
guard fail in a way that lets Hermes rotate the id (real host).

* ``session_guard.lock.wait_seconds: .inf`` (and ``1e10``, ``.nan``, ``1e308``,
  ``10**30``) in config.yaml: Hermes's plugin discovery loads the guard, which
  refuses the option with one line naming the key and stays off.
* The same values reaching the lock directly (a caller that builds ``GuardConfig``
  itself, past validation), two agents compressing one session at once: the
  contender waits within the bound and adopts, or skips; nobody raises, nobody
  rotates. Before the fix, ``inf`` overflowed the lock's timeout
  (``OverflowError``) and the seam failed open: Hermes compressed unguarded and on
  0.13-0.17 the contender ended on a new id.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from . import test_one_compression_per_session as one
from .conftest import HOST_ROW, MODES
from .test_one_compression_per_session import (
    SID,
    _agents_on_one_session,
    _compress,
    _in_thread,
    _ops,
    _outcomes,
    _wait_for,
)

dbs = one.dbs  # fixtures shared with the one-compression tests
lock_config = one.lock_config

ROOT = Path(__file__).resolve().parents[2]
_DISCOVER = (
    "import hermes_session_guard, logging, sys\n"
    "from hermes_session_guard.selftest import probe\n"
    "logging.basicConfig(stream=sys.stderr, level=logging.ERROR, format='%(name)s %(levelname)s %(message)s')\n"
    "probe.discover_guard()\n"
    "print('RUNTIME', hermes_session_guard.current_runtime() is not None)\n"
)


@pytest.mark.parametrize(("section", "key", "value", "problem"), [
    ("lock", "wait_seconds", math.inf, "finite"),
    ("lock", "wait_seconds", 1e10, "<= 600"),
    ("lock", "wait_seconds", math.nan, "finite"),
    ("lock", "lease_seconds", 1e308, "<= 3600"),
    ("recall", "max_chars", 10**30, "<= 1e+06"),
])
def test_absurd_numbers_in_config_yaml_disable_the_guard_naming_the_key(
    home: Path, llm: FakeLLMServer, section: str, key: str, value: Any, problem: str
) -> None:
    probe.write_config(home, llm.base_url, session_guard={section: {key: value}})
    env = dict(os.environ, HERMES_HOME=str(home), PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    done = subprocess.run([sys.executable, "-c", _DISCOVER], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "RUNTIME False" in done.stdout
    lines = [line for line in done.stderr.splitlines() if "session guard DISABLED" in line]
    assert len(lines) == 1, done.stderr[-2000:]
    assert f"session_guard.{section}.{key}" in lines[0] and problem in lines[0], lines


@pytest.mark.skipif(HOST_ROW is not None and HOST_ROW.behaviour["lock"] == "host",
                    reason="native mode (compression row lock: host): the guard takes no lock and never reads "
                           "lock.wait_seconds; Hermes's own lease decides the contender")
@pytest.mark.parametrize("value", [math.inf, 1e10, math.nan], ids=["inf", "1e10", "nan"])
@pytest.mark.parametrize("mode", MODES)
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
        assert _wait_for(lambda: len(_ops(guard)) == 2)
        time.sleep(0.3)  # b waits on the lock (or has already skipped, for NaN = no wait)
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
