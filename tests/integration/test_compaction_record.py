"""The durable record of each compaction, read after the fact with ``status --session``:
an agent process killed (SIGKILL) inside its summary call leaves a row the operator sees
as ``interrupted`` (its process is gone), and a restarted process that compacts the
session again records that durably and lists its own compaction with its phase times,
messages and snapshot. Against the real host: the killed process compacts the stored
session with a fresh agent; the restart and ``status`` run in the test's own process (a
fresh agent, a fresh CLI call), which keeps the test cheap."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.commands.cli import main as cli_main
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from .conftest import HOST_HAS_IN_PLACE, HOST_ROW, new_agent

ROOT = Path(__file__).resolve().parents[2]
SID = "20260601_120000_c0ffee00"
TAG = "record"
SYSTEM = "You are a test agent."
# The process that dies: Hermes's own plugin discovery loads the guard from the home's
# config.yaml, then one compaction of the stored session (the parent kills it inside the
# summary call). A direct compaction: Hermes 0.22 skips preflight compaction of a
# reloaded history until a provider reported usage.
_KILLED = r"""
import sys
from pathlib import Path
from hermes_session_guard.selftest import probe
probe.discover_guard()
home, sid, base_url = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
db = probe.open_db(home / "state.db")
history = db.get_messages_as_conversation(sid)
agent = probe.make_agent(db, base_url, sid)
if hasattr(agent, "compression_in_place"):
    agent.compression_in_place = True
probe.mark_flushed(agent, history)
agent._compress_context(history, sys.argv[4], approx_tokens=150_000)
"""


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ, HERMES_HOME=str(home), PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    env.pop("HERMES_SESSION_ID", None)
    return env


def _status(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert cli_main(["status", "--session", SID, "--json"]) == 0
    (session,) = json.loads(capsys.readouterr().out)["sessions"]
    return {r["op_id"]: r for r in session["compactions"]}


def _phases(home: Path) -> dict[str, str]:
    conn = sqlite3.connect(str(home / "state.db"), timeout=10)
    try:
        return dict(conn.execute("SELECT op_id, phase FROM session_guard_compressions WHERE session_id = ?", (SID,)))
    finally:
        conn.close()


def test_a_compaction_killed_midway_is_listed_interrupted_after_the_restart(
    guard: Any, llm: FakeLLMServer, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # no plugin load deadline (0.22 gives up on a plugin after 10 s, which a loaded machine can take)
    probe.write_config(home, llm.base_url, in_place=True if HOST_HAS_IN_PLACE else None,
                       extra={"plugins": {"enabled": ["session-guard"], "load_timeout_seconds": 0}})
    db = probe.open_db(home / "state.db")
    probe.seed_session(db, SID, probe.seed_messages(tag=TAG))
    db.close()
    strategy = HOST_ROW.behaviour.strategy if HOST_ROW is not None else None

    # 1. a process killed while the summary call is held
    gate = threading.Event()
    llm.configure(summary_gate=gate)
    err = tmp_path / "killed.err"
    with open(err, "wb") as err_file:
        proc = subprocess.Popen([sys.executable, "-c", _KILLED, str(home), SID, llm.base_url, SYSTEM],
                                env=_env(home), stdout=subprocess.DEVNULL, stderr=err_file)
    try:
        assert llm.summary_started.wait(120), err.read_text(errors="replace")[-3000:]
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        gate.set()
        llm.configure(summary_gate=None)

    (killed,) = _status(capsys).values()
    killed_op = killed["op_id"]
    assert killed["outcome"] == "interrupted", killed
    assert killed["strategy"] == strategy and killed["messages_before"] == probe.SEED_MESSAGES
    assert killed["summary_started_at"] is not None and killed["summary_finished_at"] is None
    assert killed["finished_at"] is None and killed["snapshot_id"] is None and killed["reason"]
    assert _phases(home) == {killed_op: "started"}  # read as interrupted: nothing has written since

    # 2. the restart: a new agent loads the session and compacts it again
    db = probe.open_db(home / "state.db")
    try:
        history = db.get_messages_as_conversation(SID)
        agent = new_agent(db, llm, SID, "in_place")
        probe.mark_flushed(agent, history)
        agent._compress_context(history, SYSTEM, approx_tokens=150_000)
        assert agent.session_id == SID
    finally:
        db.close()

    records = _status(capsys)
    assert list(records)[0] == killed_op and len(records) >= 2, records
    assert _phases(home)[killed_op] == "interrupted"  # recorded durably by the next compaction
    assert records[killed_op]["outcome"] == "interrupted" and records[killed_op]["finished_at"] is None
    later = [r for op, r in records.items() if op != killed_op]
    done = [r for r in later if r["outcome"] == "done"]
    assert done, later
    record = done[0]
    assert record["strategy"] == strategy and record["snapshot_id"] and record["snapshot_id"].startswith(SID)
    assert record["messages_before"] > record["messages_after"] > 0 and record["summary_chars"] > 0
    for key in ("started_at", "summary_started_at", "summary_finished_at", "finished_at"):
        assert record[key] is not None, (key, record)
    assert 0 <= record["summary_ms"] <= record["duration_ms"]


def test_the_compactions_slash_command_lists_the_session_s_compactions(
        guard: Any, db: Any, llm: FakeLLMServer, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``/compactions``, registered through Hermes's own plugin command registration (no clash
    with a built-in), answers in the CLI's session (``HERMES_SESSION_ID``) and for a named one:
    each compaction's op id, outcome, counts and snapshot, never a turn's text."""
    from hermes_cli import plugins

    handler = plugins.get_plugin_command_handler("compactions")
    assert handler is not None, sorted(plugins.get_plugin_commands())
    messages = probe.seed_messages(tag=TAG)
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, "in_place")
    probe.mark_flushed(agent, messages)
    agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    (row,) = guard.store_for(home / "state.db").compressions(SID)
    monkeypatch.setenv("HERMES_SESSION_ID", SID)
    shown = handler("")
    assert shown.startswith(f"Compactions of session {SID}: 1"), shown
    assert f"op {row['op_id']}  DONE" in shown and f"messages {len(messages)} -> " in shown
    assert f"snapshot {row['snapshot_id']}" in shown and f"{TAG}-" not in shown
    assert handler(SID) == shown
    assert handler("20260101_000000_000000").startswith("No compaction recorded for session")
