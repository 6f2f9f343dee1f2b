"""``doctor``: list every corruption signature in an existing Hermes home, read-only."""

from __future__ import annotations

import argparse
from collections import Counter

from ..corruption import SIGNATURES, diagnose
from ..state_inspection import HomeError, load_home_state
from .output import EXIT_FOUND, emit_json, fail

HELP = "Find corrupted sessions in state.db and the gateway routing (read-only)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    try:
        state = load_home_state()
    except HomeError as exc:
        return fail(str(exc), args.json)
    lineages, findings = diagnose(state)
    counts = Counter(f.signature for f in findings)
    if args.json:
        emit_json({
            "ok": not findings,
            "home": str(state.home),
            "state_db": str(state.db_path),
            "state_db_exists": state.has_db,
            "sessions": len(state.sessions),
            "routing_entries": len(state.routing),
            "lock_tables": state.lock_tables,
            "counts": dict(counts),
            "signatures": SIGNATURES,
            "findings": [f.as_dict() for f in findings],
        })
        return EXIT_FOUND if findings else 0
    print(f"Hermes home {state.home}")
    if not state.has_db and not findings:
        print(f"state.db {state.db_path}: no Hermes sessions yet (Hermes has not stored one in this home)")
        print("doctor: nothing to check yet")
        return 0
    print(f"state.db {state.db_path}: {len(state.sessions)} sessions, {len(state.routing)} routing entries, "
          f"lock tables: {', '.join(state.lock_tables) or 'none'} (read-only)")
    if not findings:
        print("doctor: no corruption found")
        return 0
    for f in findings:
        fix = f"repair: {f.repaired_by}" if f.repaired_by else "repair: not automatic, review by hand"
        print(f"[{f.signature}] {f.session_id}: {f.detail}  ({fix})")
    print("doctor: " + ", ".join(f"{n} {sig}" for sig, n in counts.items())
          + "; run `hermes-session-guard repair` to see what it would change")
    return EXIT_FOUND
