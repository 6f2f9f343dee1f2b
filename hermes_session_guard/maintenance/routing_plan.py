"""Where each gateway routing entry must point: one plan for ``doctor`` and ``repair``.

``repair`` brings every rotated lineage back under its original id (the root), so
an entry that names another member of a lineage, or a session an earlier repair
merged, is re-pointed to that root (or the merge target). An entry that names
the root of a lineage the host continues elsewhere is off the tip today, but the
repair makes the root live again, so nothing is written to it (``rewrite``
False). ``doctor`` reports every move of this plan as ``routing_not_at_tip``,
saying which of the two it is; ``repair`` writes exactly the moves that re-point.
"""

from __future__ import annotations

from dataclasses import dataclass

from .lineage import Lineage, member_index, merge_target
from .state_inspection import HomeState, RoutingEntry


@dataclass(frozen=True)
class RoutingMove:
    entry: RoutingEntry
    target: str  # the session id the entry must name
    tip: str  # where the conversation continues today (the merge target for a merged session)
    members: tuple[str, ...]
    merged: bool = False  # the entry names a session an earlier repair merged

    @property
    def current(self) -> str:
        """The session id the entry names now (plan_routing keeps only entries that name one)."""
        return self.entry.session_id or ""

    @property
    def rewrite(self) -> bool:
        """The repair writes this entry (it names another session than its target)."""
        return self.entry.session_id != self.target


def plan_routing(state: HomeState, lineages: list[Lineage]) -> list[RoutingMove]:
    index = member_index(lineages)
    moves: list[RoutingMove] = []
    for entry in state.routing:
        sid = entry.session_id
        if not sid:
            continue
        lin = index.get(sid)
        if lin is not None:
            tip = lin.tip(state.sessions)
            if sid != tip or sid != lin.root:
                moves.append(RoutingMove(entry, lin.root, tip, tuple(lin.members)))
        elif sid in state.sessions and state.sessions[sid].merged:
            target = merge_target(sid, state.sessions)
            if target and target != sid:
                moves.append(RoutingMove(entry, target, target, (sid, target), merged=True))
    return moves
