"""Corruption signatures in a Hermes home, as ``doctor`` reports them.

Each signature is one small check over a :class:`HomeState` (read-only data) and
the compression lineages found in it; :data:`CHECKS` lists them in report order,
so a new signature is one function and one line. Every finding names the
session ids involved and says whether ``repair`` fixes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from .lineage import Lineage, build_lineages, first_child_row, late_rows
from .state_inspection import HomeState

# signature -> what it means (doctor --json carries the same text)
SIGNATURES: dict[str, str] = {
    "rotated_lineage": "a compression ended the session and the conversation continues under another id",
    "forked_compression": "a session ended by compression has two or more compression children",
    "writes_after_compression_end": "messages were written to a session after it was ended by compression",
    "empty_compression_child": "a compression child has no messages (its transcript never reached state.db)",
    "orphan_messages": "messages belong to a session id that has no session row",
    "routing_not_at_tip": "gateway routing points at a session that is not the live end of its lineage",
    "expired_compression_lock": "a compression lock outlived its lease (its holder is gone)",
    "dead_lock_holder": "a compression lock is held by a process that no longer runs (same machine, pid gone "
                        "or reused); the next compression takes it over, repair clears it",
    "multiple_live_summaries": "a live session holds more than one compaction summary generation",
    "snapshot_gone": "a snapshot names Hermes's own archived rows (0.18.2+) and Hermes no longer holds them "
                     "as they were (pruned, deleted or rewritten): that pre-compaction transcript is gone",
}


@dataclass
class Finding:
    signature: str
    session_id: str
    sessions: list[str]
    detail: str
    repaired_by: str = ""  # what `repair --apply` does about it; "" = reported only
    count: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["meaning"] = SIGNATURES.get(self.signature, "")
        return out


Check = Callable[[HomeState, list[Lineage]], Iterable[Finding]]
LINEAGE_FIX = "brought back under the original id"


def rotated_lineages(state: HomeState, lineages: list[Lineage]) -> Iterable[Finding]:
    for lin in lineages:
        members = lin.members
        tip = lin.tip(state.sessions)
        yield Finding("rotated_lineage", lin.root, members,
                      f"{lin.root} was ended by compression; the conversation went on in {len(members) - 1} "
                      f"other session(s), now at {tip}", LINEAGE_FIX, extra={"tip": tip})


def forked_compressions(state: HomeState, lineages: list[Lineage]) -> Iterable[Finding]:
    for lin in lineages:
        for sid in lin.members:
            kids = lin.children.get(sid, [])
            if len(kids) >= 2:
                yield Finding("forked_compression", sid, [sid, *kids],
                              f"{sid} has {len(kids)} compression children: {', '.join(kids)}", LINEAGE_FIX,
                              count=len(kids))


def writes_after_end(state: HomeState, lineages: list[Lineage]) -> Iterable[Finding]:
    for lin in lineages:
        for sid in lin.members:
            session = state.sessions[sid]
            if not lin.has_children(sid):
                continue
            late = late_rows(session, state.marks.get(sid, []), first_child_row(lin, sid, state.sessions))
            if late:
                yield Finding("writes_after_compression_end", sid, [sid],
                              f"{len(late)} message(s) written to {sid} after it was ended by compression "
                              f"(rows {late[0]}..{late[-1]})", "kept in the repaired transcript", count=len(late),
                              extra={"rows": late})


def empty_children(state: HomeState, lineages: list[Lineage]) -> Iterable[Finding]:
    for lin in lineages:
        for sid in lin.members[1:]:
            if state.sessions[sid].rows == 0:
                parent = lin.parent[sid]
                yield Finding("empty_compression_child", sid, [parent, sid],
                              f"{sid} (compression child of {parent}) has no messages", LINEAGE_FIX)


def orphan_messages(state: HomeState, lineages: list[Lineage]) -> Iterable[Finding]:
    for sid, count in sorted(state.orphan_rows.items()):
        yield Finding("orphan_messages", sid, [sid], f"{count} message(s) for session {sid}, which has no row",
                      "the session row is recreated", count=count)


def routing_off_tip(state: HomeState, lineages: list[Lineage]) -> Iterable[Finding]:
    """Exactly the entries ``repair`` re-points (:func:`.routing_plan.plan_routing`)."""
    from .routing_plan import plan_routing

    for move in plan_routing(state, lineages):
        entry, sid = move.entry, move.current
        if move.merged:
            detail = f"{entry.label} -> {sid}, which an earlier repair merged into {move.target}"
        elif move.rewrite:
            detail = (f"{entry.label} -> {sid}, a continuation of {move.target} (the host continues at {move.tip}); "
                      f"the repaired conversation lives on under {move.target}")
        else:
            detail = f"{entry.label} -> {sid}, but the lineage of {move.target} continues at {move.tip}"
        fix = (f"re-pointed to {move.target}" if move.rewrite
               else f"left on {move.target}, which the lineage repair makes live again")
        yield Finding("routing_not_at_tip", sid, list(move.members), detail, fix,
                      extra={"routing_key": entry.session_key, "where": entry.where, "tip": move.tip,
                             "target": move.target})


def expired_locks(state: HomeState, lineages: list[Lineage]) -> Iterable[Finding]:
    for lock in state.locks:
        if lock.expired(state.now):
            age = state.now - (lock.expires_at or state.now)
            yield Finding("expired_compression_lock", lock.session_id, [lock.session_id],
                          f"{lock.kind} lock on {lock.session_id} held by {lock.holder} expired {age:.0f}s ago",
                          "cleared", extra={"kind": lock.kind, "table": lock.table, "holder": lock.holder,
                                            "expires_at": lock.expires_at})


def dead_holders(state: HomeState, lineages: list[Lineage]) -> Iterable[Finding]:
    for lock in state.locks:
        if lock.dead(state.now):
            left = (lock.expires_at or state.now) - state.now
            yield Finding("dead_lock_holder", lock.session_id, [lock.session_id],
                          f"{lock.kind} lock on {lock.session_id} held by {lock.holder}, whose process is gone "
                          f"(lease would run {left:.0f}s more)",
                          "cleared", extra={"kind": lock.kind, "table": lock.table, "holder": lock.holder,
                                            "expires_at": lock.expires_at})


def multiple_summaries(state: HomeState, lineages: list[Lineage]) -> Iterable[Finding]:
    for sid, rows in sorted(state.summaries.items()):
        session = state.sessions.get(sid)
        if session is not None and not session.ended and len(rows) > 1:
            yield Finding("multiple_live_summaries", sid, [sid],
                          f"{sid} has {len(rows)} live compaction summaries (rows {', '.join(map(str, rows))})",
                          count=len(rows), extra={"rows": rows})


def gone_snapshots(state: HomeState, lineages: list[Lineage]) -> Iterable[Finding]:
    for snapshot_id, sid, detail in state.gone_snapshots:
        yield Finding("snapshot_gone", sid, [sid], f"snapshot {snapshot_id}: {detail}",
                      extra={"snapshot_id": snapshot_id})


CHECKS: list[Check] = [
    rotated_lineages,
    forked_compressions,
    writes_after_end,
    empty_children,
    orphan_messages,
    routing_off_tip,
    expired_locks,
    dead_holders,
    multiple_summaries,
    gone_snapshots,
]


def diagnose(state: HomeState) -> tuple[list[Lineage], list[Finding]]:
    lineages = build_lineages(state.sessions)
    findings = [f for check in CHECKS for f in check(state, lineages)]
    return lineages, findings
