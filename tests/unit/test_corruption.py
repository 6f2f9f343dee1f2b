"""Each corruption signature doctor reports, on small state.db files built by plain SQL."""

from __future__ import annotations

from pathlib import Path

from hermes_session_guard.maintenance.corruption import SIGNATURES, diagnose
from hermes_session_guard.maintenance.state_inspection import MERGED_END_REASON, load_home_state

from .hermes_like_db import SUMMARY, HermesLikeHome, rotated_home


def _found(home: Path, now: float | None = None) -> dict[str, list]:
    _, findings = diagnose(load_home_state(home, now=now))
    out: dict[str, list] = {}
    for f in findings:
        assert f.signature in SIGNATURES
        out.setdefault(f.signature, []).append(f)
    return out


def test_a_forked_rotated_lineage_with_late_writes_and_stale_routing(tmp_path: Path) -> None:
    h, _ = rotated_home(tmp_path / "h")
    h.close()
    found = _found(h.home)
    assert set(found) == {"rotated_lineage", "forked_compression", "writes_after_compression_end",
                          "routing_not_at_tip"}
    (rot,) = found["rotated_lineage"]
    assert rot.session_id == "r" and rot.sessions == ["r", "a", "b", "a2"] and rot.extra["tip"] == "a2"
    (fork,) = found["forked_compression"]
    assert fork.session_id == "r" and fork.sessions == ["r", "a", "b"] and fork.count == 2
    (late,) = found["writes_after_compression_end"]
    assert late.session_id == "r" and late.count == 2
    routing = found["routing_not_at_tip"]
    assert {f.extra["where"] for f in routing} == {"table", "file"}
    assert all(f.session_id == "b" and f.extra["tip"] == "a2" for f in routing)
    assert all(f.repaired_by for fs in found.values() for f in fs)


def test_an_empty_compression_child(tmp_path: Path) -> None:
    h = HermesLikeHome(tmp_path / "h")
    h.session("r", 1.0, ended=100.0, reason="compression")
    h.messages("r", ["q", "a"], 10.0)
    h.session("c", 100.0, parent="r")
    h.route("k", "r")
    h.close()
    found = _found(h.home)
    (empty,) = found["empty_compression_child"]
    assert empty.session_id == "c" and empty.sessions == ["r", "c"]
    # routing names the root, off the tip today; the repair revives the root and leaves the entry
    routing = found["routing_not_at_tip"]
    assert {f.session_id for f in routing} == {"r"} and all(f.repaired_by.startswith("left on r") for f in routing)


def test_messages_without_a_session_row(tmp_path: Path) -> None:
    h = HermesLikeHome(tmp_path / "h")
    h.session("r", 1.0)
    h.messages("r", ["q", "a"], 10.0)
    h.messages("ghost", ["q", "a", "q2"], 10.0)
    h.close()
    (orphans,) = _found(h.home)["orphan_messages"]
    assert orphans.session_id == "ghost" and orphans.count == 3


def test_expired_and_live_locks(tmp_path: Path) -> None:
    h = HermesLikeHome(tmp_path / "h")
    h.session("s1", 1.0)
    h.session("s2", 1.0)
    h.lock("s1", "pid=1", acquired=100.0, expires=400.0)
    h.lock("s2", "pid=2", acquired=100.0, expires=900.0)
    h.close()
    (lock,) = _found(h.home, now=500.0)["expired_compression_lock"]
    assert lock.session_id == "s1" and lock.extra["holder"] == "pid=1" and lock.extra["kind"] == "native"
    assert "expired_compression_lock" not in _found(h.home, now=300.0)


def test_more_than_one_live_summary_in_a_live_session(tmp_path: Path) -> None:
    h = HermesLikeHome(tmp_path / "h")
    h.session("twice", 1.0)
    h.messages("twice", [SUMMARY + " one", "x", "tail [CONTEXT SUMMARY]: merged", "y"], 10.0)
    h.session("archived", 1.0)
    h.messages("archived", [SUMMARY + " old"], 10.0, active=0)
    h.messages("archived", [SUMMARY + " new", "x"], 20.0)
    h.session("ended", 1.0, ended=50.0, reason="user_exit")
    h.messages("ended", [SUMMARY, SUMMARY], 10.0)
    h.close()
    (multi,) = _found(h.home)["multiple_live_summaries"]
    assert multi.session_id == "twice" and multi.count == 2
    assert not multi.repaired_by


def test_routing_to_a_session_an_earlier_repair_merged(tmp_path: Path) -> None:
    h = HermesLikeHome(tmp_path / "h")
    h.session("r", 1.0)
    h.session("c", 100.0, parent="r", ended=200.0, reason=MERGED_END_REASON)
    h.route("k", "c", table=False)
    h.close()
    (f,) = _found(h.home)["routing_not_at_tip"]
    assert f.session_id == "c" and f.extra["tip"] == "r"


def test_a_clean_home_has_no_findings(tmp_path: Path) -> None:
    h = HermesLikeHome(tmp_path / "h")
    h.session("r", 1.0)
    h.messages("r", ["q", SUMMARY, "tail", "a"], 10.0)
    h.session("delegate", 5.0, parent="r", source="cli")  # created while the parent was live
    h.messages("delegate", ["task", "done"], 6.0)
    h.session("old", 1.0, ended=3.0, reason="user_exit")
    h.route("k", "r")
    h.lock("r", "pid=1", acquired=100.0, expires=900.0)
    h.close()
    assert _found(h.home, now=500.0) == {}
