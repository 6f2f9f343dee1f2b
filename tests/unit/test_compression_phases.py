"""While a guarded compression runs, its session is in ``runtime.compressing`` and, from
before it waits for a lease or calls Hermes, has a ``session_guard_compressions`` row in
phase ``started`` (what the gateway's buffering reads); on every way out (done, adopted,
skipped, failed, an exception) the registry entry is gone and the row ends in the outcome."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from hermes_session_guard import audit
from hermes_session_guard.config import GuardConfig, LockConfig
from hermes_session_guard.locks.liveness import DEAD, holder_liveness, this_process
from hermes_session_guard.locks.session_lock import GuardLeases, LockGrant, holder_id
from hermes_session_guard.runtime import Runtime
from hermes_session_guard.seam_behaviour import Strategy
from hermes_session_guard.seams.compression import guarded_compression
from hermes_session_guard.store import GuardStore

from .test_compression_contract import Agent, Engine


@pytest.fixture
def runtime(tmp_path: Path) -> Any:
    rt = Runtime(config=replace(GuardConfig(), lock=LockConfig(wait_seconds=0.05)), host_version="test",
                 fixed_home=tmp_path)
    yield rt
    rt.close()


def _messages(n: int = 10) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(n)]


def _op_ids(rt: Runtime) -> list[str]:
    return list(dict.fromkeys(e["op_id"] for e in audit.read_events(rt.audit_path) if e.get("op_id")))


class Observing:
    """Runs the host and records what the buffering seam would see meanwhile."""

    def __init__(self, rt: Runtime, store: GuardStore, host: Any) -> None:
        self.rt, self.store, self.host = rt, store, host
        self.seen: list[tuple[str | None, str | None]] = []
        self.rows: list[dict[str, Any]] = []  # the operation's phase row, as Hermes is called

    def __call__(self) -> Any:
        self.seen.append((self.rt.compressing.op_for("S1"), self.store.compression_in_flight("S1", 300)))
        self.rows.extend(self.store.compressions("S1")[-1:])
        return self.host()


def _assert_ended(rt: Runtime, store: GuardStore, phase: str) -> dict[str, Any]:
    assert rt.compressing.op_for("S1") is None and rt.compressing.sessions() == []
    assert store.compression_in_flight("S1", 300) is None
    row = store.compressions("S1")[-1]
    assert row["phase"] == phase and row["finished_at"] is not None
    assert row["op_id"] == _op_ids(rt)[-1]
    return row


@pytest.mark.parametrize("strategy", [Strategy.DETACH_DB, Strategy.HOST_IN_PLACE])
def test_done(runtime: Runtime, db: Any, strategy: str) -> None:
    agent = Agent(db, Engine())
    agent.rotate_on_compress = strategy == Strategy.DETACH_DB
    messages = _messages()
    store = runtime.store_for(db.db_path)
    host = Observing(runtime, store, lambda: agent._compress_context(messages, "s"))
    out, _ = guarded_compression(runtime, strategy, agent, messages, host)
    (op,) = _op_ids(runtime)
    assert host.seen == [(op, op)]
    row = _assert_ended(runtime, store, "done")
    assert row["messages_before"] == 10 and row["messages_after"] == len(out) == 3
    # when Hermes is called the row holds the start, the lock and the summary's start (one write
    # with the start when nothing is waited for); the outcome adds the end
    (running,) = host.rows
    assert running["phase"] == "started" and running["finished_at"] is None
    assert running["started_at"] <= running["lock_acquired_at"] <= running["summary_started_at"]
    assert (running["started_at"], running["summary_started_at"]) == (row["started_at"], row["summary_started_at"])
    assert row["summary_started_at"] <= row["summary_finished_at"] <= row["finished_at"]
    assert row["snapshot_id"] == store.list_snapshots("S1")[0].snapshot_id


def test_failed_summary(runtime: Runtime, db: Any) -> None:
    agent = Agent(db, Engine(fail="HTTP 500"))
    messages = _messages()
    store = runtime.store_for(db.db_path)
    host = Observing(runtime, store, lambda: agent._compress_context(messages, "s"))
    guarded_compression(runtime, Strategy.DETACH_DB, agent, messages, host)
    assert len(host.seen) == 1 and host.seen[0][0] is not None
    row = _assert_ended(runtime, store, "failed")
    assert "HTTP 500" in row["detail"]


def test_no_progress_is_skipped(runtime: Runtime, db: Any) -> None:
    agent = Agent(db, Engine())
    messages = _messages()
    store = runtime.store_for(db.db_path)
    guarded_compression(runtime, Strategy.DETACH_DB, agent, messages,
                        Observing(runtime, store, lambda: (messages, "s")))
    _assert_ended(runtime, store, "skipped")


def test_persistence_failure(runtime: Runtime, db: Any) -> None:
    db.replace_messages.side_effect = OSError("disk full")
    agent = Agent(db, Engine())
    messages = _messages()
    store = runtime.store_for(db.db_path)
    guarded_compression(runtime, Strategy.DETACH_DB, agent, messages, lambda: agent._compress_context(messages, "s"))
    assert "disk full" in _assert_ended(runtime, store, "failed")["detail"]


def test_host_exception(runtime: Runtime, db: Any) -> None:
    agent = Agent(db, Engine())
    store = runtime.store_for(db.db_path)

    def boom() -> Any:
        raise KeyboardInterrupt  # not an Exception: the finally must still run

    with pytest.raises(KeyboardInterrupt):
        guarded_compression(runtime, Strategy.DETACH_DB, agent, _messages(), Observing(runtime, store, boom))
    _assert_ended(runtime, store, "failed")


def test_busy_lock_is_skipped(runtime: Runtime, db: Any) -> None:
    store = runtime.store_for(db.db_path)
    held = runtime.locks_for(db.db_path).acquire("S1", "winner", wait_seconds=0, lease_seconds=60,
                                                 lease=GuardLeases(store))
    assert isinstance(held, LockGrant)
    try:
        agent = Agent(db, Engine())
        messages = _messages()
        calls: list[int] = []
        guarded_compression(runtime, Strategy.DETACH_DB, agent, messages, lambda: calls.append(1) or ([], ""))
    finally:
        held.release()
    assert calls == []
    assert "holds this session's compression lock" in _assert_ended(runtime, store, "skipped")["detail"]


def test_adopted(runtime: Runtime, db: Any) -> None:
    agent = Agent(db, Engine())
    messages = _messages()
    out, _ = guarded_compression(runtime, Strategy.DETACH_DB, agent, messages,
                                 lambda: agent._compress_context(messages, "s"))
    db.get_messages_as_conversation.return_value = [dict(m) for m in out]
    stale = [*[dict(m) for m in messages], {"role": "user", "content": "late"}]
    other = Agent(db, Engine())
    calls: list[int] = []
    guarded_compression(runtime, Strategy.DETACH_DB, other, stale, lambda: calls.append(1) or ([], ""))
    store = runtime.store_for(db.db_path)
    assert calls == []
    row = _assert_ended(runtime, store, "adopted")
    assert row["messages_after"] == len(out) + 1
    assert [r["phase"] for r in store.compressions("S1")] == ["done", "adopted"]
    # it took the lock and ended before any summary: the lock time is still recorded (status's lock wait)
    assert row["summary_started_at"] is None and row["started_at"] <= row["lock_acquired_at"] <= row["finished_at"]


def test_a_phase_write_failure_does_not_fail_the_compression(
    runtime: Runtime, db: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(GuardStore, "begin_compression", broken)
    monkeypatch.setattr(GuardStore, "set_compression_phase", broken)
    agent = Agent(db, Engine())
    messages = _messages()
    store = runtime.store_for(db.db_path)
    host = Observing(runtime, store, lambda: agent._compress_context(messages, "s"))
    with caplog.at_level("WARNING", logger="hermes_session_guard"):
        out, _ = guarded_compression(runtime, Strategy.DETACH_DB, agent, messages, host)
    assert len(out) == 3 and agent.session_id == "S1"
    (op,) = _op_ids(runtime)
    assert host.seen == [(op, None)]  # the in-process registry still says so
    assert runtime.compressing.op_for("S1") is None
    # said once for the operation, although both of its phase writes failed
    assert sum("could not record the compression phase" in r.getMessage() for r in caplog.records) == 1
    done = [e for e in audit.read_events(runtime.audit_path) if e.get("event") == "compression.done"]
    assert done[-1]["phase_row"] == "not recorded: OSError: disk full"


def test_done_records_its_phase_times_and_summary_length(runtime: Runtime, db: Any) -> None:
    agent = Agent(db, Engine())
    messages = _messages()
    guarded_compression(runtime, Strategy.DETACH_DB, agent, messages, lambda: agent._compress_context(messages, "s"))
    row = _assert_ended(runtime, runtime.store_for(db.db_path), "done")
    assert row["strategy"] == Strategy.DETACH_DB and row["holder"].startswith("pid=")
    times = [row[k] for k in ("started_at", "lock_acquired_at", "summary_started_at", "summary_finished_at",
                              "finished_at")]
    assert None not in times and times == sorted(times)
    assert row["summary_chars"] and row["summary_chars"] > 0


def test_a_dead_process_compression_is_recorded_interrupted_by_the_next(runtime: Runtime, db: Any) -> None:
    store = runtime.store_for(db.db_path)
    me = this_process()
    gone = next(pid for pid in range(4_000_000, 4_100_000) if not psutil.pid_exists(pid))
    dead = f"pid={gone}:tid=1:guard-op=deadop:nonce=x:{replace(me, pid=gone).fields()}"
    assert holder_liveness(dead) == DEAD
    store.begin_compression("deadop", "S1", 10, holder=dead, strategy=Strategy.DETACH_DB)
    store.begin_compression("liveop", "S1", 10, holder=holder_id("liveop"), strategy=Strategy.DETACH_DB)
    store.begin_compression("otherop", "S1", 10, holder=None, strategy=Strategy.DETACH_DB)  # unknown: left alone
    agent = Agent(db, Engine())
    messages = _messages()
    guarded_compression(runtime, Strategy.DETACH_DB, agent, messages, lambda: agent._compress_context(messages, "s"))
    phases = {r["op_id"]: (r["phase"], r["finished_at"]) for r in store.compressions("S1")}
    assert phases["deadop"] == ("interrupted", None)
    assert phases["liveop"] == ("started", None) and phases["otherop"] == ("started", None)
    assert store.compression_in_flight("S1", 300) in ("liveop", "otherop")
    found = [e for e in audit.read_events(runtime.audit_path) if e.get("event") == "compression.interrupted_found"]
    assert [e["interrupted_op_id"] for e in found] == ["deadop"]


def _native_op(runtime: Runtime, db: Any) -> Any:
    from hermes_session_guard.seam_behaviour import Behaviour
    from hermes_session_guard.seams.compression import _Operation

    agent = Agent(db, Engine())
    agent.rotate_on_compress = False
    return _Operation(runtime, Strategy.HOST_NATIVE, agent, "S1", _messages(), lambda: ([], ""), None, None,
                      Behaviour.of(None))


def test_a_row_first_written_at_the_summary_start_holds_the_start_too(runtime: Runtime, db: Any) -> None:
    # native mode waits for nothing before it calls Hermes: the row is written once, then
    op = _native_op(runtime, db)
    store = runtime.store_for(db.db_path)
    assert store.compressions("S1") == []
    op.begin(summary_started_at=op.started_wall + 0.5)
    (row,) = store.compressions("S1")
    assert (row["op_id"], row["phase"], row["strategy"]) == (op.op_id, "started", Strategy.HOST_NATIVE)
    assert (row["started_at"], row["summary_started_at"]) == (op.started_wall, op.started_wall + 0.5)
    assert store.compression_in_flight("S1", 300) == op.op_id
    op.begin(lock_acquired_at=op.started_wall + 0.25)  # a later step updates the same row
    (row,) = store.compressions("S1")
    assert row["lock_acquired_at"] == op.started_wall + 0.25 and row["summary_started_at"] == op.started_wall + 0.5


def test_an_operation_ending_before_it_wrote_its_row_writes_it_with_the_outcome(runtime: Runtime, db: Any) -> None:
    op = _native_op(runtime, db)
    store = runtime.store_for(db.db_path)
    op.write_outcome(op.outcome("adopted", after=4))
    (row,) = store.compressions("S1")
    assert (row["phase"], row["messages_before"], row["messages_after"]) == ("adopted", 10, 4)
    assert row["started_at"] == op.started_wall <= row["finished_at"] and row["summary_started_at"] is None
    assert store.compression_in_flight("S1", 300) is None
