"""Every snapshot of some sessions, verbatim, as Hermes's export carries it (every release):
``export_session`` / ``export_all`` (:mod:`hermes_session_guard.seams.export`) and the guard's own
``export`` command (:mod:`hermes_session_guard.commands.export`).

Nothing here imports Hermes; it reads the guard's own tables only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..store import GuardStore, SnapshotGone


def snapshots_for_export(store: GuardStore, session_ids: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """``session_id -> [snapshot, ...]``: every snapshot of these sessions with its
    messages verbatim, oldest first, each marked as a guard snapshot."""
    ids = list(dict.fromkeys(str(s) for s in session_ids))
    if not ids:
        return {}
    out: dict[str, list[dict[str, Any]]] = {}
    rows = store.read_all("SELECT snapshot_id, session_id, created_at, message_count, first_turn, last_turn, reason"
                          f" FROM session_guard_snapshots WHERE session_id IN ({','.join('?' for _ in ids)})"
                          " ORDER BY created_at, snapshot_id", ids)
    for snapshot_id, session_id, created_at, count, first, last, reason in rows:
        entry: dict[str, Any] = {
            "kind": "session_guard_snapshot",
            "snapshot_id": snapshot_id,
            "created_at": created_at,
            "reason": reason,
            "message_count": count,
            "first_turn": first,
            "last_turn": last,
        }
        try:
            entry["messages"] = store.snapshot_messages(snapshot_id)
        except SnapshotGone as exc:  # a reference whose rows Hermes no longer holds: said, not shortened
            entry["messages"], entry["gone"] = [], str(exc)
        out.setdefault(session_id, []).append(entry)
    return out


def snapshot_counts(store: GuardStore) -> dict[str, int]:
    return {str(sid): int(n) for sid, n in store.read_all(
        "SELECT session_id, COUNT(*) FROM session_guard_snapshots GROUP BY session_id")}
