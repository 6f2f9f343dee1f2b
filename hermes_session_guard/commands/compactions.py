"""``/compactions [session id]``: a session's recorded compactions, typed in Hermes's CLI, the
TUI or a gateway chat (Hermes's plugin command registration; the name clashes with no
built-in: Hermes's own is ``/compress``, alias ``/compact``). Without an argument, the session
it was typed in. The same records as ``status --session`` (newest last): op id, outcome,
messages before -> after, times, snapshot. Ids, counts and times only, never message text;
the original turns a compaction replaced open from the dashboard's Compactions tab or
``snapshots SESSION --show SNAPSHOT``."""

from __future__ import annotations

import time
from typing import Any

from ..fail_open import failing_open
from .output import argument_problem

SLASH_NAME = "compactions"
SLASH_HELP = "List this session's context compactions (op, outcome, messages, snapshot), or another session's"


def _seconds(ms: Any) -> str:
    return "-" if ms is None else f"{float(ms) / 1000:.1f}s"


def compaction_line(r: dict[str, Any]) -> str:
    """One record as one line (ids, outcome, counts, times)."""
    after = "-" if r.get("messages_after") is None else r["messages_after"]
    snapshot = f", snapshot {r['snapshot_id']}" if r.get("snapshot_id") else ""
    reason = f" ({r['reason']})" if r.get("reason") and r.get("outcome") != "done" else ""
    return (f"{r.get('started_at') or '-'}  op {r.get('op_id')}  {str(r.get('outcome') or '-').upper()}{reason}: "
            f"messages {r.get('messages_before')} -> {after}, summary call {_seconds(r.get('summary_ms'))}, "
            f"total {_seconds(r.get('duration_ms'))}{snapshot}")


def slash_command(raw_args: str) -> str:
    """``/compactions [session id]`` in the CLI, the TUI or a gateway chat."""
    from .. import host
    from ..maintenance.compaction_records import compaction_records
    from ..runtime import current_runtime

    wanted = (raw_args or "").strip()
    if wanted and (argument_problem(wanted, "the session id") or len(wanted.split()) != 1):
        return "Usage: /compactions [session id]"
    sid = wanted or host.current_conversation_session()
    if not sid:
        return "No active session here; name one: /compactions <session id>"
    runtime = current_runtime()
    if runtime is None:
        return "The session guard is not on in this process: no compactions to list."
    records: list[dict[str, Any]] = []
    with failing_open("the /compactions listing", "nothing was changed", level=None) as failed:
        db = runtime.db_for_session(sid)
        records = compaction_records(db, sid, time.time(), runtime.config.lock.lease_seconds) if db.is_file() else []
    if failed:
        return f"Could not read the compactions of {sid} ({failed.reason})."
    if not records:
        return f"No compaction recorded for session {sid}."
    lines = [f"Compactions of session {sid}: {len(records)} (oldest first)"]
    lines += [f"  {compaction_line(r)}" for r in records]
    lines.append("The turns a compaction replaced: the dashboard's Compactions tab (Open), or "
                 f"`hermes-session-guard snapshots {sid} --show <snapshot>`.")
    return "\n".join(lines)
