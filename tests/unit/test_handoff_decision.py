"""Deciding and performing a hand-off, with the host replaced by fakes: the order of
the steps, the rollback on each failure, and the continuation the agent gets."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

import pytest

from hermes_session_guard import host
from hermes_session_guard.audit import read_events
from hermes_session_guard.config import parse_config
from hermes_session_guard.handoff import writer as handoff
from hermes_session_guard.handoff.packet import SEED_MARKER
from hermes_session_guard.runtime import Runtime

TODO = "[Your active task list was preserved across context compression]\n- [ ] 1. x (pending)"


def _runtime(tmp_path: Path, **options: Any) -> Runtime:
    return Runtime(config=parse_config({"handoff": {"enabled": True, **options}}), host_version="0.19.0",
                   fixed_home=tmp_path)


def _compressed() -> list[dict]:
    return [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "summary of earlier turns"},
        {"role": "user", "content": "run the deploy"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "t1"}]},
        {"role": "tool", "tool_call_id": "t1", "content": "ok"},
        {"role": "user", "content": TODO},
    ]


@pytest.fixture
def fake_host(tmp_path: Path, mocker: Any) -> SimpleNamespace:
    calls: list[str] = []
    routing_undo = MagicMock(side_effect=lambda: calls.append("routing.undo"))
    identity_undo = MagicMock(side_effect=lambda: calls.append("identity.undo"))
    fakes = SimpleNamespace(
        calls=calls,
        routing_undo=routing_undo,
        identity_undo=identity_undo,
        db_path=mocker.patch.object(host, "db_path", return_value=tmp_path / "state.db"),
        session_db=mocker.patch.object(host, "session_db", return_value=MagicMock()),
        session_row=mocker.patch.object(host, "session_row", side_effect=lambda db, sid: (
            {"title": "T"} if sid == "S" else None)),
        git_state=mocker.patch.object(host, "git_state", return_value=(None, None)),
        host_redactor=mocker.patch.object(host, "host_redactor", return_value=None),
        new_session_id=mocker.patch.object(host, "new_session_id", return_value="CHILD"),
        create=mocker.patch.object(host, "create_child_session", side_effect=lambda *a, **kw: calls.append("create")),
        discard=mocker.patch.object(host, "discard_session", side_effect=lambda *a: calls.append("discard")),
        move=mocker.patch.object(host, "move_gateway_routing", side_effect=lambda p, c: (
            calls.append("routing"), host.RoutingMove(["k"], routing_undo))[1]),
        switch=mocker.patch.object(host, "switch_agent_session", side_effect=lambda *a: (
            calls.append("switch"), identity_undo)[1]),
        end=mocker.patch.object(host, "end_session", side_effect=lambda db, sid, reason: calls.append(f"end:{reason}")),
        notify=mocker.patch.object(host, "notify_handoff"),
        runner=mocker.patch.object(host, "live_gateway_runner", return_value=None),
    )
    return fakes


def _agent() -> SimpleNamespace:
    shown: list[str] = []
    return SimpleNamespace(session_id="S", status_callback=object(), _emit_status=shown.append, shown=shown,
                           _cached_system_prompt="sys")


def _compress_n(runtime: Runtime, tmp_path: Path, n: int) -> None:
    store = runtime.store_for(tmp_path / "state.db")
    for i in range(n):
        store.write_snapshot(snapshot_id=f"S.snapshot.{i}", session_id="S", messages=[{"role": "user"}],
                             created_at=100.0 + i)


def test_continuation_keeps_the_in_flight_exchange_after_the_packet() -> None:
    out = handoff.continuation_messages("# packet", "S", _compressed())
    assert out[0]["role"] == "user" and out[0]["content"].startswith(SEED_MARKER)
    assert out[1] == {"role": "assistant", "content": handoff.SEED_ACK}
    assert [m.get("content") for m in out[2:]] == ["run the deploy", "", "ok"]  # todo snapshot dropped
    assert out[3]["tool_calls"] == [{"id": "t1"}]


def test_nothing_happens_before_the_nth_compression(tmp_path: Path, fake_host: SimpleNamespace) -> None:
    runtime = _runtime(tmp_path, mode="fresh_session", after_compressions=3)
    _compress_n(runtime, tmp_path, 2)
    outcome = handoff.after_compression(runtime, _agent(), "S", "op", _compressed())
    assert outcome is not None and outcome.status == "not_due"
    assert fake_host.calls == [] and not (tmp_path / "handoffs").exists()


def test_disabled_is_inert(tmp_path: Path, fake_host: SimpleNamespace) -> None:
    runtime = Runtime(config=parse_config(None), host_version="0.19.0", fixed_home=tmp_path)
    _compress_n(runtime, tmp_path, 5)
    assert handoff.after_compression(runtime, _agent(), "S", "op", _compressed()) is None


def test_prompt_user_writes_and_tells_without_switching(tmp_path: Path, fake_host: SimpleNamespace) -> None:
    runtime = _runtime(tmp_path, mode="prompt_user", after_compressions=2)
    _compress_n(runtime, tmp_path, 2)
    agent, compressed = _agent(), _compressed()
    outcome = handoff.after_compression(runtime, agent, "S", "op", compressed)
    assert outcome is not None and outcome.status == "prompted" and outcome.packet_path is not None
    assert outcome.packet_path.is_file() and fake_host.calls == []
    assert compressed == _compressed() and agent.session_id == "S"
    assert len(agent.shown) == 1 and str(outcome.packet_path) in agent.shown[0]


def test_fresh_session_creates_first_then_routes_then_switches(tmp_path: Path, fake_host: SimpleNamespace) -> None:
    runtime = _runtime(tmp_path, mode="fresh_session", after_compressions=1)
    _compress_n(runtime, tmp_path, 1)
    compressed = _compressed()
    outcome = handoff.after_compression(runtime, _agent(), "S", "op", compressed)
    assert outcome is not None and outcome.status == "forked" and outcome.child_session_id == "CHILD"
    assert fake_host.calls == ["create", "routing", "switch", "end:handoff"]
    assert compressed[0]["content"].startswith(SEED_MARKER)  # the conversation continues from the seed
    (fork,) = [e for e in read_events(runtime.audit_path) if e["event"] == "fork.created"]
    assert (fork["parent_session_id"], fork["child_session_id"], fork["gateway_keys"]) == ("S", "CHILD", 1)
    (record,) = runtime.store_for(tmp_path / "state.db").handoffs(lineage_root="S")
    assert (record.status, record.child_session_id, record.seq) == ("done", "CHILD", 1)


@pytest.mark.parametrize(
    ("failing", "stage", "undone"),
    [
        ("create", "create_child", ["discard"]),
        ("move", "routing", ["discard"]),
        ("switch", "switch", ["routing.undo", "discard"]),
    ],
)
def test_any_failed_step_rolls_back_and_keeps_the_count(
    tmp_path: Path, fake_host: SimpleNamespace, failing: str, stage: str, undone: list[str]
) -> None:
    runtime = _runtime(tmp_path, mode="fresh_session", after_compressions=1)
    _compress_n(runtime, tmp_path, 1)
    getattr(fake_host, failing).side_effect = OSError("boom")
    compressed = _compressed()
    outcome = handoff.after_compression(runtime, _agent(), "S", "op", compressed)
    assert outcome is not None and outcome.status == "failed"
    done = [c for c in fake_host.calls if c in ("create", "routing", "switch")]
    assert fake_host.calls == done + undone  # undone in reverse, nothing ended
    assert compressed == _compressed()
    assert runtime.store_for(tmp_path / "state.db").handoffs(lineage_root="S") == []
    (failed,) = [e for e in read_events(runtime.audit_path) if e["event"] == "handoff.failed"]
    assert failed["stage"] == stage and failed["count_consumed"] is False


def test_a_background_review_fork_never_hands_off(tmp_path: Path, fake_host: SimpleNamespace) -> None:
    runtime = _runtime(tmp_path, mode="fresh_session", after_compressions=1)
    _compress_n(runtime, tmp_path, 3)
    agent = _agent()
    agent._persist_disabled = True
    assert handoff.after_compression(runtime, agent, "S", "op", _compressed()) is None
    assert fake_host.calls == []


def test_an_unexpected_guard_error_never_reaches_the_host(tmp_path: Path, fake_host: SimpleNamespace) -> None:
    runtime = _runtime(tmp_path, mode="fresh_session", after_compressions=1)
    _compress_n(runtime, tmp_path, 1)
    fake_host.db_path.side_effect = RuntimeError("no db")
    outcome = handoff.after_compression(runtime, _agent(), "S", "op", _compressed())
    assert outcome is not None and outcome.status == "failed"
