"""``status``: live locks, buffered messages, compressions and snapshots per session (read-only)."""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from .. import audit
from ..state_inspection import HomeError, HomeState, load_home_state
from .output import emit_json, fail

HELP = "Show live compression locks, buffered messages, compressions and snapshots per session"
OUTCOMES = ("done", "skipped", "failed")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def compressions_per_session(state: HomeState) -> dict[str, Counter[str]]:
    """Outcomes of the guard's compressions, from its audit log."""
    path = Path(state.config.audit.path)
    path = path if path.is_absolute() else state.home / path
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for event in audit.read_events(path):
        name = str(event.get("event", ""))
        if name.startswith("compression.") and name.split(".", 1)[1] in OUTCOMES and event.get("session_id"):
            out[str(event["session_id"])][name.split(".", 1)[1]] += 1
    return out


def build_status(state: HomeState) -> dict[str, Any]:
    locks = [{
        "kind": lk.kind, "table": lk.table, "session_id": lk.session_id, "holder": lk.holder,
        "age_seconds": round(state.now - lk.acquired_at, 1) if lk.acquired_at else None,
        "expires_in_seconds": round(lk.expires_at - state.now, 1) if lk.expires_at else None,
        "expired": lk.expired(state.now),
        "holder_process": lk.holder_liveness(),  # alive | dead | unknown (another machine, or Hermes's holder)
    } for lk in state.locks]
    comp = compressions_per_session(state)
    ids = sorted(set(comp) | set(state.snapshots) | set(state.buffered) | {lk.session_id for lk in state.locks})
    sessions = []
    for sid in ids:
        info = state.sessions.get(sid)
        sessions.append({
            "session_id": sid,
            "exists": info is not None,
            "ended": bool(info and info.ended),
            "end_reason": info.end_reason if info else None,
            "live_messages": info.live_rows if info else 0,
            "compressions": {k: comp.get(sid, Counter()).get(k, 0) for k in OUTCOMES},
            "snapshots": state.snapshots.get(sid, 0),
            "buffered": state.buffered.get(sid, 0),
        })
    return {"ok": True, "home": str(state.home), "state_db": str(state.db_path), "lock_tables": state.lock_tables,
            "buffer_tables": state.buffer_tables, "locks": locks, "sessions": sessions}


def run(args: argparse.Namespace) -> int:
    try:
        state = load_home_state()
    except HomeError as exc:
        return fail(str(exc), args.json)
    report = build_status(state)
    if args.json:
        emit_json(report)
        return 0
    print(f"Hermes home {state.home}")
    print(f"Compression locks ({', '.join(state.lock_tables) or 'no lock table in this state.db'}):")
    if not report["locks"]:
        print("  none held")
    for lk in report["locks"]:
        state_text = "EXPIRED" if lk["expired"] else f"expires in {lk['expires_in_seconds']:.0f}s"
        if lk["holder_process"] == "dead" and not lk["expired"]:
            state_text = "DEAD HOLDER (its process is gone; the next compression takes it over, repair clears it)"
        print(f"  {lk['session_id']}  {lk['kind']}  holder={lk['holder']}  age={lk['age_seconds']}s  {state_text}")
    if not state.buffer_tables:
        print("Buffered messages: no buffer table in this state.db")
    print("Sessions (compressions done/skipped/failed from the audit log, snapshots, buffered):")
    if not report["sessions"]:
        print("  none yet")
    for s in report["sessions"]:
        c = s["compressions"]
        where = "" if s["exists"] else "  (no session row)"
        ended = f"  ended: {s['end_reason']}" if s["ended"] else ""
        print(f"  {s['session_id']}  compressions={c['done']}/{c['skipped']}/{c['failed']}  "
              f"snapshots={s['snapshots']}  buffered={s['buffered']}  live_messages={s['live_messages']}"
              f"{ended}{where}")
    return 0
