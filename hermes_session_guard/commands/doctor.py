"""``doctor``: list every corruption signature in an existing Hermes home, read-only."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from ..maintenance.config_findings import diagnose_config
from ..maintenance.corruption import SIGNATURES, diagnose
from ..maintenance.state_inspection import HomeError, load_home_state
from .output import EXIT_FOUND, emit_json, fail

HELP = "Find corrupted sessions in state.db and the gateway routing (read-only)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--strict", action="store_true", help="exit 1 on configuration findings too (warnings otherwise)")


def run(args: argparse.Namespace) -> int:
    try:
        state = load_home_state()
    except HomeError as exc:
        return fail(str(exc), args.json)
    lineages, findings = diagnose(state)
    counts = Counter(f.signature for f in findings)
    config = diagnose_config(state.home)
    strict_fail = bool(getattr(args, "strict", False) and config["findings"])
    if args.json:
        emit_json({
            "ok": not findings and not strict_fail,
            "home": str(state.home),
            "state_db": str(state.db_path),
            "state_db_exists": state.has_db,
            "sessions": len(state.sessions),
            "routing_entries": len(state.routing),
            "lock_tables": state.lock_tables,
            "counts": dict(counts),
            "signatures": SIGNATURES,
            "findings": [f.as_dict() for f in findings],
            "config": config,
        })
        return EXIT_FOUND if findings or strict_fail else 0
    print(f"Hermes home {state.home}")
    if not state.has_db and not findings:
        # a new install before its first session: the configuration is all there is to check, and matters most now
        print(f"state.db {state.db_path}: no Hermes sessions yet (Hermes has not stored one in this home)")
        print_config_findings(config)
        print("doctor: no sessions to check yet")
        return EXIT_FOUND if strict_fail else 0
    print(f"state.db {state.db_path}: {len(state.sessions)} sessions, {len(state.routing)} routing entries, "
          f"lock tables: {', '.join(state.lock_tables) or 'none'} (read-only)")
    print_config_findings(config)
    if not findings:
        print("doctor: no corruption found")
        return EXIT_FOUND if strict_fail else 0
    for f in findings:
        fix = f"repair: {f.repaired_by}" if f.repaired_by else "repair: not automatic, review by hand"
        print(f"[{f.signature}] {f.session_id}: {f.detail}  ({fix})")
    print("doctor: " + ", ".join(f"{n} {sig}" for sig, n in counts.items())
          + "; run `hermes-session-guard repair` to see what it would change")
    return EXIT_FOUND


def print_config_findings(config: dict[str, Any]) -> None:
    """Configuration warnings: signature, what, the one-line fix and the lines to paste."""
    if not config["checked"]:
        print(f"configuration: not checked ({config['reason']})")
        return
    where = f"{config['config']} against Hermes {config['hermes_version']}'s rules"
    if not config["findings"]:
        print(f"configuration: {where}: no findings")
        return
    print(f"configuration: {where}: {len(config['findings'])} warning(s)")
    for f in config["findings"]:
        print(f"  [{f['signature']}] {f['detail']}")
        print(f"    fix: {f['fix']}")
        print("    " + f["config_lines"].replace("\n", "\n    "))
