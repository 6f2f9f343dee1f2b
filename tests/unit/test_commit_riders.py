"""The guard's rows carried by Hermes's own write transactions (store.connection.Rider,
the ``host_commit`` seam of 0.20+): committed with Hermes's, rolled back with it, and a
failure of the guard's own write never fails Hermes's."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import audit
from hermes_session_guard.hostinfo import parse_version
from hermes_session_guard.seams.compression_entry import host_commit_wrapper
from hermes_session_guard.seams.table import select_row
from hermes_session_guard.store import GuardStore
from hermes_session_guard.store.connection import board, compaction_commit, take_riders


@pytest.fixture
def store(tmp_path: Path) -> Iterator[GuardStore]:
    guard = GuardStore(tmp_path / "state.db")
    guard.unfinished_compressions("S")  # creates the guard's tables
    yield guard
    guard.close()


class Host:
    """Hermes's write path, as ``SessionDB._execute_write`` runs it: BEGIN IMMEDIATE, the
    callback, COMMIT; rolled back and raised on an error; retried once on ``retry``."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.conn.execute("CREATE TABLE IF NOT EXISTS host_rows(text TEXT)")
        self.retry = False

    def _execute_write(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        for attempt in (1, 2):
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(self.conn)
                if self.retry and attempt == 1:
                    raise sqlite3.OperationalError("database is locked")
                self.conn.execute("COMMIT")
                return result
            except sqlite3.OperationalError:
                self.conn.execute("ROLLBACK")
                if not self.retry or attempt == 2:
                    raise
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
        raise AssertionError("unreachable")

    def texts(self) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT text FROM host_rows")]


def _write(wrapper: Any, host: Host, text: str, fail: bool = False) -> Any:
    def fn(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO host_rows VALUES (?)", (text,))
        if fail:
            raise sqlite3.IntegrityError("the host's own write failed")
        return text

    return wrapper(host._execute_write, host, (fn,), {})


def _wrapper() -> Any:
    row = select_row("host_commit", parse_version("0.22.2"))
    assert row is not None and row.wrapper is not None
    return host_commit_wrapper(None, row)  # type: ignore[arg-type]  # the wrapper reads no runtime


def _begin(store: GuardStore, op_id: str) -> Callable[[], None]:
    return lambda: store.begin_compression(op_id, "S", 3, started_at=1.0)


def _ops(store: GuardStore) -> list[str]:
    with store.reading() as conn:
        return [r[0] for r in conn.execute("SELECT op_id FROM session_guard_compressions ORDER BY op_id")]


def test_rows_ride_the_next_host_commit_and_commit_with_it(store: GuardStore, tmp_path: Path) -> None:
    host, wrapper = Host(tmp_path / "state.db"), _wrapper()
    rider = board(store, "a row", _begin(store, "op1"))
    assert _write(wrapper, host, "a") == "a"
    assert rider.alight() and rider.state == "committed"
    assert _ops(store) == ["op1"] and host.texts() == ["a"]
    # it rode once: the next commit carries nothing
    assert _write(wrapper, host, "b") == "b" and _ops(store) == ["op1"]


def test_rows_are_rolled_back_with_a_host_transaction_that_fails(store: GuardStore, tmp_path: Path) -> None:
    host, wrapper = Host(tmp_path / "state.db"), _wrapper()
    rider = board(store, "a row", _begin(store, "op1"))
    with pytest.raises(sqlite3.IntegrityError):
        _write(wrapper, host, "a", fail=True)
    assert not rider.alight() and rider.state == "rolled_back"
    assert _ops(store) == [] and host.texts() == []


def test_a_failing_guard_write_rolls_back_only_its_own_rows(store: GuardStore, tmp_path: Path) -> None:
    host, wrapper = Host(tmp_path / "state.db"), _wrapper()

    def broken() -> None:
        store.begin_compression("op1", "S", 3, started_at=1.0)
        raise RuntimeError("the guard's write failed")

    rider = board(store, "a row", broken)
    assert _write(wrapper, host, "a") == "a"  # Hermes's transaction committed as it would alone
    assert host.texts() == ["a"] and _ops(store) == []
    assert not rider.alight() and rider.state == "failed"


def test_riders_that_cannot_board_hermes_write_are_told_so_and_hermes_writes_alone(
    store: GuardStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host_commit wrapper's own fallback (not the envelope's): the riders it took off the
    thread are rolled back, so their owner writes them on its own, and Hermes's write runs as given."""
    from hermes_session_guard.seams import compression_entry

    def broken(*args: Any) -> Any:
        raise RuntimeError("carrying failed")

    monkeypatch.setattr(compression_entry, "carry", broken)
    host, wrapper = Host(tmp_path / "state.db"), _wrapper()
    rider = board(store, "a row", _begin(store, "op1"))
    assert _write(wrapper, host, "a") == "a"
    assert host.texts() == ["a"] and _ops(store) == []
    assert not rider.alight() and rider.state == "rolled_back"


def test_a_retried_host_transaction_writes_the_rows_once(store: GuardStore, tmp_path: Path) -> None:
    host, wrapper = Host(tmp_path / "state.db"), _wrapper()
    host.retry = True
    rider = board(store, "a row", _begin(store, "op1"))
    assert _write(wrapper, host, "a") == "a"
    assert rider.alight() and _ops(store) == ["op1"] and host.texts() == ["a"]


def test_a_rider_no_commit_carried_is_cancelled_and_rides_no_later_one(store: GuardStore, tmp_path: Path) -> None:
    host, wrapper = Host(tmp_path / "state.db"), _wrapper()
    rider = board(store, "a row", _begin(store, "op1"))
    assert not rider.alight() and rider.state == "cancelled"
    assert take_riders() == []
    assert _write(wrapper, host, "a") == "a" and _ops(store) == []


def test_riders_wait_on_the_thread_that_boarded_them(store: GuardStore, tmp_path: Path) -> None:
    host, wrapper = Host(tmp_path / "state.db"), _wrapper()
    rider = board(store, "a row", _begin(store, "op1"))
    other = threading.Thread(target=_write, args=(wrapper, host, "elsewhere"))
    other.start()
    other.join()
    assert rider.state == "waiting" and _ops(store) == []  # another thread's commit carried nothing
    assert _write(wrapper, host, "here") == "here" and rider.alight() and _ops(store) == ["op1"]


def test_the_store_writes_on_its_own_outside_a_carried_write(store: GuardStore, tmp_path: Path) -> None:
    host, wrapper = Host(tmp_path / "state.db"), _wrapper()
    seen: list[bool] = []

    def inside() -> None:
        store.begin_compression("op1", "S", 3, started_at=1.0)
        seen.append(host.conn.in_transaction)

    board(store, "a row", inside)
    _write(wrapper, host, "a")
    store.begin_compression("op2", "S", 3, started_at=2.0)  # its own transaction again
    assert seen == [True] and _ops(store) == ["op1", "op2"]


def test_a_compaction_rider_rides_only_the_compaction_commit(store: GuardStore, tmp_path: Path) -> None:
    host, wrapper = Host(tmp_path / "state.db"), _wrapper()
    rider = board(store, "a reference", _begin(store, "op1"), compaction=True)
    assert _write(wrapper, host, "heartbeat") == "heartbeat"  # an earlier commit of Hermes's carries nothing
    assert rider.state == "waiting" and _ops(store) == []
    with compaction_commit():
        assert _write(wrapper, host, "compacted") == "compacted"
    assert rider.alight() and _ops(store) == ["op1"] and host.texts() == ["heartbeat", "compacted"]


def _native(runtime: Any, db: Any) -> Any:
    from .test_native_stale_check import _op

    op = _op(runtime, db)
    op.summary_started_at = 5.0
    op.live_ids = [(1, 10)]
    return op


def _phase_rows(op: Any) -> list[tuple[str, float]]:
    with op.store.reading() as conn:
        return [(r[0], r[1]) for r in conn.execute(
            "SELECT phase, summary_started_at FROM session_guard_compressions WHERE op_id = ?", (op.op_id,))]


def test_a_phase_row_no_commit_carried_is_written_before_the_summary(runtime: Any, db: Any, mocker: Any) -> None:
    from hermes_session_guard import host

    op = _native(runtime, db)
    op.steps.row_rider = board(op.store, "the phase row", lambda: op.write_row(op.summary_steps()))
    mocker.patch.object(host, "live_row_ranges", return_value=[(1, 10)])
    assert op.steps.stale_under_host_lock() is False  # asked by the shim before the summary starts
    assert op.begun and _phase_rows(op) == [("started", 5.0)]
    assert take_riders() == []  # it rides no later commit


def test_a_phase_row_hermes_committed_is_not_written_again(runtime: Any, db: Any, mocker: Any) -> None:
    from hermes_session_guard import host

    op = _native(runtime, db)
    op.steps.row_rider = board(op.store, "the phase row", lambda: op.write_row(op.summary_steps()))
    _write(_wrapper(), Host(op.store.db_path), "lease")  # Hermes's commit of its lease carries it
    mocker.patch.object(host, "live_row_ranges", return_value=[(1, 10)])
    assert op.steps.stale_under_host_lock() is False
    assert op.begun and _phase_rows(op) == [("started", 5.0)]


def test_a_reference_whose_write_failed_in_hermes_commit_is_deferred(runtime: Any, db: Any) -> None:
    op = _native(runtime, db)

    def broken() -> None:
        raise RuntimeError("the guard's write failed")

    op.steps.reference_rider = board(op.store, "the snapshot reference", broken, compaction=True)
    with compaction_commit():
        _write(_wrapper(), Host(op.store.db_path), "compacted")
    op.steps.reference_aboard("S1.snapshot.1")
    assert op.written_ahead is None  # written after Hermes's commit (keep_snapshot's write_reference)
    events = [e["event"] for e in audit.read_events(runtime.audit_path) if e.get("op_id") == op.op_id]
    assert events == ["snapshot.deferred"]


def test_a_reference_is_given_the_digest_read_outside_hermes_transaction(runtime: Any, db: Any, mocker: Any) -> None:
    op = _native(runtime, db)
    read = mocker.patch.object(op.store, "rows_digest", return_value=(3, "crc32:abc"))
    op.live_digest = (48, "crc32:live")
    assert op.rows_read([(1, 10)]) == (48, "crc32:live")  # the rows the generation check read
    read.assert_not_called()
    # the same rows, but the check read them without a digest (it compared the whole transcript)
    op.live_digest = None
    assert op.rows_read([(1, 10)]) == (3, "crc32:abc")
    assert op.rows_read([(1, 12)]) == (3, "crc32:abc")  # rows that arrived during the summary
    assert read.call_count == 2
