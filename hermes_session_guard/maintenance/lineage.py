"""Compression lineages in a Hermes state.db: which sessions continue which.

A *continuation* is a child session created when its parent was ended by
compression (the host's rotation: ``end_session(old, "compression")`` then
``create_session(parent_session_id=old)``). Branches, delegates and tool
children also carry a ``parent_session_id``; they are told apart the way the
host does (0.19's ``_branched_from`` / ``_delegate_from`` markers and
``source = 'tool'``) and, for 0.14 rows without markers, by time: a
continuation is created when the parent ends, a branch or delegate while the
parent is still live.

A *lineage* is a root session (itself no continuation) with every continuation
below it. Under the contract a conversation keeps its root id for life, so a
root with at least one continuation is a lineage to bring back under the root.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from .state_inspection import SessionInfo

# A continuation row is created in the same code path right after the parent is
# ended; allow for clock skew between the two writes (0.19 races can even create
# the child a moment before the parent's ended_at is written).
CONTINUATION_SLACK_SECONDS = 2.0


def is_continuation(child: SessionInfo, parent: SessionInfo) -> bool:
    if not parent.ended_by_compression or parent.ended_at is None:
        return False
    if not child.may_continue_a_compression:
        return False
    return child.started_at >= parent.ended_at - CONTINUATION_SLACK_SECONDS


def continuation_children(sessions: Mapping[str, SessionInfo]) -> dict[str, list[str]]:
    """parent id -> its continuation children, oldest first."""
    out: dict[str, list[str]] = {}
    for s in sorted(sessions.values(), key=lambda s: (s.started_at, s.id)):
        parent = sessions.get(s.parent_id) if s.parent_id else None
        if parent is not None and parent.id != s.id and is_continuation(s, parent):
            out.setdefault(parent.id, []).append(s.id)
    return out


@dataclass
class Lineage:
    root: str
    parent: dict[str, str] = field(default_factory=dict)  # member -> its parent (root absent)
    children: dict[str, list[str]] = field(default_factory=dict)  # member -> continuation children

    @property
    def members(self) -> list[str]:
        """The root, then every continuation, parents before children."""
        out, queue = [], [self.root]
        while queue:
            sid = queue.pop(0)
            out.append(sid)
            queue.extend(self.children.get(sid, []))
        return out

    def depth(self, sid: str) -> int:
        return len(self.ancestors(sid))

    def ancestors(self, sid: str) -> list[str]:
        """From the root down to ``sid``'s parent."""
        out: list[str] = []
        cur = self.parent.get(sid)
        while cur is not None and cur not in out:
            out.insert(0, cur)
            cur = self.parent.get(cur)
        return out

    def has_children(self, sid: str) -> bool:
        return bool(self.children.get(sid))

    def tip(self, sessions: Mapping[str, SessionInfo]) -> str:
        """Where the host continues the conversation (0.19's ``get_compression_tip``
        order): a child that was itself compressed, else a live child, else the most
        recently active one."""
        cur, seen = self.root, {self.root}
        while self.children.get(cur):
            def rank(sid: str) -> tuple[int, float, float, str]:
                s = sessions[sid]
                group = 0 if s.ended_by_compression else 1 if not s.ended else 2
                return (group, -s.last_activity, -s.started_at, sid)

            nxt = min(self.children[cur], key=rank)
            if nxt in seen:
                break
            seen.add(nxt)
            cur = nxt
        return cur


def build_lineages(sessions: Mapping[str, SessionInfo]) -> list[Lineage]:
    """Every root that has at least one continuation, with its whole tree."""
    children = continuation_children(sessions)
    is_child = {c for kids in children.values() for c in kids}
    out: list[Lineage] = []
    for root in sorted(children, key=lambda sid: (sessions[sid].started_at, sid)):
        if root in is_child:
            continue
        lineage = Lineage(root=root)
        queue, seen = [root], {root}
        while queue:
            sid = queue.pop(0)
            kids = [c for c in children.get(sid, []) if c not in seen]
            if kids:
                lineage.children[sid] = kids
            for kid in kids:
                lineage.parent[kid] = sid
                seen.add(kid)
                queue.append(kid)
        out.append(lineage)
    return out


def member_index(lineages: list[Lineage]) -> dict[str, Lineage]:
    return {sid: lin for lin in lineages for sid in lin.members}


def late_rows(session: SessionInfo, marks: list[tuple[int, float]], first_child_row: int | None) -> list[int]:
    """Row ids of ``session`` written after it was ended by compression: a timestamp
    after ``ended_at``, or a row id after the first row of any continuation."""
    if session.ended_at is None:
        return []
    return [rid for rid, ts in marks
            if ts > session.ended_at or (first_child_row is not None and rid > first_child_row)]


def first_child_row(lineage: Lineage, sid: str, sessions: Mapping[str, SessionInfo]) -> int | None:
    ids = [row for c in lineage.children.get(sid, []) if (row := sessions[c].first_row_id) is not None]
    return min(ids) if ids else None


def walk_merged(sid: str, sessions: Mapping[str, SessionInfo]) -> Iterator[str]:
    """From a session merged by an earlier repair up through its parents."""
    seen: set[str] = set()
    cur: str | None = sid
    while cur is not None and cur not in seen and cur in sessions:
        seen.add(cur)
        yield cur
        if not sessions[cur].merged:
            return
        cur = sessions[cur].parent_id


def merge_target(sid: str, sessions: Mapping[str, SessionInfo]) -> str | None:
    """The session a merged session's conversation now lives in."""
    chain = list(walk_merged(sid, sessions))
    return chain[-1] if chain and chain[-1] != sid else None
