"""``repair --apply`` against concurrency, on the real host's corrupted fixtures:

* three ``repair --apply`` processes released at the same instant, repeated: one
  applies, the others refuse (exit 2, one line) or find nothing left to do; one
  backup, one repair record, the same live transcripts as one repair alone, and
  ``doctor`` clean afterwards;
* a repair while a compression holds the session's lock (the fake LLM holds the
  summary call): refused, naming the lock and the running agent; nothing changes,
  and the compaction that finishes afterwards stands on the original id.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.commands import cli
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from .conftest import MODES, new_agent
from .test_operator_commands import HOST_FIXTURES, materialize
from .waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
RACERS = 3
ROUNDS = 3
FIXTURES = [p for p in HOST_FIXTURES if p.name.endswith(("anomaly-b", "rotation"))]
_RACER = (
    "import os, sys, time\n"
    "from hermes_session_guard.commands import cli\n"
    "from hermes_session_guard.commands import repair\n"  # everything imported before the start signal
    "import hermes_state\n"
    "go, ready = sys.argv[1], sys.argv[2]\n"
    "open(f'{ready}.{os.getpid()}', 'w').close()\n"
    "while not os.path.exists(go):\n"
    "    time.sleep(0.002)\n"
    "sys.exit(cli.main(['repair', '--apply', '--json']))\n"
)


def _env(home: Path) -> dict[str, str]:
    return dict(os.environ, HERMES_HOME=str(home), PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))


def _rows(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(str(db))
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _transcripts(home: Path) -> dict[str, list[tuple[str, str]]]:
    """Live (role, content) per session that is not ended."""
    db = home / "state.db"
    cols = {r[1] for r in _rows(db, "PRAGMA table_info(messages)")}
    live = " AND active = 1" if "active" in cols else ""
    out = {}
    for (sid,) in _rows(db, "SELECT id FROM sessions WHERE ended_at IS NULL ORDER BY id"):
        out[sid] = [(r, str(c)) for r, c in _rows(
            db, f"SELECT role, content FROM messages WHERE session_id = ?{live} ORDER BY id", sid)]
    return out


def _repairs(home: Path) -> list[str]:
    return sorted({r[0] for r in _rows(home / "state.db", "SELECT op_id FROM session_guard_repairs")})


def _doctor(home: Path) -> tuple[int, dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "hermes_session_guard.commands.cli", "doctor", "--json"],
                          env=_env(home),
                          capture_output=True, text=True, timeout=120)
    return done.returncode, json.loads(done.stdout)


@pytest.mark.skipif(not FIXTURES, reason="no anomaly-b or rotation fixture made by this Hermes release")
@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.name)
def test_concurrent_repairs_apply_once(tmp_path: Path, fixture: Path) -> None:
    reference = materialize(fixture, tmp_path / "reference")
    done = subprocess.run([sys.executable, "-m", "hermes_session_guard.commands.cli", "repair", "--apply", "--json"],
                          env=_env(reference), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout)["applied"], done.stdout + done.stderr
    expected = _transcripts(reference)

    for n in range(ROUNDS):
        home = materialize(fixture, tmp_path / f"round{n}")
        go, ready = tmp_path / f"go{n}", tmp_path / f"ready{n}"
        racers = [subprocess.Popen([sys.executable, "-c", _RACER, str(go), str(ready)], env=_env(home),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(RACERS)]
        # every racer has imported everything and polls for the signal
        assert wait_for(lambda pattern=f"{ready.name}.*": len(list(tmp_path.glob(pattern))) == RACERS, timeout=120), \
            [proc.poll() for proc in racers]
        go.write_text("go")
        results = []
        for proc in racers:
            out, err = proc.communicate(timeout=180)
            results.append((proc.returncode, json.loads(out) if out.strip() else {}, err))
        applied = [r for r in results if r[1].get("applied")]
        assert len(applied) == 1, results
        for code, report, err in results:
            if report.get("applied"):
                assert code == 0, report
            elif code == 2:
                assert "another `repair --apply` is running" in report["error"], report
                assert "\n" not in report["error"]
            else:
                assert code == 0 and report.get("nothing_to_do") is True, (code, report, err)
        assert len(list(home.glob("state.db.session-guard-backup-*"))) == 1
        assert len(_repairs(home)) == 1
        assert _transcripts(home) == expected
        code, report = _doctor(home)
        assert code == 0, report["findings"]
        assert _rows(home / "state.db", "SELECT holder FROM session_guard_repair_lock") == [], results


SID = "20260603_090000_c0ffee00"


@pytest.mark.parametrize("mode", MODES)
def test_repair_refuses_while_a_compression_holds_the_lock(
    guard: Any, db: Any, llm: FakeLLMServer, home: Path, mode: str
) -> None:
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, mode)
    probe.mark_flushed(agent, messages)
    gate = threading.Event()
    llm.configure(summary_gate=gate)
    box: dict[str, Any] = {}

    def compress() -> None:
        try:
            box["result"] = agent._compress_context(messages, "You are a test agent.", approx_tokens=150_000)
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=compress)
    worker.start()
    try:
        assert llm.summary_started.wait(30), "the compression never reached its summary call"
        before = (probe.sessions_table(home / "state.db"), _transcripts(home))
        done = subprocess.run([sys.executable, "-m", "hermes_session_guard.commands.cli", "repair", "--apply"],
                              env=_env(home), capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("error: repair refused:")
        assert f"lock on {SID}" in line and "a compression holds the" in line
        assert f"agent pid {os.getpid()}" in line  # this process runs the guard on the home
        assert (probe.sessions_table(home / "state.db"), _transcripts(home)) == before
        assert not list(home.glob("state.db.session-guard-backup-*"))
    finally:
        gate.set()
        worker.join(60)
        llm.configure(summary_gate=None)
    assert "error" not in box, box
    compressed, _ = box["result"]
    assert len(compressed) < len(messages) and agent.session_id == SID
    assert [(r["id"], r["ended_at"]) for r in probe.sessions_table(home / "state.db")] == [(SID, None)]
    # with the compression over, a repair (from this very process, so no other agent runs) finds nothing
    os.environ["HERMES_HOME"] = str(home)
    assert cli.main(["repair", "--apply"]) == 0
    assert [(r["id"], r["ended_at"]) for r in probe.sessions_table(home / "state.db")] == [(SID, None)]


def test_a_running_agent_blocks_repair_and_a_killed_one_does_not(home: Path, db: Any) -> None:
    """Presence: a process that announced itself on the home blocks ``repair --apply``
    while it runs (named by pid); once it is killed (no clean exit, its row stays) the
    row is recognised as dead and the repair proceeds."""
    import signal

    probe.seed_session(db, SID, probe.seed_messages(4))
    code = ("import sys, time\nfrom hermes_session_guard.locks import presence\n"
            "presence.announce(sys.argv[1])\nprint('announced', flush=True)\ntime.sleep(120)\n")
    agent = subprocess.Popen([sys.executable, "-c", code, str(home / "state.db")], env=_env(home),
                             stdout=subprocess.PIPE, text=True)
    try:
        assert agent.stdout is not None and agent.stdout.readline().strip() == "announced"
        done = subprocess.run([sys.executable, "-m", "hermes_session_guard.commands.cli", "repair", "--apply"],
                              env=_env(home), capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and f"agent pid {agent.pid}" in done.stderr, done.stderr
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.wait(30)
    assert _rows(home / "state.db", "SELECT pid FROM session_guard_processes") == [(agent.pid,)]
    done = subprocess.run([sys.executable, "-m", "hermes_session_guard.commands.cli", "repair", "--apply"],
                          env=_env(home), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
