"""``status``: per session, how close it is to compressing and how its compressions
went (pressure against the agent and hygiene thresholds, done/failed/skipped with
causes, last and p95 duration, snapshots and their size, buffered messages, lock
holder alive or dead), most pressed first; plus the compression locks (read-only).
With ``--session``, also each compaction of that session (op id, outcome, phase
times, messages, snapshot), one that crashed midway included."""

from __future__ import annotations

import argparse
from typing import Any

from ..maintenance.compaction_records import compaction_records
from ..maintenance.plugin_config import PluginConfigError, guard_enabled
from ..maintenance.session_pressure import build_sessions
from ..maintenance.state_inspection import HomeError, HomeState, load_home_state
from ..maintenance.turns_elsewhere import turns_elsewhere
from .output import emit_json, fail

HELP = "Per session: pressure against the compression thresholds, compressions, durations, snapshots, locks"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--session", metavar="ID", help="only this session")


def build_status(state: HomeState, session_id: str | None = None) -> dict[str, Any]:
    locks = [{
        "kind": lk.kind, "table": lk.table, "session_id": lk.session_id, "holder": lk.holder,
        "age_seconds": round(state.now - lk.acquired_at, 1) if lk.acquired_at else None,
        "expires_in_seconds": round(lk.expires_at - state.now, 1) if lk.expires_at else None,
        "expired": lk.expired(state.now),
        "holder_process": lk.holder_liveness(),  # alive | dead | unknown (elsewhere, or pid-only and running)
    } for lk in state.locks if session_id is None or lk.session_id == session_id]
    thresholds, sessions = build_sessions(state, None if session_id is None else [session_id])
    if session_id is not None and state.db_path.exists():
        for s in sessions:
            s["compactions"] = compaction_records(state.db_path, s["session_id"], state.now,
                                                  state.config.lock.lease_seconds)
    return {"ok": True, "home": str(state.home), "state_db": str(state.db_path), "state_db_exists": state.has_db,
            "turns_elsewhere": turns_seen_elsewhere(state), "lock_tables": state.lock_tables,
            "buffer_tables": state.buffer_tables, "thresholds": thresholds.as_dict(), "locks": locks,
            "sessions": sessions}


def turns_seen_elsewhere(state: HomeState) -> dict[str, Any] | None:
    """Where the guard is enabled: whether Hermes runs turns it cannot see (maintenance.turns_elsewhere)."""
    try:
        enabled, _ = guard_enabled(state.home)
    except PluginConfigError:
        return None
    return turns_elsewhere(state.home, state.db_path) if enabled else None


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.1f}s" if value >= 1000 else f"{value:.0f}ms"


def _size(n: int) -> str:
    if n < 1024:
        return f"{n}B"
    size = n / 1024
    for unit in ("KB", "MB"):
        if size < 1024:
            return f"{size:.1f}{unit}"
        size /= 1024
    return f"{size:.1f}GB"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def print_thresholds(t: dict[str, Any]) -> None:
    if t.get("agent_tokens"):
        print(f"Thresholds (Hermes {t['hermes_version']}, {t['model']}, window {t['context_length']:,} tokens from "
              f"{t['context_source']}): agent {t['agent_tokens']:,} tokens ({t['agent_percent']:.0%}), gateway "
              f"hygiene {t['hygiene_tokens']:,} ({t['hygiene_percent']:.0%})")
    else:
        print(f"Thresholds: main model window unknown ({t.get('context_source')}); set model.context_length "
              "to see pressure in percent")


def print_session(s: dict[str, Any]) -> None:
    c, h = s["compressions"], s["compression_history"]
    where = "" if s["exists"] else "  (no session row)"
    ended = f"  ended: {s['end_reason']}" if s["ended"] else ""
    print(f"  {s['session_id']}  compressions={c['done']}/{c['skipped']}/{c['failed']}  "
          f"snapshots={s['snapshots']}  buffered={s['buffered']}  live_messages={s['live_messages']}"
          f"{ended}{where}")
    print(f"      pressure: ~{s['estimated_tokens']:,} tokens = {_pct(s['agent_threshold_percent'])} of the agent "
          f"threshold, {_pct(s['hygiene_threshold_percent'])} of hygiene")
    adopted = f", {h['adopted']} adopted" if h.get("adopted") else ""
    print(f"      compressions: {c['done']} done, {c['failed']} failed, {c['skipped']} skipped{adopted}; "
          f"duration last {_ms(h['last_duration_ms'])}, p95 {_ms(h['p95_duration_ms'])}")
    for outcome, causes in h["causes"].items():
        for cause, n in causes.items():
            print(f"      {outcome} x{n}: {cause}")
    if s["snapshots"]:
        print(f"      snapshots: {s['snapshots']} holding {s['snapshot_messages']} messages, "
              f"{_size(s['snapshot_bytes'])}")
    for lk in s["lock_holders"]:
        state = "EXPIRED" if lk["expired"] else f"expires in {lk['expires_in_seconds']:.0f}s"
        print(f"      lock ({lk['kind']}): holder {lk['holder']} {lk['liveness'].upper()}, {state}")
    if "compactions" in s:
        print(f"      compactions recorded: {len(s['compactions'])}")
    for r in s.get("compactions", []):
        print_compaction(r)


def print_compaction(r: dict[str, Any]) -> None:
    after = "-" if r["messages_after"] is None else r["messages_after"]
    snapshot = f"  snapshot {r['snapshot_id']}" if r["snapshot_id"] else ""
    summary = f", summary {r['summary_chars']} chars" if r.get("summary_chars") else ""
    print(f"        {r['started_at']}  op {r['op_id']}  {r['outcome'].upper()}  ({r['strategy'] or '-'})  "
          f"messages {r['messages_before']} -> {after}{summary}{snapshot}")
    print(f"            lock wait {_ms(r['lock_wait_ms'])}, summary call {_ms(r['summary_ms'])}, "
          f"total {_ms(r['duration_ms'])}")
    if r["reason"]:
        print(f"            reason: {r['reason']}")


def run(args: argparse.Namespace) -> int:
    try:
        state = load_home_state()
    except HomeError as exc:
        return fail(str(exc), args.json)
    session_id = getattr(args, "session", None)
    if session_id and session_id not in state.sessions and session_id not in state.snapshots \
            and session_id not in state.buffered and not any(lk.session_id == session_id for lk in state.locks):
        return fail(f"no session {session_id} in {state.db_path}", args.json)
    report = build_status(state, session_id)
    if args.json:
        emit_json(report)
        return 0
    print(f"Hermes home {state.home}")
    if not state.has_db and not report["sessions"]:
        print(f"state.db {state.db_path}: no Hermes sessions yet (Hermes has not stored one in this home)")
        print("status: nothing yet: no locks, no buffered messages, no compressions, no snapshots")
        return 0
    elsewhere = report["turns_elsewhere"]
    if elsewhere and elsewhere["found"]:
        print(f"[{elsewhere['signature']}] {elsewhere['line']}")
        print(f"  sessions: {', '.join(elsewhere['sessions']) or '-'}")
    print_thresholds(report["thresholds"])
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
    print("Sessions, most pressed first (compressions done/skipped/failed from the audit log, snapshots, buffered):")
    if not report["sessions"]:
        print("  none yet")
    for s in report["sessions"]:
        print_session(s)
    return 0
