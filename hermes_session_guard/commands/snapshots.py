"""``snapshots SESSION_ID``: the immutable pre-compression transcripts of a session."""

from __future__ import annotations

import argparse
import json
import sys

from ..hostinfo import hermes_home, state_db_path
from ..store import GuardStore

HELP = "List a session's snapshots, or show one snapshot's messages"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("session_id")
    p.add_argument("--show", metavar="SNAPSHOT_ID", help="print this snapshot's messages")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    home = hermes_home()
    db = state_db_path(home)
    if not home.is_dir():
        print(f"error: HERMES_HOME {home} does not exist", file=sys.stderr)
        return 2
    if not db.exists():
        print(f"error: no state.db at {db}", file=sys.stderr)
        return 2
    store = GuardStore(db)
    try:
        if args.show:
            msgs = store.snapshot_messages(args.show, session_id=args.session_id)
            if not msgs and args.show not in {s.snapshot_id for s in store.list_snapshots(args.session_id)}:
                print(f"error: no snapshot {args.show} for session {args.session_id}", file=sys.stderr)
                return 1
            if args.json:
                print(json.dumps(msgs, ensure_ascii=False, indent=2))
            else:
                for i, m in enumerate(msgs, 1):
                    print(f"--- {i} {m.get('role')}\n{m.get('content')}")
            return 0
        snaps = store.list_snapshots(args.session_id)
        if args.json:
            print(json.dumps([s.as_dict() for s in snaps], indent=2))
        elif not snaps:
            print(f"no snapshots for {args.session_id}")
        else:
            for s in snaps:
                print(f"{s.snapshot_id}  messages={s.message_count}  created_at={s.created_at:.3f}  mode={s.host_mode}")
        return 0
    finally:
        store.close()
