"""``handoff SESSION_ID [--note ...]``: write a hand-off packet for a session now.

Also the ``/handoff-packet [note]`` slash command (Hermes owns ``/handoff``).
Neither switches anything nor counts against ``handoff.max_auto_handoffs``: the
packet is written (redacted, mode 0600) under ``$HERMES_HOME/<handoff.artifact_dir>``
and its path is printed.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys

from ..config import ConfigError
from ..fail_open import failing_open
from ..handoff.packet import PathEscapeError
from ..hostinfo import installed_version
from ..maintenance.state_inspection import HomeError, check
from .output import argument_problem, fail

HELP = "Write a redacted hand-off packet for a session (nothing is switched)"
SLASH_NAME = "handoff-packet"
SLASH_HELP = "Write a redacted hand-off packet for this session (path in the reply; nothing is switched)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("session_id")
    p.add_argument("--note", help="a note to put at the top of the packet")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    from ..handoff.writer import write_requested_packet

    problem = argument_problem(args.session_id, "the session id") or argument_problem(
        args.note, "the --note text", required=False)
    if problem:
        return fail(problem, args.json)
    try:
        checked = check(writes=True)
    except HomeError as exc:
        return fail(str(exc), args.json)
    home = checked.home
    if installed_version() is None:
        return fail(f"hermes-agent is not installed in this Python environment ({sys.executable}); handoff reads "
                    "the session through Hermes's SessionDB: run it with the Python Hermes runs from", args.json)
    if not checked.has_db:
        print(f"error: no session {args.session_id} in {home} (no Hermes sessions yet)", file=sys.stderr)
        return 1
    try:
        path = write_requested_packet(None, args.session_id, args.note, via="hermes-session-guard handoff",
                                      home=home)
    except (PathEscapeError, ConfigError) as exc:
        print(f"error: refused: {exc}", file=sys.stderr)
        return 2
    except LookupError as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 1
    except sqlite3.Error as exc:  # a damaged page, a locked or unreadable state.db: as doctor/repair/export say it
        return fail(f"cannot read {checked.db_path}: {exc}", args.json)
    except OSError as exc:  # a link refused, a directory not writable: nothing was written
        return fail(f"cannot write the hand-off packet: {exc}; nothing written", args.json)
    if args.json:
        print(json.dumps({"session_id": args.session_id, "packet_path": str(path)}))
    else:
        print(path)
    return 0


def slash_command(raw_args: str) -> str:
    """``/handoff-packet [note]`` in the CLI or a gateway chat."""
    from .. import host
    from ..handoff.writer import write_requested_packet
    from ..runtime import current_runtime

    note = (raw_args or "").strip() or None
    sid = host.current_conversation_session()
    if not sid:
        return "No active session here to write a hand-off packet for."
    with failing_open("the /handoff-packet packet", "nothing was changed", level=None) as failed:
        try:
            path = write_requested_packet(current_runtime(), sid, note, via="/handoff-packet")
        except (PathEscapeError, ConfigError) as exc:
            return f"Hand-off packet refused: {exc}"
        except LookupError:
            return f"Session {sid} has nothing stored yet; send a message first."
    if failed:
        return f"Hand-off packet failed ({failed.reason}); nothing was changed."
    return (f"📝 Hand-off packet for session {sid} saved at `{path}`. Nothing was switched; "
            "send /new to start fresh and share the packet there.")
