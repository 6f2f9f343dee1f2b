"""``snapshots SESSION_ID``: the immutable pre-compression transcripts of a session (read-only)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from .. import host
from ..maintenance.state_inspection import HomeError, check, readonly_connection
from ..store import (
    SnapshotGone,
    SnapshotInfo,
    _row_message,
    read_snapshot_infos,
    read_snapshot_references,
    reference_problem,
)
from .output import display, fail

HELP = "List a session's snapshots, or show one snapshot's messages (read-only)"

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("session_id")
    p.add_argument("--show", metavar="SNAPSHOT_ID", help="print this snapshot's messages")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def iso_utc(ts: float) -> str:
    """``1795695917.033`` -> ``2026-11-26T14:25:17.033Z`` (ISO 8601, UTC, milliseconds)."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def snapshot_dict(info: SnapshotInfo) -> dict[str, Any]:
    return {**info.as_dict(), "created_at_iso": iso_utc(info.created_at)}


def read_snapshot_messages(conn: Any, session_id: str, snapshot_id: str) -> list[dict[str, Any]]:
    """A snapshot's messages: Hermes's own rows for a snapshot by reference (native mode;
    :class:`SnapshotGone` when Hermes no longer holds them as they were), else the copy."""
    for ref_id, sid, runs, count, digest in read_snapshot_references(conn):
        if ref_id == snapshot_id:
            if sid != session_id:
                return []
            msgs = host.rows_by_runs(conn, sid, runs)
            problem = reference_problem(msgs, count, digest)
            if problem is not None:
                raise SnapshotGone(f"snapshot {snapshot_id} names rows of session {sid} that Hermes no longer holds "
                                   f"as they were ({problem}); see `hermes-session-guard doctor`")
            return msgs
    rows = conn.execute(
        "SELECT m.message_json, m.content FROM session_guard_snapshot_messages m"
        " JOIN session_guard_snapshots s ON s.snapshot_id = m.snapshot_id"
        " WHERE m.snapshot_id = ? AND s.session_id = ? ORDER BY m.position", (snapshot_id, session_id)).fetchall()
    return [_row_message(r[0], r[1]) for r in rows]


def run(args: argparse.Namespace) -> int:
    try:
        checked = check()
        snaps: list[SnapshotInfo] = []
        msgs: list[dict[str, Any]] = []
        known = False
        if checked.has_db:
            with readonly_connection(checked.db_path, snapshot=True) as conn:
                snaps = read_snapshot_infos(conn, args.session_id)
                known = bool(snaps) or host.session_exists(conn, args.session_id)
                if args.show and args.show in {s.snapshot_id for s in snaps}:
                    msgs = read_snapshot_messages(conn, args.session_id, args.show)
    except HomeError as exc:
        return fail(str(exc), args.json)
    except SnapshotGone as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not known:  # a typo must not read as "this session has no snapshots"
        fresh = "" if checked.has_db else " (no Hermes sessions in this home yet)"
        return fail(f"no session {display(args.session_id)} in {checked.home}{fresh}", args.json)
    if args.show:
        if args.show not in {s.snapshot_id for s in snaps}:
            print(f"error: no snapshot {args.show} for session {args.session_id}", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps(msgs, ensure_ascii=False, indent=2))
        else:
            for i, m in enumerate(msgs, 1):
                print(f"--- {i} {m.get('role')}\n{m.get('content')}")
        return 0
    if args.json:
        print(json.dumps([snapshot_dict(s) for s in snaps], indent=2))
    elif not snaps:
        print(f"no snapshots for {args.session_id}")
    else:
        for s in snaps:
            print(f"{s.snapshot_id}  messages={s.message_count}  created={iso_utc(s.created_at)}  mode={s.host_mode}")
    return 0
