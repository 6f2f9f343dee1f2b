"""``/compactions [session id]``: a session's recorded compactions as lines of ids, outcomes,
counts, times and snapshots (the records of ``status --session``), the CLI's session when
no id is given; a bad argument, no session and no guard each answer in a sentence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.commands import compactions
from hermes_session_guard.config import GuardConfig
from hermes_session_guard.runtime import Runtime

SID = "20260605_080000_abcdef"


@pytest.fixture
def current(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    runtime = Runtime(config=GuardConfig(), host_version="0.19.0", fixed_home=tmp_path)
    monkeypatch.setattr("hermes_session_guard.runtime.current_runtime", lambda: runtime)
    monkeypatch.setenv("HERMES_SESSION_ID", SID)
    store = runtime.store_for(tmp_path / "state.db")
    store.begin_compression("op1", SID, 48, strategy="host_in_place", started_at=1_800_000_000.0)
    store.set_compression_phase("op1", "done", snapshot_id=f"{SID}.snapshot.X", messages_after=12,
                                finished=True, steps={"summary_started_at": 1_800_000_000.5,
                                                      "summary_finished_at": 1_800_000_004.2})
    store.begin_compression("op2", SID, 50, strategy="host_in_place", started_at=1_800_000_100.0)
    store.set_compression_phase("op2", "failed", detail="TimeoutError", messages_after=50, finished=True)
    yield runtime
    runtime.close()


def test_the_session_it_was_typed_in_by_default(current: Runtime) -> None:
    shown = compactions.slash_command("")
    lines = shown.splitlines()
    assert lines[0] == f"Compactions of session {SID}: 2 (oldest first)"
    assert "op op1  DONE: messages 48 -> 12, summary call 3.7s" in lines[1] and f"snapshot {SID}.snapshot.X" in lines[1]
    assert "op op2  FAILED (TimeoutError): messages 50 -> 50" in lines[2] and "snapshot" not in lines[2]
    assert "snapshots " + SID in lines[-1]
    assert compactions.slash_command(f"  {SID} ") == shown


@pytest.mark.parametrize("argument,expected", [
    ("two words", "Usage: /compactions [session id]"),
    ("20260101_000000_000000", "No compaction recorded for session 20260101_000000_000000."),
])
def test_a_bad_or_unknown_session_says_so(current: Runtime, argument: str, expected: str) -> None:
    assert compactions.slash_command(argument) == expected


def test_no_session_and_no_guard_each_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HERMES_SESSION_ID", raising=False)
    assert compactions.slash_command("").startswith("No active session here")
    monkeypatch.setattr("hermes_session_guard.runtime.current_runtime", lambda: None)
    assert compactions.slash_command(SID).startswith("The session guard is not on in this process")
