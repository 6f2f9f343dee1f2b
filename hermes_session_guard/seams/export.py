"""Wrappers that keep compacted history where Hermes's own export looks (every release).

``export_session`` / ``export_all`` (``hermes sessions export``, the dashboard's export) add
each session's snapshots under ``session_guard_snapshots``. (Search over the snapshots, for
releases whose compacted rows leave Hermes's messages table, is :mod:`.legacy.search`'s.)
"""

from __future__ import annotations

from typing import Any

from ..runtime import Runtime
from ..summaries import snapshot_export
from .envelope import fails_as
from .row import Wrapper


def _with_snapshots(runtime: Runtime, db: Any, sessions: list[dict[str, Any]]) -> None:
    store = runtime.store_for(db.db_path)
    counts = snapshot_export.snapshot_counts(store)
    wanted = [s["id"] for s in sessions if isinstance(s, dict) and s.get("id") in counts]
    if not wanted:
        return
    found = snapshot_export.snapshots_for_export(store, wanted)
    for session in sessions:
        if isinstance(session, dict) and session.get("id") in found:
            session["session_guard_snapshots"] = found[session["id"]]


def export_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``SessionDB.export_session`` / ``export_all``: each exported session carries its
    snapshots (``session_guard_snapshots``: id, time, turns, the messages verbatim)."""

    @fails_as("the export holds Hermes's rows only; `hermes-session-guard snapshots SESSION` lists the compacted "
              "history", advice="doctor", once=True)
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        if isinstance(result, dict):
            _with_snapshots(runtime, instance, [result])
        elif isinstance(result, list):
            _with_snapshots(runtime, instance, result)
        return result

    return wrapper
