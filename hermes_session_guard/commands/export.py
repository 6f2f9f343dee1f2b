"""``export SESSION_ID``: Hermes's own export of a session, with its compacted history.

``hermes sessions export`` runs without plugins on 0.13-0.17 (Hermes skips plugin
discovery for its built-in commands), so its file holds the live transcript only.
This writes the same JSON line (Hermes's ``SessionDB.export_session``) with the
session's snapshots under ``session_guard_snapshots``, each marked
``kind: session_guard_snapshot`` and its messages verbatim.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .. import host
from ..host import facts
from ..hostinfo import hermes_home, state_db_path
from ..store import GuardStore
from ..summaries import search_index

HELP = "Export a session as Hermes does (JSON line), with its snapshots (the compacted history)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("session_id")
    p.add_argument("-o", "--output", default="-", help="file to write (default: standard output)")


def run(args: argparse.Namespace) -> int:
    home = hermes_home()
    db_path = state_db_path(home)
    if not db_path.exists():
        print(f"error: no state.db at {db_path} (HERMES_HOME={home})", file=sys.stderr)
        return 2
    missing = facts.session_db_missing()
    if missing is not None:
        print(f"error: Hermes is not installed in this environment ({missing})", file=sys.stderr)
        return 2
    db = host.open_session_db(db_path)
    store = GuardStore(db_path)
    try:
        resolve = getattr(db, "resolve_session_id", None)
        sid = resolve(args.session_id) if resolve else args.session_id
        data = db.export_session(sid) if sid else None
        if not data:
            print(f"error: session {args.session_id!r} not found", file=sys.stderr)
            return 1
        data = dict(data)
        data.pop("session_guard_snapshots", None)  # (added already where the guard's seam is installed)
        snapshots = search_index.snapshots_for_export(store, [sid]).get(sid, [])
        if snapshots:
            data["session_guard_snapshots"] = snapshots
    finally:
        store.close()
        db.close()
    line = json.dumps(data, ensure_ascii=False, default=str) + "\n"
    if args.output == "-":
        sys.stdout.write(line)
        return 0
    out = Path(args.output)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(line)
    print(f"Exported session {sid} ({len(data.get('messages') or [])} live messages, "
          f"{len(snapshots)} snapshot(s)) to {out}")
    return 0
