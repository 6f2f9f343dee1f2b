"""``repair``: fix what ``doctor`` finds. A dry run unless ``--apply``.

``--apply`` refuses while a gateway runs on this home or another process is
writing state.db, when state.db is not a Hermes database, and when the installed
Hermes writes another schema version than the database has. Otherwise it makes
a consistent backup next to state.db first, then applies the plan through
Hermes's own SessionDB methods and the guard's store, and runs the diagnosis
again.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import host_adapter as host
from ..audit import AuditLog, new_op_id
from ..corruption import diagnose
from ..hostinfo import installed_version
from ..lineage_repair import apply_repair, backup_path_for, backup_state_db, database_busy, plan_repair
from ..state_inspection import HomeError, HomeState, load_home_state, write_problem
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


def run(args: argparse.Namespace) -> int:
    try:
        state = load_home_state()
    except HomeError as exc:
        return fail(str(exc), args.json)
    lineages, findings = diagnose(state)
    if args.apply and state.has_db:
        problem = write_problem(state.home, state.db_path) or refusal(state)
        if problem:
            return fail(f"repair refused: {problem}", args.json)
    try:
        plan = plan_repair(state, lineages, findings)
    except HomeError as exc:
        return fail(str(exc), args.json)

    if not args.apply or plan.empty:
        if args.json:
            emit_json({"ok": True, "applied": False, "dry_run": not args.apply, "nothing_to_do": plan.empty,
                       "plan": plan.as_dict()})
        else:
            if plan.empty:
                print("repair: nothing to repair")
            else:
                print("repair (dry run, nothing written); `repair --apply` would:")
                for line in plan.describe():
                    print(f"  {line}")
            for f in plan.not_repaired:
                print(f"not repaired automatically: [{f.signature}] {f.detail}")
        return 0

    backup = backup_state_db(state.db_path, backup_path_for(state.db_path))
    op_id = new_op_id()
    audit_path = Path(state.config.audit.path)
    audit = AuditLog(audit_path if audit_path.is_absolute() else state.home / audit_path)
    audit.operation("-", op_id).info("repair.started", state_db=str(state.db_path), backup=str(backup),
                                     lineages=len(plan.lineages), routing=len(plan.routing), locks=len(plan.locks))
    done = apply_repair(plan, state, op_id=op_id, audit=audit, host_version=installed_version(), backup=backup)
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
