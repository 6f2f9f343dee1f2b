"""What repair would do (the plan is read-only and needs no Hermes)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from hermes_session_guard.commands import cli
from hermes_session_guard.maintenance.corruption import diagnose
from hermes_session_guard.maintenance.lineage_repair import new_turns, plan_repair
from hermes_session_guard.maintenance.state_inspection import load_home_state

from .hermes_like_db import SUMMARY, HermesLikeHome, rotated_home


def _plan(home: Path, now: float | None = None):  # noqa: ANN202
    state = load_home_state(home, now=now)
    lineages, findings = diagnose(state)
    return plan_repair(state, lineages, findings)


def test_fork_chain_and_late_writes_come_back_under_the_root(tmp_path: Path) -> None:
    h, _ = rotated_home(tmp_path / "h")
    h.close()
    plan = _plan(h.home)
    (lr,) = plan.lineages
    assert lr.root == "r" and lr.base == "a2" and lr.mode == "rewrite"
    contents = [r["content"] for r in lr.live]
    # the deepest transcript, then the fork's own turns, then what was written to r after its end
    assert contents == ["r0", SUMMARY + " a2", "a-q", "a-answer", "a2-q", "a2-answer", "b-q", "b-answer",
                        "late-q", "late-answer"]
    assert [(b.source, len(b.rows)) for b in lr.appended] == [("b", 2), ("r", 2)]
    assert [(m, len(rows)) for m, rows in lr.snapshots] == [("r", 8), ("a", 6), ("b", 6)]
    assert lr.merged == ["a", "b", "a2"]
    assert lr.root_end_reason is None
    assert [(c.where, c.session_key, c.old, c.new) for c in plan.routing] == [
        ("table", "agent:main:telegram:dm:1", "b", "r"), ("file", "agent:main:telegram:dm:1", "b", "r")]
    # nothing of the lineage is lost: every stored row is live or in a snapshot
    kept = {r["content"] for r in lr.live} | {r["content"] for _, rows in lr.snapshots for r in rows}
    state = load_home_state(h.home)
    assert sum(state.sessions[s].rows for s in lr.members) == 8 + 6 + 6 + 6
    assert {f"r{i}" for i in range(6)} | {"a-q", "b-q", "a2-q", "late-q"} <= kept


def test_children_without_messages_leave_the_root_transcript_as_it_is(tmp_path: Path) -> None:
    h = HermesLikeHome(tmp_path / "h")
    h.session("r", 1.0, ended=100.0, reason="compression")
    h.messages("r", ["q", "a", "q2", "a2"], 10.0)
    h.session("c", 100.0, parent="r")
    h.route("k", "r")
    h.close()
    (lr,) = _plan(h.home).lineages
    assert (lr.base, lr.mode, lr.appended, lr.snapshots) == ("r", "keep", [], [])
    assert [r["content"] for r in lr.live] == ["q", "a", "q2", "a2"]
    assert lr.merged == ["c"]
    assert _plan(h.home).routing == []


def test_a_lineage_whose_last_session_was_closed_ends_the_root_with_that_reason(tmp_path: Path) -> None:
    h = HermesLikeHome(tmp_path / "h")
    h.session("r", 1.0, ended=100.0, reason="compression")
    h.messages("r", ["q", "a"], 10.0)
    h.session("c", 100.0, parent="r", ended=300.0, reason="user_exit")
    h.messages("c", [SUMMARY, "q3"], 150.0)
    h.close()
    (lr,) = _plan(h.home).lineages
    assert lr.root_end_reason == "user_exit"


def test_housekeeping_end_reasons_do_not_close_the_repaired_conversation(tmp_path: Path) -> None:
    h = HermesLikeHome(tmp_path / "h")
    h.session("r", 1.0, ended=100.0, reason="compression")
    h.messages("r", ["q", "a"], 10.0)
    h.session("c", 100.0, parent="r", ended=900.0, reason="orphaned_compression")
    h.messages("c", [SUMMARY, "q3"], 150.0)
    h.close()
    (lr,) = _plan(h.home).lineages
    assert lr.root_end_reason is None


def test_new_turns_skip_the_compacted_prefix_only() -> None:
    rows = [{"role": "user", "content": c} for c in ["h0", SUMMARY, "t9", "ok", "h0", "ok"]]
    assert [r["content"] for r in new_turns(rows, {("user", "h0"), ("user", "t9"), ("user", "ok")})] == []
    assert [r["content"] for r in new_turns(rows, {("user", "h0"), ("user", "t9")})] == ["ok", "h0", "ok"]


def test_locks_and_orphans_are_planned(tmp_path: Path) -> None:
    h = HermesLikeHome(tmp_path / "h")
    h.session("s", 1.0)
    h.lock("s", "pid=1", acquired=100.0, expires=400.0)
    h.messages("ghost", ["q"], 10.0)
    h.close()
    plan = _plan(h.home, now=500.0)
    assert [(lk.kind, lk.session_id, lk.holder) for lk in plan.locks] == [("native", "s", "pid=1")]
    assert plan.orphans == {"ghost": 1}
    assert any("clear the expired native lock on s" in line for line in plan.describe())


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    h, _ = rotated_home(tmp_path / "h")
    h.close()
    monkeypatch.setenv("HERMES_HOME", str(h.home))
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in h.home.rglob("*") if p.is_file()}
    assert cli.main(["repair"]) == 0
    out = capsys.readouterr().out
    assert "dry run" in out and "lineage r (4 sessions" in out and "re-point agent:main:telegram:dm:1" in out
    assert cli.main(["repair", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["dry_run"] is True and payload["plan"]["lineages"][0]["live_messages"] == 10
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in h.home.rglob("*") if p.is_file()}
    assert after == before


def test_a_clean_home_needs_no_repair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    h = HermesLikeHome(tmp_path / "h")
    h.session("r", 1.0)
    h.messages("r", ["q", "a"], 10.0)
    h.close()
    monkeypatch.setenv("HERMES_HOME", str(h.home))
    assert cli.main(["repair"]) == 0
    assert "nothing to repair" in capsys.readouterr().out
    assert cli.main(["doctor"]) == 0
    assert "no corruption found" in capsys.readouterr().out
