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
import sqlite3
import sys
from pathlib import Path
from typing import Any

from .. import host
from ..files import create_file
from ..host import facts
from ..maintenance.state_inspection import HomeError, check, write_problem
from ..store import GuardStore
from ..summaries import snapshot_export
from .output import argument_problem, display, fail

HELP = "Export a session as Hermes does (JSON line), with its snapshots (the compacted history)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("session_id")
    p.add_argument("-o", "--output", default="-", help="file to write (default: standard output)")


def output_problem(output: str) -> str | None:
    """Why ``-o`` cannot receive the export, checked before anything is read or written:
    its directory must exist and the name must be new: an existing file is refused
    (never a directory, device or symbolic link either), so an export never replaces a
    file with other contents, owner or mode."""
    out = Path(output)
    shown = display(output)
    parent = out.parent if str(out.parent) else Path(".")
    if os.path.lexists(out):
        if out.is_symlink():
            return f"cannot write {shown}: it is a symbolic link; name a regular file"
        if out.is_dir():
            return f"cannot write {shown}: it is a directory; name a file in it"
        if not out.is_file():
            return f"cannot write {shown}: it is not a regular file (use `-o -` for standard output)"
        return f"cannot write {shown}: it exists; remove it or name a new file (nothing written)"
    if not parent.exists():
        return f"cannot write {shown}: directory {display(str(parent))} does not exist"
    if not parent.is_dir():
        return f"cannot write {shown}: {display(str(parent))} is not a directory"
    return None


def run(args: argparse.Namespace) -> int:
    problem = argument_problem(args.session_id, "the session id")
    if problem is None and args.output != "-":
        problem = output_problem(args.output)
    if problem:
        return fail(problem, False)
    try:
        checked = check()
        # Hermes's SessionDB opens state.db for writing: a read-only home is refused here, not by a traceback
        problem = write_problem(checked.home, checked.db_path)
        if problem:
            raise HomeError(problem)
    except HomeError as exc:
        return fail(str(exc), False)
    if not checked.has_db:
        print(f"error: no session {display(args.session_id)} in {checked.home} (no Hermes sessions yet)",
              file=sys.stderr)
        return 1
    missing = facts.session_db_missing()
    if missing is not None:
        return fail(f"Hermes is not installed in this environment ({missing})", False)
    try:
        found = _export(checked.db_path, args.session_id)
    except sqlite3.Error as exc:
        return fail(f"cannot read {checked.db_path}: {exc}", False)
    if found is None:
        print(f"error: session {display(args.session_id)!r} not found", file=sys.stderr)
        return 1
    sid, data, snapshots = found
    line = json.dumps(data, ensure_ascii=False, default=str) + "\n"
    if args.output == "-":
        sys.stdout.write(line)
        return 0
    out = Path(args.output)
    try:
        create_file(out, line.encode("utf-8"))  # a new file, 0600; one created meanwhile is left alone
    except FileExistsError:
        return fail(f"cannot write {display(args.output)}: it exists; remove it or name a new file (nothing "
                    "written)", False)
    except OSError as exc:
        return fail(f"cannot write {display(args.output)}: {exc.strerror or exc}; nothing written", False)
    print(f"Exported session {display(sid)} ({len(data.get('messages') or [])} live messages, "
          f"{len(snapshots)} snapshot(s)) to {display(str(out))}")
    return 0


def _export(db_path: Path, session_id: str) -> tuple[str, dict[str, Any], list[Any]] | None:
    """Hermes's export of the session plus its snapshots (None when there is no such session)."""
    db = host.open_session_db(db_path)
    store = GuardStore(db_path)
    try:
        resolve = getattr(db, "resolve_session_id", None)
        sid = resolve(session_id) if resolve else session_id
        data = db.export_session(sid) if sid else None
        if not data:
            return None
        data = dict(data)
        data.pop("session_guard_snapshots", None)  # (added already where the guard's seam is installed)
        snapshots = snapshot_export.snapshots_for_export(store, [sid]).get(sid, [])
        if snapshots:
            data["session_guard_snapshots"] = snapshots
        return sid, data, snapshots
    finally:
        store.close()
        db.close()
