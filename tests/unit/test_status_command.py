"""``status``: locks with holders and ages, snapshots, compressions and buffered messages per session."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.commands import cli
from hermes_session_guard.hooks.manager import get_plugin_manager
from hermes_session_guard.hooks.specs import BufferTable, LockTable, hookimpl
from hermes_session_guard.inbox.repository import Inbox
from hermes_session_guard.store import GuardStore

from .hermes_like_db import HermesLikeHome
from .inbox_steps import dispatch_next


@pytest.fixture
def home(tmp_path: Path) -> HermesLikeHome:
    h = HermesLikeHome(tmp_path / "h")
    h.session("s1", 1.0)
    h.messages("s1", ["q", "a", "q2"], 10.0)
    h.session("s2", 1.0)
    now = time.time()
    h.lock("s1", "pid=7:tid=1", acquired=now - 30, expires=now + 270)
    h.lock("s2", "pid=9:tid=2", acquired=now - 900, expires=now - 600)
    h.close()
    store = GuardStore(h.db_path)
    store.write_snapshot(snapshot_id="s1.snapshot.1", session_id="s1", messages=[{"role": "user", "content": "q"}])
    store.write_snapshot(snapshot_id="s1.snapshot.2", session_id="s1", messages=[{"role": "user", "content": "q"}])
    store.close()
    log = h.home / "logs" / "session_guard.jsonl"
    log.parent.mkdir()
    events = [("compression.started", "s1"), ("compression.done", "s1"), ("compression.done", "s1"),
              ("compression.skipped", "s2"), ("compression.failed", "s1"), ("guard.installed", None)]
    log.write_text("".join(json.dumps({"event": e, "session_id": s, "op_id": "x"}) + "\n" for e, s in events)
                   + "not json\n", encoding="utf-8")
    return h


def test_status_json(home: HermesLikeHome, monkeypatch: pytest.MonkeyPatch,
                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HERMES_HOME", str(home.home))
    assert cli.main(["status", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    locks = {lk["session_id"]: lk for lk in report["locks"]}
    assert locks["s1"]["holder"] == "pid=7:tid=1" and not locks["s1"]["expired"]
    assert 25 <= locks["s1"]["age_seconds"] <= 60 and locks["s1"]["expires_in_seconds"] > 200
    assert locks["s2"]["expired"] and locks["s2"]["age_seconds"] >= 900
    sessions = {s["session_id"]: s for s in report["sessions"]}
    assert sessions["s1"]["compressions"] == {"done": 2, "skipped": 0, "failed": 1}
    assert sessions["s1"]["snapshots"] == 2 and sessions["s1"]["live_messages"] == 3
    assert sessions["s2"]["compressions"] == {"done": 0, "skipped": 1, "failed": 0}
    # Hermes's native table, and the guard's own lease table and inbox (created with its store)
    assert report["lock_tables"] == ["compression_locks", "session_guard_locks"]
    assert report["buffer_tables"] == ["session_guard_inbox"]
    assert sessions["s1"]["buffered"] == 0 and sessions["s2"]["buffered"] == 0


def test_status_text(home: HermesLikeHome, monkeypatch: pytest.MonkeyPatch,
                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HERMES_HOME", str(home.home))
    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    assert "s1  native  holder=pid=7:tid=1" in out and "EXPIRED" in out
    assert "s1  compressions=2/0/1  snapshots=2  buffered=0" in out
    assert "no buffer table" not in out


def test_status_text_without_the_guards_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    h = HermesLikeHome(tmp_path / "bare")
    h.session("s1", 1.0)
    h.close()
    monkeypatch.setenv("HERMES_HOME", str(h.home))
    assert cli.main(["status"]) == 0
    assert "no buffer table" in capsys.readouterr().out


def test_status_counts_the_guards_buffered_messages(home: HermesLikeHome, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    inbox = Inbox(GuardStore(home.db_path))
    for text in ("one", "two", "three"):
        inbox.append(session_key="k1", session_id="s1", op_id="op", payload={"text": text}, text=text)
    inbox.append(session_key="k3", session_id="s3", op_id="op3", payload={"text": "x"}, text="x")
    first = dispatch_next(inbox, "k1", owner="runner")
    assert first is not None and first.text == "one"
    third = inbox.entries("k1")[2]
    inbox.mark_delivered([third.seq])  # delivered: no longer counted
    inbox.store.close()
    monkeypatch.setenv("HERMES_HOME", str(home.home))
    assert cli.main(["status", "--json"]) == 0
    sessions = {s["session_id"]: s for s in json.loads(capsys.readouterr().out)["sessions"]}
    # buffered + dispatched (handed to the gateway, turn not finished) count; delivered does not
    assert sessions["s1"]["buffered"] == 2 and sessions["s3"]["buffered"] == 1
    assert not sessions["s3"]["exists"]
    assert cli.main(["status"]) == 0
    assert "s1  compressions=2/0/1  snapshots=2  buffered=2" in capsys.readouterr().out


class _ExtraTables:
    @hookimpl
    def session_guard_lock_tables(self) -> list[LockTable]:
        return [LockTable(kind="guard", table="session_guard_test_locks", acquired_column="taken_at")]

    @hookimpl
    def session_guard_buffer_tables(self) -> list[BufferTable]:
        return [BufferTable(table="session_guard_test_inbox", pending_where="delivered_at IS NULL")]


def test_lock_and_buffer_tables_added_through_hooks(home: HermesLikeHome, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    conn = sqlite3.connect(str(home.db_path))
    conn.execute("CREATE TABLE session_guard_test_locks (session_id TEXT, holder TEXT, taken_at REAL,"
                 " expires_at REAL)")
    conn.execute("INSERT INTO session_guard_test_locks VALUES ('s2', 'guard-holder', 1.0, 2.0)")
    conn.execute("CREATE TABLE session_guard_test_inbox (session_id TEXT, body TEXT, delivered_at REAL)")
    conn.executemany("INSERT INTO session_guard_test_inbox VALUES (?,?,?)",
                     [("s1", "a", None), ("s1", "b", None), ("s1", "c", 5.0)])
    conn.commit()
    conn.close()
    pm = get_plugin_manager()
    plugin: Any = _ExtraTables()
    pm.register(plugin, name="test-extra-tables")
    try:
        monkeypatch.setenv("HERMES_HOME", str(home.home))
        assert cli.main(["status", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert {lk["kind"] for lk in report["locks"]} == {"native", "guard"}
        assert {s["session_id"]: s["buffered"] for s in report["sessions"]}["s1"] == 2
        assert cli.main(["doctor", "--json"]) == 1
        found = json.loads(capsys.readouterr().out)["findings"]
        assert {(f["session_id"], f["extra"]["kind"]) for f in found} == {("s2", "native"), ("s2", "guard")}
    finally:
        pm.unregister(plugin)


def test_the_guards_own_leases_are_listed_and_reported(home: HermesLikeHome, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    store = GuardStore(home.db_path)
    assert store.try_acquire_lease("s1", "pid=5:tid=1:guard-op=live", 300.0, now=now)
    assert store.try_acquire_lease("s3", "pid=6:tid=1:guard-op=dead", 60.0, now=now - 3600)
    store.close()
    monkeypatch.setenv("HERMES_HOME", str(home.home))
    assert cli.main(["status", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    guard = {lk["session_id"]: lk for lk in report["locks"] if lk["kind"] == "guard"}
    assert set(guard) == {"s1", "s3"} and {lk["table"] for lk in guard.values()} == {"session_guard_locks"}
    assert not guard["s1"]["expired"] and guard["s1"]["holder"] == "pid=5:tid=1:guard-op=live"
    assert guard["s3"]["expired"]
    assert cli.main(["doctor", "--json"]) == 1
    found = json.loads(capsys.readouterr().out)["findings"]
    expired = {(f["session_id"], f["extra"]["kind"], f["extra"]["table"]) for f in found
               if f["signature"] == "expired_compression_lock"}
    assert expired == {("s2", "native", "compression_locks"), ("s3", "guard", "session_guard_locks")}


def _gone_holder() -> str:
    import psutil

    from hermes_session_guard.locks.liveness import this_process

    me = this_process()
    gone = next(pid for pid in range(4_000_000, 4_100_000) if not psutil.pid_exists(pid))
    return f"pid={gone}:tid=1:guard-op=x:nonce=x:{replace(me, pid=gone).fields()}"


def test_status_session_lists_each_compaction(home: HermesLikeHome, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from hermes_session_guard.locks.session_lock import holder_id

    store = GuardStore(home.db_path)
    store.begin_compression("op-done", "s1", 12, holder=holder_id("op-done"), strategy="detach_db")
    for step in ("lock_acquired_at", "summary_started_at", "summary_finished_at"):
        store.mark_compression_steps("op-done", **{step: None})
    store.set_compression_phase("op-done", "done", snapshot_id="s1.snapshot.1", messages_after=4, summary_chars=321,
                                finished=True)
    store.begin_compression("op-failed", "s1", 14, holder=holder_id("op-failed"), strategy="detach_db")
    store.set_compression_phase("op-failed", "failed", detail="summary model: HTTP 500", finished=True)
    store.begin_compression("op-killed", "s1", 15, holder=_gone_holder(), strategy="detach_db")
    store.mark_compression_steps("op-killed", summary_started_at=None)
    store.begin_compression("op-running", "s1", 16, holder=holder_id("op-running"), strategy="detach_db")
    store.begin_compression("op-other", "s2", 3)
    store.close()
    monkeypatch.setenv("HERMES_HOME", str(home.home))
    assert cli.main(["status", "--session", "s1", "--json"]) == 0
    (s1,) = json.loads(capsys.readouterr().out)["sessions"]
    records = {r["op_id"]: r for r in s1["compactions"]}
    assert list(records) == ["op-done", "op-failed", "op-killed", "op-running"]
    done = records["op-done"]
    assert (done["outcome"], done["messages_before"], done["messages_after"], done["summary_chars"],
            done["snapshot_id"], done["strategy"]) == ("done", 12, 4, 321, "s1.snapshot.1", "detach_db")
    assert None not in (done["lock_wait_ms"], done["summary_ms"], done["duration_ms"], done["finished_at"])
    assert (records["op-failed"]["outcome"], records["op-failed"]["reason"]) == ("failed", "summary model: HTTP 500")
    killed = records["op-killed"]
    assert killed["outcome"] == "interrupted" and killed["finished_at"] is None
    assert killed["summary_started_at"] is not None and killed["summary_finished_at"] is None
    assert records["op-running"]["outcome"] == "running"

    assert cli.main(["status", "--session", "s1"]) == 0
    text = capsys.readouterr().out
    assert "compactions recorded: 4" in text
    assert "op op-killed  INTERRUPTED" in text and "op op-done  DONE" in text and "snapshot s1.snapshot.1" in text

    assert cli.main(["status", "--json"]) == 0  # the whole home: counts, not every record
    assert all("compactions" not in s for s in json.loads(capsys.readouterr().out)["sessions"])


def test_an_earlier_layout_gains_the_phase_columns(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE session_guard_compressions (op_id TEXT PRIMARY KEY, session_id TEXT NOT NULL,"
                 " snapshot_id TEXT, phase TEXT NOT NULL, started_at REAL NOT NULL, finished_at REAL,"
                 " messages_before INTEGER, messages_after INTEGER, detail TEXT)")
    conn.execute("INSERT INTO session_guard_compressions(op_id, session_id, phase, started_at)"
                 " VALUES ('old', 's', 'done', 1.0)")
    conn.commit()
    conn.close()
    store = GuardStore(db)
    store.begin_compression("new", "s", 3, holder="pid=1", strategy="host_native")
    store.mark_compression_steps("new", summary_started_at=5.0)
    rows = {r["op_id"]: r for r in store.compressions("s")}
    store.close()
    assert rows["old"]["phase"] == "done" and rows["old"]["strategy"] is None
    assert (rows["new"]["strategy"], rows["new"]["summary_started_at"]) == ("host_native", 5.0)
