"""``repair``: fix what ``doctor`` finds. A dry run unless ``--apply``.

``--apply`` is exclusive per state.db (:mod:`..locks.repair_lock`: a second run
refuses with exit 2). Holding that lock it reads the home again and plans from
what it holds now, so a run after another finds nothing left to do. It refuses
while a gateway runs on this home, while any compression lock is live (the
guard's or Hermes's; a dead holder's is cleared instead), while another process
in which the guard runs is alive (:mod:`..locks.presence`), while another process is
writing state.db, when state.db is not a Hermes database, and when the installed
Hermes writes another schema version than the database has, saying which.
Otherwise it makes a consistent backup next to state.db first, then applies the
plan through Hermes's own SessionDB methods and the guard's store, and runs the
diagnosis again.
"""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path

from .. import host
from ..audit import AuditLog, new_op_id
from ..file_modes import link_on_the_way
from ..files import backup_path_for
from ..hostinfo import installed_version
from ..locks import presence, repair_lock
from ..maintenance.corruption import diagnose
from ..maintenance.lineage_repair import (
    RepairPlan,
    apply_repair,
    backup_state_db,
    plan_repair,
)
from ..maintenance.state_inspection import HomeError, HomeState, database_busy, load_home_state, write_problem
from ..store.connection import connect
from .output import EXIT_FOUND, emit_json, fail

HELP = "Repair corrupted lineages, routing and dead locks (dry run unless --apply)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--apply", action="store_true", help="write the changes (after a backup next to state.db)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def refusal(state: HomeState) -> str | None:
    """Why ``--apply`` must not write to this database now, or None."""
    host_schema = host.host_schema_version()
    if host_schema is None:
        return ("hermes-agent is not importable from this Python; run repair with the environment Hermes "
                "runs from (repair writes through Hermes's own SessionDB)")
    if state.schema_version != host_schema:
        return (f"state.db has schema version {state.schema_version}, the installed Hermes "
                f"{installed_version()} writes version {host_schema}; run repair from the Hermes release "
                "that last wrote this database")
    if host.gateway_running():
        return "a Hermes gateway is running on this HERMES_HOME; stop it (hermes gateway stop) and retry"
    busy = database_busy(state.db_path)
    if busy:
        return f"state.db is busy ({busy}): another Hermes process is writing to it; stop it and retry"
    return None


def live_activity(state: HomeState) -> str | None:
    """What is running on this home that a repair must not race, or None: a live
    compression lock (the guard's or Hermes's; a dead holder's lock is cleared by the
    repair itself) or another process in which the guard runs (an agent or gateway)."""
    held = [lk for lk in state.locks if not lk.expired(state.now) and not lk.dead(state.now)]
    found = [f"a compression holds the {lk.kind} lock on {lk.session_id} (holder {lk.holder}, "
             f"{lk.holder_liveness()})" for lk in held]
    try:
        conn = connect(state.db_path, read_only=True)
        try:
            others = presence.running(conn, now=state.now)
        finally:
            conn.close()
    except sqlite3.Error:
        others = []
    found += [f"a Hermes {p.kind} of this home is running with the guard: {p.describe(state.now)}" for p in others]
    if not found:
        return None
    return "; ".join(found) + "; let it finish or stop it, then retry"


def _planned(args: argparse.Namespace, state: HomeState, *, dry_run: bool) -> RepairPlan | int:
    """The repair plan for ``state``, or the exit code once it is said: a dry run's plan,
    nothing to repair, or why there is no plan."""
    lineages, findings = diagnose(state)
    try:
        plan = plan_repair(state, lineages, findings)
    except HomeError as exc:
        return fail(str(exc), args.json)
    if dry_run or plan.empty:
        _print_plan(args, plan, dry_run=dry_run)
        return 0
    return plan


def _print_plan(args: argparse.Namespace, plan: RepairPlan, *, dry_run: bool) -> None:
    if args.json:
        emit_json({"ok": True, "applied": False, "dry_run": dry_run, "nothing_to_do": plan.empty,
                   "plan": plan.as_dict()})
        return
    if plan.empty:
        print("repair: nothing to repair")
    else:
        print("repair (dry run, nothing written); `repair --apply` would:")
        for line in plan.describe():
            print(f"  {line}")
    for f in plan.not_repaired:
        print(f"not repaired automatically: [{f.signature}] {f.detail}")


def run(args: argparse.Namespace) -> int:
    try:
        state = load_home_state()
    except HomeError as exc:
        return fail(str(exc), args.json)
    if not args.apply or not state.has_db:  # a fresh home: nothing to repair, nothing to write
        planned = _planned(args, state, dry_run=True)
        return planned if isinstance(planned, int) else 0
    problem = write_problem(state.home, state.db_path) or refusal(state) or live_activity(state)  # again under the lock
    if problem:
        return fail(f"repair refused: {problem}", args.json)
    planned = _planned(args, state, dry_run=False)
    if isinstance(planned, int):  # nothing to repair: nothing is written, not even the repair lock
        return planned
    op_id = new_op_id()
    holder = repair_lock.new_holder(op_id)
    try:
        taken, other, since = repair_lock.acquire(state.db_path, holder)
    except sqlite3.Error as exc:
        return fail(f"repair refused: could not take the repair lock in state.db ({exc})", args.json)
    if not taken:
        age = f", started {state.now - since:.0f}s ago" if since else ""
        return fail(f"repair refused: another `repair --apply` is running on this state.db "
                    f"(holder {other}{age}); wait for it to finish", args.json)
    try:
        return _apply_exclusively(args, state.home, op_id)
    finally:
        repair_lock.release(state.db_path, holder)


def _apply_exclusively(args: argparse.Namespace, home: Path, op_id: str) -> int:
    """Holding the repair lock: read the home again and plan from what it holds now (an
    earlier repair may have just fixed it), refuse while anything runs on it, apply."""
    try:
        state = load_home_state(home)
    except HomeError as exc:
        return fail(str(exc), args.json)
    problem = refusal(state) or live_activity(state)
    if problem:
        return fail(f"repair refused: {problem}", args.json)
    plan = _planned(args, state, dry_run=False)  # an earlier repair may have just fixed it
    if isinstance(plan, int):
        return plan

    linked = (link_on_the_way(state.home, state.routing_file)
              if state.routing_file is not None and any(c.where == "file" for c in plan.routing) else None)
    if linked is not None:
        return fail(f"repair refused: {linked} is a symbolic link; the guard does not write through links "
                    "(sessions.json is rewritten by the repair); nothing changed", args.json)
    try:
        backup = backup_state_db(state.db_path, backup_path_for(state.db_path))
    except OSError as exc:
        return fail(f"repair refused: cannot write the backup of {state.db_path}: {exc}; nothing changed", args.json)
    audit = AuditLog.for_home(state.home, state.config.audit.path)
    audit.operation("-", op_id).info("repair.started", state_db=str(state.db_path), backup=str(backup),
                                     lineages=len(plan.lineages), routing=len(plan.routing), locks=len(plan.locks))
    try:
        done = apply_repair(plan, state, op_id=op_id, audit=audit, host_version=installed_version(), backup=backup)
    except OSError as exc:  # a file the repair rewrites could not be written (a link swapped in meanwhile, a full disk)
        return fail(f"repair stopped: {exc}; state.db as it was before is in {backup}", args.json)
    after = load_home_state(state.home)
    _, remaining = diagnose(after)
    left = [f for f in remaining if f.repaired_by]
    audit.operation("-", op_id).info("repair.done", remaining=len(left), **{k: v for k, v in done.items()
                                                                              if k != "lineages"})
    if args.json:
        emit_json({"ok": not left, "applied": True, "backup": str(backup), "op_id": op_id, "plan": plan.as_dict(),
                   "done": done, "remaining": [f.as_dict() for f in remaining]})
    else:
        print(f"backup: {backup}")
        for line in plan.describe():
            print(f"  done: {line}")
        for f in remaining:
            print(f"still found: [{f.signature}] {f.detail}")
        print("repair: " + ("done" if not left else f"{len(left)} finding(s) remain; see above"))
    return EXIT_FOUND if left else 0
