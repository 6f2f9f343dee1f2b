"""Compression lineages: which children continue a compression, trees, tips, late rows."""

from __future__ import annotations

from pathlib import Path

from hermes_session_guard.maintenance.lineage import (
    build_lineages,
    continuation_children,
    first_child_row,
    is_continuation,
    late_rows,
    merge_target,
)
from hermes_session_guard.maintenance.state_inspection import MERGED_END_REASON, SessionInfo, load_home_state

from .hermes_like_db import HermesLikeHome, rotated_home


def _s(sid: str, started: float, *, parent: str | None = None, ended: float | None = None,
       reason: str | None = None, source: str = "cli", model_config: str | None = None) -> SessionInfo:
    return SessionInfo(id=sid, source=source, parent_id=parent, started_at=started, ended_at=ended,
                       end_reason=reason, model_config=model_config)


def test_a_child_created_when_the_parent_was_ended_by_compression_continues_it() -> None:
    parent = _s("p", 1.0, ended=100.0, reason="compression")
    assert is_continuation(_s("c", 100.0, parent="p"), parent)
    assert is_continuation(_s("c", 99.0, parent="p"), parent)  # within the clock slack


def test_branches_delegates_tool_children_and_children_of_live_parents_are_not_continuations() -> None:
    ended = _s("p", 1.0, ended=100.0, reason="compression")
    assert not is_continuation(_s("c", 100.0, model_config='{"_branched_from": "p"}'), ended)
    assert not is_continuation(_s("c", 100.0, model_config='{"_delegate_from": "p"}'), ended)
    assert not is_continuation(_s("c", 100.0, source="tool"), ended)
    assert not is_continuation(_s("c", 50.0), ended)  # a 0.14 delegate: created while the parent was live
    assert not is_continuation(_s("c", 100.0), _s("p", 1.0))
    assert not is_continuation(_s("c", 100.0), _s("p", 1.0, ended=100.0, reason="user_exit"))


def test_lineage_tree_members_depths_and_the_hosts_tip(tmp_path: Path) -> None:
    home, _ = rotated_home(tmp_path / "h")
    home.close()
    state = load_home_state(home.home)
    (lin,) = build_lineages(state.sessions)
    assert lin.root == "r"
    assert lin.members == ["r", "a", "b", "a2"]
    assert lin.children == {"r": ["a", "b"], "a": ["a2"]}
    assert [lin.depth(s) for s in lin.members] == [0, 1, 1, 2]
    assert lin.ancestors("a2") == ["r", "a"]
    # the host prefers a child that was itself compressed, then follows it
    assert lin.tip(state.sessions) == "a2"


def test_tip_prefers_a_live_child_then_the_most_recent_activity(tmp_path: Path) -> None:
    h = HermesLikeHome(tmp_path / "h")
    h.session("r", 1.0, ended=100.0, reason="compression")
    h.session("old", 100.0, parent="r", ended=120.0, reason="user_exit")
    h.session("live1", 100.1, parent="r")
    h.session("live2", 100.2, parent="r")
    h.messages("live1", ["x", "y"], 300.0)
    h.messages("live2", ["x", "y"], 200.0)
    h.close()
    state = load_home_state(h.home)
    (lin,) = build_lineages(state.sessions)
    assert lin.tip(state.sessions) == "live1"


def test_rows_written_after_a_compression_end(tmp_path: Path) -> None:
    home, _ = rotated_home(tmp_path / "h")
    home.close()
    state = load_home_state(home.home)
    (lin,) = build_lineages(state.sessions)
    late = late_rows(state.sessions["r"], state.marks["r"], first_child_row(lin, "r", state.sessions))
    assert len(late) == 2
    assert late == [rid for rid, ts in state.marks["r"] if ts >= 150.0]
    assert late_rows(state.sessions["a"], state.marks["a"], first_child_row(lin, "a", state.sessions)) == []


def test_a_row_after_the_first_child_row_is_late_even_with_an_old_timestamp(tmp_path: Path) -> None:
    h = HermesLikeHome(tmp_path / "h")
    h.session("r", 1.0, ended=100.0, reason="compression")
    h.messages("r", ["a", "b"], 10.0)
    h.session("c", 100.0, parent="r")
    h.messages("c", ["a", "b"], 10.0)  # 0.19 keeps the copied rows' timestamps
    (late_id,) = h.messages("r", ["replayed"], 50.0)
    h.close()
    state = load_home_state(h.home)
    (lin,) = build_lineages(state.sessions)
    assert late_rows(state.sessions["r"], state.marks["r"], first_child_row(lin, "r", state.sessions)) == [late_id]


def test_merged_sessions_lead_to_the_session_they_were_merged_into(tmp_path: Path) -> None:
    h = HermesLikeHome(tmp_path / "h")
    h.session("r", 1.0)
    h.session("a", 100.0, parent="r", ended=300.0, reason=MERGED_END_REASON)
    h.session("a2", 200.0, parent="a", ended=300.0, reason=MERGED_END_REASON)
    h.close()
    state = load_home_state(h.home)
    assert merge_target("a2", state.sessions) == "r"
    assert merge_target("r", state.sessions) is None
    assert build_lineages(state.sessions) == []
    assert continuation_children(state.sessions) == {}
