"""What the contract does once the host's compression has run and something on the
guard's side goes wrong: the host never runs twice, nothing propagates into the
host's turn, and the caller continues with exactly what state.db holds."""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

import pytest

from hermes_session_guard import audit
from hermes_session_guard.runtime import Runtime
from hermes_session_guard.seam_behaviour import Strategy
from hermes_session_guard.seams import compression
from hermes_session_guard.seams.compression import guarded_compression

from .test_compression_contract import Agent, Engine, _messages


def _last(runtime: Runtime) -> dict[str, Any]:
    return [e for e in audit.read_events(runtime.audit_path) if e.get("op_id")][-1]


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("injected")


def _run(runtime: Runtime, agent: Agent, strategy: str) -> tuple[list[dict], list[int]]:
    messages = _messages()
    calls: list[int] = []

    def host() -> Any:
        calls.append(1)
        return agent._compress_context(messages, "s")

    out, _ = guarded_compression(runtime, strategy, agent, messages, host)
    return out, calls


def test_hermes_failing_to_write_its_in_place_compaction_leaves_everything_unchanged(
    runtime: Runtime, db: Any
) -> None:
    agent = Agent(db, Engine())
    agent.rotate_on_compress = False
    agent.in_place_write_fails = True  # archive_and_compact raised inside Hermes, which logged it and went on
    out, calls = _run(runtime, agent, Strategy.HOST_IN_PLACE)
    assert calls == [1] and [m["content"] for m in out] == [m["content"] for m in _messages()]
    # The guard's own write ahead of Hermes's succeeded: that snapshot stays, verbatim, and is named.
    store = runtime.store_for(db.db_path)
    (snap,) = store.list_snapshots("S1")
    assert store.snapshot_messages(snap.snapshot_id) == _messages()
    last = _last(runtime)
    assert last["event"] == "compression.failed" and "Hermes could not write" in last["reason"]
    assert last["snapshot_id"] is None and last["snapshot_written_ahead"] == snap.snapshot_id


def test_a_state_db_fault_refusing_both_writes_leaves_no_snapshot_and_one_loud_line(
    runtime: Runtime, db: Any, mocker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The usual database fault: the write ahead and Hermes's own write go to the same
    state.db, so both fail. The snapshot is not retried (nothing was compacted), and the
    failed outcome is the operation's one WARNING-or-worse line."""
    caplog.set_level(logging.INFO, logger="hermes_session_guard")
    store = runtime.store_for(db.db_path)
    refused = mocker.patch.object(store, "write_snapshot", side_effect=sqlite3.OperationalError("database is locked"))
    agent = Agent(db, Engine())
    agent.rotate_on_compress = False
    agent.in_place_write_fails = True
    out, calls = _run(runtime, agent, Strategy.HOST_IN_PLACE)
    assert calls == [1] and [m["content"] for m in out] == [m["content"] for m in _messages()]
    assert refused.call_count == 1 and store.list_snapshots("S1") == []
    events = [e for e in audit.read_events(runtime.audit_path) if e.get("op_id")]
    assert [e["event"] for e in events] == ["compression.started", "snapshot.deferred", "compression.failed"]
    assert "snapshot_written_ahead" not in events[-1]
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) == 1 and "compression.failed" in loud[0], loud


@pytest.mark.parametrize("strategy", [Strategy.DETACH_DB, Strategy.HOST_IN_PLACE])
def test_a_guard_error_after_the_compaction_is_persisted_keeps_it(
    runtime: Runtime, db: Any, strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(db, Engine())
    agent.rotate_on_compress = strategy == Strategy.DETACH_DB
    monkeypatch.setattr(runtime.compactions, "record", _boom)
    out, calls = _run(runtime, agent, strategy)
    assert calls == [1] and len(out) == 3 and agent.session_id == "S1"
    if strategy == Strategy.DETACH_DB:
        db.replace_messages.assert_called_once_with("S1", out)
    last = _last(runtime)
    assert last["event"] == "compression.done" and "injected" in last["reason"] and last["hint"]


def test_a_guard_error_before_anything_is_persisted_keeps_the_callers_list(
    runtime: Runtime, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(db, Engine())
    monkeypatch.setattr(compression, "summary_indices", _boom)
    out, calls = _run(runtime, agent, Strategy.DETACH_DB)
    assert calls == [1] and len(out) == 10 and agent.session_id == "S1"
    db.replace_messages.assert_not_called()
    last = _last(runtime)
    assert last["event"] == "compression.failed" and "injected" in last["reason"]


def test_a_host_error_still_propagates_unchanged(runtime: Runtime, db: Any) -> None:
    agent = Agent(db, Engine())

    def host() -> Any:
        raise ValueError("the host's own error")

    with pytest.raises(ValueError, match="the host's own error"):
        guarded_compression(runtime, Strategy.DETACH_DB, agent, _messages(), host)


@pytest.mark.parametrize("written", [True, False])
def test_an_error_before_the_guard_looked_follows_whether_hermes_wrote_in_place(
    runtime: Runtime, db: Any, written: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(db, Engine())
    agent.rotate_on_compress = False
    agent.in_place_write_fails = not written
    monkeypatch.setattr(compression, "_no_progress", _boom)
    out, calls = _run(runtime, agent, Strategy.HOST_IN_PLACE)
    assert calls == [1] and len(out) == (3 if written else 10)
    assert _last(runtime)["event"] == ("compression.done" if written else "compression.failed")
