"""What the guard's own storage does when SQLite refuses a write, without Hermes:
the real error is reported, nothing stays half-open, a read-only file is still
read, and writing resumes by itself once the fault is gone; a lease that could
not be released is released before the next compression of its session; the
audit log says once that it cannot write."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import host
from hermes_session_guard.audit import AuditLog, read_events
from hermes_session_guard.locks.session_lock import GuardLeases, LockGrant, LockUnavailable, SessionLocks
from hermes_session_guard.store import GuardStore

SID = "20260528_155201_68dc5996"
BIG = [{"role": "user", "content": "x" * 200_000}]


@pytest.fixture
def store(tmp_path: Path) -> GuardStore:
    s = GuardStore(tmp_path / "state.db", timeout=0.2)
    s.has_snapshots(SID)
    yield s
    s.close()


def _cap_size(store: GuardStore, pages: int | None = None) -> None:
    with store.reading() as conn:
        n = pages if pages is not None else conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count={n}")


def test_a_full_database_is_reported_as_full_and_the_store_writes_again(store: GuardStore) -> None:
    _cap_size(store)
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        store.write_snapshot(snapshot_id="s1", session_id=SID, messages=BIG)
    with store.reading() as conn:
        assert not conn.in_transaction
    assert store.list_snapshots(SID) == []  # nothing half-written
    _cap_size(store, 1073741823)
    store.write_snapshot(snapshot_id="s2", session_id=SID, messages=BIG)
    assert [s.snapshot_id for s in store.list_snapshots(SID)] == ["s2"]


def test_a_failed_commit_leaves_no_open_transaction(store: GuardStore) -> None:
    class Refusing:
        """The connection, except that COMMIT fails as it does on a full disk."""

        def __init__(self, conn: sqlite3.Connection) -> None:
            self.conn = conn

        def execute(self, sql: str, *args: Any) -> Any:
            if sql == "COMMIT":
                raise sqlite3.OperationalError("database or disk is full")
            return self.conn.execute(sql, *args)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.conn, name)

    real = store._conn
    store._conn = Refusing(real)  # type: ignore[assignment]
    with pytest.raises(sqlite3.OperationalError, match="full"):
        store.try_acquire_lease(SID, "h1", 60)
    store._conn = real
    assert not real.in_transaction
    assert store.lease_holder(SID) is None
    assert store.try_acquire_lease(SID, "h2", 60)


def test_a_read_only_file_is_read_and_written_again_once_writable(
    store: GuardStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.write_snapshot(snapshot_id="s1", session_id=SID, messages=[{"role": "user", "content": "kept"}])
    store.close()
    real_connect = sqlite3.connect
    path = str(store.db_path)

    def read_only(database: Any, *args: Any, **kwargs: Any) -> Any:
        if database == path:
            return real_connect(f"{store.db_path.as_uri()}?mode=ro", *args, **{**kwargs, "uri": True})
        return real_connect(database, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(sqlite3, "connect", read_only)
        assert store.has_snapshots(SID)  # opened read-only: still readable
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            store.try_acquire_lease(SID, "h1", 60)
    # writable again: the next write reconnects by itself
    assert store.try_acquire_lease(SID, "h1", 60)
    assert store.lease_holder(SID) == "h1"


def test_a_lease_that_could_not_be_released_is_released_before_the_next_acquire(
    store: GuardStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    locks, leases = SessionLocks(keeper=False), GuardLeases(store)
    first = locks.acquire(SID, "op1", wait_seconds=0, lease_seconds=300, lease=leases)
    assert isinstance(first, LockGrant)

    def refused(*args: Any, **kwargs: Any) -> bool:
        raise sqlite3.OperationalError("database is locked")

    with monkeypatch.context() as patch:
        patch.setattr(store, "release_lease", refused)
        first.release()
        assert store.lease_holder(SID) == first.holder and locks.held_sessions() == []
        # still refused: the next acquire says why instead of waiting on its own old lease
        with pytest.raises(LockUnavailable, match="could not be released: database is locked"):
            locks.acquire(SID, "op2", wait_seconds=5, lease_seconds=300, lease=leases)
    second = locks.acquire(SID, "op3", wait_seconds=0, lease_seconds=300, lease=leases)
    assert isinstance(second, LockGrant) and store.lease_holder(SID) == second.holder
    second.release()


class NativeDB:
    """Hermes's compression-lock API as 0.19 has it: database errors are logged and
    answered with False (acquire) or nothing (release)."""

    def __init__(self) -> None:
        self.rows: dict[str, str] = {}
        self.refuse = False
        self.acquires = 0

    def try_acquire_compression_lock(self, sid: str, holder: str, ttl_seconds: float = 300.0) -> bool:
        self.acquires += 1
        if self.refuse:
            return False
        return self.rows.setdefault(sid, holder) == holder

    def release_compression_lock(self, sid: str, holder: str) -> None:
        if not self.refuse and self.rows.get(sid) == holder:
            del self.rows[sid]

    def refresh_compression_lock(self, sid: str, holder: str, ttl_seconds: float = 300.0) -> bool:
        return self.rows.get(sid) == holder

    def get_compression_lock_holder(self, sid: str) -> str | None:
        return self.rows.get(sid)


def test_hermes_refusing_its_lock_write_is_unavailable_not_busy() -> None:
    db = NativeDB()
    leases = host.NativeLeases(db)
    db.rows[SID] = "someone else"
    assert leases.try_acquire(SID, "me", 60) is False  # a real holder: busy
    del db.rows[SID]
    db.refuse = True
    with pytest.raises(RuntimeError, match="nobody holds it"):
        leases.try_acquire(SID, "me", 60)
    assert db.acquires == 3  # asked twice, not polled for the whole wait


def test_hermes_swallowing_a_failed_release_is_a_failed_release() -> None:
    db = NativeDB()
    leases = host.NativeLeases(db)
    assert leases.try_acquire(SID, "me", 60)
    db.refuse = True
    with pytest.raises(RuntimeError, match="could not release"):
        leases.release(SID, "me")
    db.refuse = False
    leases.release(SID, "me")
    assert db.rows == {}


def test_an_unwritable_audit_log_says_so_once_and_when_it_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "logs" / "audit.jsonl"
    target.parent.mkdir()
    target.mkdir()  # a directory where the file should be: every append fails
    log = AuditLog(target)
    with caplog.at_level(logging.WARNING, logger="hermes_session_guard"):
        for i in range(5):
            log.operation(SID, f"op{i}").info("compression.started")
        target.rmdir()
        log.operation(SID, "op9").info("compression.started")
    failed = [r for r in caplog.records if "audit write failed" in r.getMessage()]
    recovered = [r for r in caplog.records if "is writable again" in r.getMessage()]
    assert len(failed) == 1 and len(recovered) == 1
    assert "5 event(s)" in recovered[0].getMessage()
    assert [e["op_id"] for e in read_events(target)] == ["op9"]


def _fake_hermes_state(monkeypatch: pytest.MonkeyPatch, failures: int) -> list[Path]:
    """A stand-in ``hermes_state`` whose SessionDB fails to open ``failures`` times."""
    import sys
    import types

    opened: list[Path] = []

    class SessionDB:
        def __init__(self, db_path: Path) -> None:
            opened.append(db_path)
            if len(opened) <= failures:
                raise sqlite3.OperationalError("vtable constructor failed: messages_fts")

    monkeypatch.setitem(sys.modules, "hermes_state", types.SimpleNamespace(SessionDB=SessionDB))
    monkeypatch.setattr(host.statedb.time, "sleep", lambda _s: None)
    return opened


def test_an_open_racing_another_openers_schema_check_is_retried(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    opened = _fake_hermes_state(monkeypatch, failures=2)
    with caplog.at_level(logging.WARNING, logger="hermes_session_guard"):
        db = host.open_session_db(tmp_path / "state.db")
    assert db is not None and len(opened) == 3
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 2 and "OperationalError" in retries[0]


def test_an_open_that_keeps_failing_raises_the_hosts_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    opened = _fake_hermes_state(monkeypatch, failures=99)
    with pytest.raises(sqlite3.OperationalError, match="vtable constructor failed"):
        host.open_session_db(tmp_path / "state.db")
    assert len(opened) == host.statedb._OPEN_ATTEMPTS


class _Compressor:
    def __init__(self, until: float, error: str | None) -> None:
        self._summary_failure_cooldown_until, self._last_summary_error = until, error


class _CompressingAgent:
    def __init__(self, until: float, error: str | None) -> None:
        self.context_compressor = _Compressor(until, error)


def test_a_split_failure_cooldown_armed_during_the_compaction_is_a_failed_commit() -> None:
    """0.22 hands the list back and arms its cooldown when its commit fails: armed after the
    mark was read, with that failure class, it is a failed commit; armed before, or by
    another failure, it is not."""
    armed = _CompressingAgent(100.0, "session_split_failed: database is locked")
    assert host.commit_failed_since(armed, 0.0)
    assert not host.commit_failed_since(armed, 100.0)  # it was running before the compaction
    assert not host.commit_failed_since(_CompressingAgent(100.0, "summary_timeout: 600s"), 0.0)
    assert not host.commit_failed_since(object(), 0.0)  # a release without the cooldown
    assert host.failure_cooldown_mark(object()) == 0.0


def test_the_cooldown_is_named_by_its_failure_class_never_by_the_errors_text() -> None:
    assert host.failure_cooldown_class(_CompressingAgent(1.0, "session_split_failed: disk is full")) \
        == "session_split_failed"
    assert host.failure_cooldown_class(_CompressingAgent(1.0, "Summary failed: the user said 'secret'")) \
        == "an earlier failure"
    assert host.failure_cooldown_class(_CompressingAgent(1.0, None)) is None
