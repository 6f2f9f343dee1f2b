"""The hand-off bound in the guard's own table: claimed atomically, given back on failure."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from freezegun import freeze_time

from hermes_session_guard.store import GuardStore


def _reserve(
    store: GuardStore, hid: str, parent: str = "S", root: str = "S", limit: int = 1, **kw: Any
) -> int | None:
    return store.reserve_handoff(handoff_id=hid, lineage_root=root, parent_session_id=parent,
                                 mode="fresh_session", limit=limit, **kw)


def test_reservations_are_bounded_per_lineage(tmp_path: Path) -> None:
    store = GuardStore(tmp_path / "state.db")
    assert _reserve(store, "a", limit=2) == 1
    store.complete_handoff("a", child_session_id="C1", packet_path="/p1")
    assert store.lineage_root("C1") == "S"
    assert _reserve(store, "b", parent="C1", limit=2) == 2
    store.complete_handoff("b", child_session_id="C2", packet_path="/p2")
    assert store.lineage_root("C2") == "S"
    assert _reserve(store, "c", parent="C2", limit=2) is None
    assert _reserve(store, "d", parent="X", root="X", limit=2) == 1  # another lineage has its own bound


def test_a_released_reservation_does_not_consume_the_count(tmp_path: Path) -> None:
    store = GuardStore(tmp_path / "state.db")
    assert _reserve(store, "a") == 1
    assert _reserve(store, "b") is None  # held while the first attempt runs
    store.release_handoff("a")
    assert store.handoffs(lineage_root="S") == []
    assert _reserve(store, "c") == 1


def test_a_parent_is_forked_once(tmp_path: Path) -> None:
    store = GuardStore(tmp_path / "state.db")
    assert _reserve(store, "a", limit=5, once_per_parent=True) == 1
    store.complete_handoff("a", child_session_id="C", packet_path="/p")
    assert _reserve(store, "b", limit=5, once_per_parent=True) is None


def test_a_crashed_reservation_expires(tmp_path: Path) -> None:
    store = GuardStore(tmp_path / "state.db")
    with freeze_time("2026-05-28 16:00:00"):
        assert _reserve(store, "a") == 1
    with freeze_time("2026-05-28 16:01:00"):
        assert _reserve(store, "b", stale_after=300.0) is None
    with freeze_time("2026-05-28 16:06:00"):
        assert _reserve(store, "c", stale_after=300.0) == 1


def test_concurrent_claims_never_exceed_the_bound(tmp_path: Path) -> None:
    """Several processes share a state.db: each has its own connection."""
    stores = [GuardStore(tmp_path / "state.db") for _ in range(6)]
    results: list[int | None] = []
    lock = threading.Lock()

    def claim(i: int) -> None:
        seq = _reserve(stores[i], f"h{i}", limit=2)
        with lock:
            results.append(seq)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r for r in results if r is not None) == [1, 2]
    assert results.count(None) == 4


def test_manual_packets_are_recorded_outside_the_bound(tmp_path: Path) -> None:
    store = GuardStore(tmp_path / "state.db")
    store.record_packet(handoff_id="m", session_id="S", mode="manual", packet_path="/m")
    assert _reserve(store, "a") == 1
    assert [(r.mode, r.seq) for r in store.handoffs(session_id="S")] == [("manual", None), ("fresh_session", 1)]


def test_compressions_are_counted_since_the_last_handoff(tmp_path: Path) -> None:
    store = GuardStore(tmp_path / "state.db")
    for i, ts in enumerate((10.0, 20.0, 30.0)):
        store.write_snapshot(snapshot_id=f"S.snapshot.{i}", session_id="S", messages=[], created_at=ts)
    assert store.compression_count("S") == 3
    assert store.compression_count("S", since=15.0) == 2
