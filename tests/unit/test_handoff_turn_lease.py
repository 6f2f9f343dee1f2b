"""A hand-off inside a Hermes 0.20+ turn: the child's turn lease, taken under the turn's
holder and given back when the turn ends (host.carry_turn_lease)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from hermes_session_guard import host


class _Leases:
    """Hermes's session_turn_leases as SessionDB exposes them: one holder per conversation."""

    def __init__(self, taken: dict[str, str] | None = None) -> None:
        self.rows: dict[str, str] = dict(taken or {})

    def try_acquire_session_turn_lease(self, sid: str, holder: str, *, ttl_seconds: float = 300.0) -> bool:
        assert ttl_seconds > 0
        return self.rows.setdefault(sid, holder) == holder

    def release_session_turn_lease(self, sid: str, holder: str) -> None:
        if self.rows.get(sid) == holder:
            del self.rows[sid]


def _agent(holder: str | None) -> Any:
    return SimpleNamespace(_active_session_turn_lease_holder=holder, _active_session_turn_lease_ttl_seconds=30.0)


def test_the_forking_turn_holds_the_childs_lease_until_it_ends() -> None:
    db, agent = _Leases({"parent": "turn-1"}), _agent("turn-1")
    assert host.carry_turn_lease(db, agent, "child") is not None
    assert db.rows == {"parent": "turn-1", "child": "turn-1"}
    host.release_carried_turn_leases(agent)
    assert db.rows == {"parent": "turn-1"}  # the parent's is Hermes's to release
    host.release_carried_turn_leases(agent)  # nothing carried any more: nothing happens
    assert db.rows == {"parent": "turn-1"}


def test_an_undone_hand_off_gives_the_lease_back_at_once() -> None:
    db, agent = _Leases(), _agent("turn-1")
    undo = host.carry_turn_lease(db, agent, "child")
    assert undo is not None
    undo()
    assert db.rows == {}
    host.release_carried_turn_leases(agent)
    assert db.rows == {}


@pytest.mark.parametrize("agent,db", [(_agent(None), _Leases()), (_agent("turn-1"), object())],
                         ids=["outside-a-turn", "release-without-turn-leases"])
def test_nothing_is_taken_where_no_turn_holds_a_lease(agent: Any, db: Any) -> None:
    assert host.carry_turn_lease(db, agent, "child") is None


def test_a_child_lease_another_holder_has_refuses_the_hand_off() -> None:
    db, agent = _Leases({"child": "someone-else"}), _agent("turn-1")
    with pytest.raises(RuntimeError, match="child"):
        host.carry_turn_lease(db, agent, "child")
    host.release_carried_turn_leases(agent)
    assert db.rows == {"child": "someone-else"}


def test_a_turn_whose_end_gives_no_lease_back_refuses_the_hand_off_and_takes_nothing() -> None:
    """Outside the seam table ``turn_history`` (which gives the lease back) may stay off while
    the compaction is verified: a carried lease would hold the child's next turns until it expired."""
    db, agent = _Leases({"parent": "turn-1"}), _agent("turn-1")
    with pytest.raises(RuntimeError, match="turn_history"):
        host.carry_turn_lease(db, agent, "child", given_back=False)
    assert db.rows == {"parent": "turn-1"}
    assert host.carry_turn_lease(db, _agent(None), "child", given_back=False) is None  # outside a turn
