"""Hermes's own per-conversation turn lease (``session_turn_leases``, 0.20+) as a lease
table, for a compaction that starts outside any turn (:func:`..seams.turns.held_for_compaction`).
Hermes keys the lease by the conversation's lineage root (through compression parents);
its methods resolve that key inside their own transaction, so the guard passes the
session id as a turn of Hermes's does."""

from __future__ import annotations

from typing import Any

from .agent import session_db

_METHODS = ("try_acquire_session_turn_lease", "refresh_session_turn_lease", "release_session_turn_lease")


class HostTurnLeases:
    """``session_turn_leases`` rows through the SessionDB's own methods (the
    :class:`~hermes_session_guard.locks.session_lock.LeaseTable` protocol)."""

    name: str = "turn"

    def __init__(self, db: Any) -> None:
        self.db = db

    def try_acquire(self, session_id: str, holder: str, ttl_seconds: float) -> bool:
        return bool(self.db.try_acquire_session_turn_lease(session_id, holder, ttl_seconds=ttl_seconds))

    def refresh(self, session_id: str, holder: str, ttl_seconds: float) -> bool:
        return bool(self.db.refresh_session_turn_lease(session_id, holder, ttl_seconds=ttl_seconds))

    def release(self, session_id: str, holder: str) -> None:
        self.db.release_session_turn_lease(session_id, holder)

    def holder(self, session_id: str) -> str | None:
        """Hermes has no reader of the holder; its own acquire reclaims a dead process's row."""
        return None


def host_turn_leases(agent: Any) -> HostTurnLeases | None:
    """The agent's SessionDB as a turn-lease table where Hermes has one (0.20+), else None."""
    db = session_db(agent)
    if db is None or not all(callable(getattr(db, name, None)) for name in _METHODS):
        return None
    return HostTurnLeases(db)


def in_host_turn(agent: Any) -> bool:
    """Whether ``agent`` is inside a turn that holds Hermes's turn lease (0.20+ sets the
    holder on the agent for the whole turn, whichever thread its compaction runs on)."""
    return bool(getattr(agent, "_active_session_turn_lease_holder", None))
