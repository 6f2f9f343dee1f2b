"""Bring corrupted lineages back under their original id, per the contract.

``plan_repair`` is read-only: from a :class:`HomeState` and the rows of the
sessions involved it decides, for each rotated lineage (root ``R``):

* the **base**: the deepest session of the lineage that holds messages (for a
  fork, the oldest such child). Its live rows become ``R``'s live transcript;
  when the base is ``R`` itself, ``R``'s rows stay as they are.
* what else is live: rows written to an ended session after its compression
  end, and the genuinely new turns of other compression children (a fork's
  copies of its parent's rows and its own summary are not repeated), appended
  in the order they were written.
* the **snapshots**: every other session's live rows, stored verbatim under
  ``R`` as ``<R>.snapshot.<UTC ts>`` (the pre-compression history and every
  child's transcript). Nothing is deleted: on 0.18.2+ the host archives ``R``'s
  previous rows itself (``archive_and_compact``); on older hosts they are in a
  snapshot before ``replace_messages`` runs.

then re-points gateway routing that names a member (or a session an earlier
repair merged) to ``R``, clears expired compression locks and recreates the
rows of sessions whose messages lost their session row.

``apply_repair`` performs a plan through the host's SessionDB methods and the
guard's own store; ``backup_state_db`` is taken first by the command.

Why one module: the plan and its application must agree row for row;
keeping them side by side is what makes that reviewable.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import host
from ..fail_open import failing_open
from ..files import create_file
from ..seams.compression import snapshot_id_for
from ..store import GuardStore
from ..store.connection import connect
from .corruption import Finding
from .lineage import Lineage, first_child_row, late_rows
from .routing_plan import plan_routing
from .state_inspection import (
    MERGED_END_REASON,
    HomeState,
    LockRow,
    read_rows,
    read_system_prompt,
    registered_lock_tables,
)

REPAIR_MODE = "repair"
# End reasons that say nothing about the conversation being over: the host's rotation
# and its clean-up of continuation rows, and an earlier repair.
HOUSEKEEPING_END_REASONS = frozenset({host.COMPRESSION_END_REASON, MERGED_END_REASON, "orphaned_compression",
                                      "ws_orphan_reap"})
REPAIRED_SIGNATURES = (
    "rotated_lineage", "forked_compression", "writes_after_compression_end", "empty_compression_child",
    "orphan_messages", "routing_not_at_tip", "expired_compression_lock", "dead_lock_holder",
)


def _key(row: Mapping[str, Any]) -> tuple[Any, Any]:
    return row.get("role"), row.get("content")


def _is_summary(row: Mapping[str, Any]) -> bool:
    content = row.get("content")
    return isinstance(content, str) and host.carries_summary_marker(content)


def new_turns(rows: list[dict[str, Any]], ancestor_keys: set[tuple[Any, Any]]) -> list[dict[str, Any]]:
    """A compression child's rows after its compacted prefix. The prefix is what the
    compression wrote: copies of the parent's first and last turns around the summary;
    everything from the first row that is neither is a turn of its own."""
    for i, row in enumerate(rows):
        if not _is_summary(row) and _key(row) not in ancestor_keys:
            return rows[i:]
    return []


@dataclass
class Block:
    """Rows of one session that become live in the root."""

    source: str
    reason: str
    rows: list[dict[str, Any]]


@dataclass
class LineageRepair:
    root: str
    members: list[str]
    base: str
    mode: str  # "keep": the root's rows stay live | "rewrite": the live transcript is replaced
    base_rows: list[dict[str, Any]]
    appended: list[Block]
    snapshots: list[tuple[str, list[dict[str, Any]]]]
    merged: list[str]
    root_end_reason: str | None = None
    system_prompt: str | None = None

    @property
    def live(self) -> list[dict[str, Any]]:
        return [*self.base_rows, *(r for b in self.appended for r in b.rows)]

    def describe(self) -> list[str]:
        out = [f"lineage {self.root} ({len(self.members)} sessions: {', '.join(self.members)})"]
        for member, rows in self.snapshots:
            out.append(f"  keep {member}'s {len(rows)} live message(s) as a snapshot of {self.root}")
        if self.mode == "rewrite":
            out.append(f"  make {self.base}'s {len(self.base_rows)} message(s) the live transcript of {self.root}"
                       " (the previous live rows are archived by the host or kept in the snapshot above)")
        else:
            out.append(f"  keep {self.root}'s {len(self.base_rows)} live message(s)")
        for block in self.appended:
            out.append(f"  append {len(block.rows)} message(s) from {block.source} ({block.reason})")
        if self.system_prompt:
            out.append(f"  take {self.base}'s system prompt")
        out.append(f"  reopen {self.root}" + (f", then end it again ({self.root_end_reason}) as its last session "
                                               "was ended" if self.root_end_reason else ""))
        for member in self.merged:
            out.append(f"  mark {member} ended ({MERGED_END_REASON}); its rows stay where they are")
        out.append(f"  result: {self.root} has {len(self.live)} live message(s)")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "root": self.root, "members": self.members, "base": self.base, "mode": self.mode,
            "live_messages": len(self.live), "base_messages": len(self.base_rows),
            "appended": [{"source": b.source, "reason": b.reason, "messages": len(b.rows)} for b in self.appended],
            "snapshots": [{"source": m, "messages": len(rows)} for m, rows in self.snapshots],
            "merged": self.merged, "root_end_reason": self.root_end_reason,
            "takes_system_prompt": bool(self.system_prompt),
        }


@dataclass
class RoutingChange:
    where: str  # "table" | "file"
    session_key: str
    old: str
    new: str
    scope: str = ""
    entry_json: str | None = None

    def describe(self) -> str:
        place = f"gateway_routing (scope {self.scope})" if self.where == "table" else "sessions.json"
        return f"re-point {self.session_key} in {place}: {self.old} -> {self.new}"


def _describe_lock(lock: LockRow, now: float) -> str:
    if not lock.expired(now):  # planned because its holder's process is provably gone
        return f"clear the {lock.kind} lock on {lock.session_id} held by the dead process {lock.holder}"
    return (f"clear the expired {lock.kind} lock on {lock.session_id} (holder {lock.holder}, expired "
            f"{now - (lock.expires_at or now):.0f}s ago)")


@dataclass
class RepairPlan:
    now: float
    lineages: list[LineageRepair] = field(default_factory=list)
    routing: list[RoutingChange] = field(default_factory=list)
    locks: list[LockRow] = field(default_factory=list)  # expired, or held by a dead process
    orphans: dict[str, int] = field(default_factory=dict)
    not_repaired: list[Finding] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.lineages or self.routing or self.locks or self.orphans)

    def describe(self) -> list[str]:
        out: list[str] = []
        for lr in self.lineages:
            out.extend(lr.describe())
        out.extend(change.describe() for change in self.routing)
        out.extend(_describe_lock(lock, self.now) for lock in self.locks)
        out.extend(f"recreate the session row of {sid} ({n} message(s) without one)"
                   for sid, n in sorted(self.orphans.items()))
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "lineages": [lr.as_dict() for lr in self.lineages],
            "routing": [{"where": c.where, "scope": c.scope, "session_key": c.session_key, "old": c.old,
                         "new": c.new} for c in self.routing],
            "locks": [{"kind": lk.kind, "table": lk.table, "session_id": lk.session_id, "holder": lk.holder,
                       "expires_at": lk.expires_at} for lk in self.locks],
            "orphans": self.orphans,
            "not_repaired": [f.as_dict() for f in self.not_repaired],
        }


def plan_lineage(state: HomeState, lin: Lineage, rows: Mapping[str, list[dict[str, Any]]]) -> LineageRepair:
    sessions = state.sessions
    members = lin.members
    live = {sid: [r for r in rows.get(sid, []) if host.is_live_row(r)] for sid in members}
    holding = [sid for sid in members if live[sid]]
    base = min(holding, key=lambda sid: (-lin.depth(sid), sessions[sid].started_at, sid)) if holding else lin.root
    base_rows = live[base]
    blocks: list[Block] = []
    for sid in members:
        if sid == base:
            continue
        if lin.has_children(sid):
            late = set(late_rows(sessions[sid], state.marks.get(sid, []), first_child_row(lin, sid, sessions)))
            picked = [r for r in live[sid] if r["id"] in late]
            reason = "written after its compression end"
        else:
            picked = new_turns(live[sid], {_key(r) for a in lin.ancestors(sid) for r in rows.get(a, [])})
            reason = "turns of a parallel compression child"
        if picked:
            blocks.append(Block(sid, reason, picked))
    blocks.sort(key=lambda b: b.rows[0]["id"])
    snapshots = [(sid, live[sid]) for sid in members if sid != base and live[sid]]
    leaves = [sessions[sid] for sid in members if not lin.has_children(sid) and sid != lin.root]
    end_reason = None
    if leaves and all(s.ended and s.end_reason not in HOUSEKEEPING_END_REASONS for s in leaves):
        end_reason = max(leaves, key=lambda s: s.ended_at or 0.0).end_reason
    prompt = read_system_prompt(state.db_path, base) if base != lin.root else None
    # base == root only when no other session of the lineage holds a message, so a
    # kept root transcript never needs anything appended
    return LineageRepair(
        root=lin.root, members=members, base=base, mode="keep" if base == lin.root else "rewrite",
        base_rows=base_rows, appended=blocks, snapshots=snapshots, merged=[m for m in members if m != lin.root],
        root_end_reason=end_reason, system_prompt=prompt or None,
    )


def plan_repair(state: HomeState, lineages: list[Lineage], findings: list[Finding]) -> RepairPlan:
    plan = RepairPlan(now=state.now)
    rows = read_rows(state.db_path, [sid for lin in lineages for sid in lin.members]) if lineages else {}
    plan.lineages = [plan_lineage(state, lin, rows) for lin in lineages]
    # the same plan doctor reports (routing_not_at_tip)
    plan.routing = [RoutingChange(m.entry.where, m.entry.session_key, m.current, m.target, m.entry.scope,
                                  m.entry.entry_json) for m in plan_routing(state, lineages) if m.rewrite]
    plan.locks = [lk for lk in state.locks if lk.expired(state.now) or lk.dead(state.now)]
    plan.orphans = dict(state.orphan_rows)
    plan.not_repaired = [f for f in findings if f.signature not in REPAIRED_SIGNATURES]
    return plan


# -- performing a plan ----------------------------------------------------------------------


def backup_state_db(db_path: Path, target: Path) -> Path:
    """A consistent copy through SQLite's online backup API (safe while others read).
    The copy is created exclusively beside state.db before SQLite writes to it
    (:func:`~hermes_session_guard.files.create_file`: never a link followed, ``0600``
    whatever state.db's mode, the home's owner's when root runs the repair)."""
    create_file(target, b"", home=Path(db_path).parent)
    copied = False
    try:
        src = connect(db_path, read_only=True)
        try:
            dst = connect(target)
            try:
                src.backup(dst)
            finally:
                dst.close()
        finally:
            src.close()
        copied = True
    finally:
        if not copied:  # no half-made backup is left beside state.db
            with suppress(OSError):
                target.unlink()
    return target


def _clear_dead_holder(lock: LockRow, db: Any, store: GuardStore) -> bool:
    """Drop a lock whose holder's process is gone, qualified by that holder (a live
    process that took the lock over meanwhile keeps it): the guard's table directly,
    Hermes's ``compression_locks`` through its own holder-qualified release."""
    from ..locks.liveness import holder_dead

    if not lock.holder or not holder_dead(lock.holder):
        return False
    if lock.owned_by_guard:
        lt = next((t for t in registered_lock_tables() if t.table == lock.table), None)
        return lt is not None and store.clear_lock_of(table=lock.table, session_column=lt.session_column,
                                                holder_column=lt.holder_column, session_id=lock.session_id,
                                                holder=lock.holder)
    before = db.get_compression_lock_holder(lock.session_id)
    db.release_compression_lock(lock.session_id, lock.holder)
    return bool(before == lock.holder and db.get_compression_lock_holder(lock.session_id) != lock.holder)


def apply_repair(plan: RepairPlan, state: HomeState, *, op_id: str, audit: Any, host_version: str | None,
                 backup: Path | None) -> dict[str, Any]:
    """Perform ``plan``; returns what was written (snapshot ids per lineage, counts)."""
    db = host.open_session_db(state.db_path)
    store = GuardStore(state.db_path)
    done: dict[str, Any] = {"lineages": [], "routing": 0, "locks": 0, "orphans": 0}
    try:
        for lr in plan.lineages:
            log = audit.operation(lr.root, op_id)
            snapshot_ids = []
            for member, rows in lr.snapshots:
                created = time.time()
                snap_id = snapshot_id_for(lr.root, created, store.snapshot_exists)
                store.write_snapshot(snapshot_id=snap_id, session_id=lr.root,
                                     messages=[host.as_message(r) for r in rows], op_id=op_id,
                                     reason=f"repair: live transcript of {member}", host_version=host_version,
                                     host_mode=REPAIR_MODE, created_at=created)
                snapshot_ids.append(snap_id)
                log.info("repair.snapshot", snapshot_id=snap_id, source_session=member, messages=len(rows))
            how = "kept"
            if lr.mode == "rewrite":
                how = host.set_live_transcript(db, lr.root, [host.as_message(r) for r in lr.live])
            if lr.system_prompt:
                host.update_system_prompt(db, lr.root, lr.system_prompt)
            host.reopen_session(db, lr.root)
            for member in lr.merged:
                host.end_session(db, member, MERGED_END_REASON)
            if lr.root_end_reason:
                host.end_session(db, lr.root, lr.root_end_reason)
            original = {sid: {"ended_at": state.sessions[sid].ended_at, "end_reason": state.sessions[sid].end_reason}
                        for sid in lr.members}
            record = {**lr.as_dict(), "snapshot_ids": snapshot_ids, "written_with": how, "original": original}
            store.record_repair(op_id=op_id, session_id=lr.root, record=record,
                                backup_path=str(backup) if backup else None)
            log.info("repair.lineage", members=lr.members, base=lr.base, live_messages=len(lr.live),
                     snapshot_ids=snapshot_ids, written_with=how)
            done["lineages"].append({"root": lr.root, "snapshot_ids": snapshot_ids, "live_messages": len(lr.live)})

        file_changes = [c for c in plan.routing if c.where == "file"]
        for change in plan.routing:
            if change.where == "table":
                entry = json.loads(change.entry_json or "{}")
                entry["session_id"] = change.new
                host.save_routing_entry(db, change.scope, change.session_key, json.dumps(entry))
            audit.operation(change.new, op_id).info("repair.routing", session_key=change.session_key,
                                                    where=change.where, old_session_id=change.old)
        if file_changes and state.routing_file is not None and state.routing_file_data is not None:
            data = dict(state.routing_file_data)
            for change in file_changes:
                data[change.session_key] = {**data[change.session_key], "session_id": change.new}
            host.write_routing_file(state.routing_file, data, home=state.home)
        done["routing"] = len(plan.routing)

        for lock in plan.locks:
            if not lock.expired(plan.now):  # its holder is dead
                cleared = _clear_dead_holder(lock, db, store)
            elif lock.owned_by_guard:
                lt = next((t for t in registered_lock_tables() if t.table == lock.table), None)
                cleared = lt is not None and store.clear_expired_lock(
                    table=lock.table, session_column=lt.session_column, expires_column=lt.expires_column,
                    session_id=lock.session_id, now=time.time())
            else:
                cleared = host.clear_expired_native_lock(db, lock.session_id, f"session-guard-repair:{op_id}")
            done["locks"] += int(cleared)
            audit.operation(lock.session_id, op_id).info("repair.lock", kind=lock.kind, holder=lock.holder,
                                                         cleared=cleared)
        for sid in plan.orphans:
            host.ensure_session_row(db, sid)
            audit.operation(sid, op_id).info("repair.orphans", messages=plan.orphans[sid])
            done["orphans"] += 1
    finally:
        store.close()
        with failing_open("closing state.db after the repair", "the connection is left to be collected",
                          advice=None, level=logging.DEBUG):
            db.close()
    return done

