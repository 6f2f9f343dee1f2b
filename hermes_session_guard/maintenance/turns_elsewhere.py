"""Turns the guard cannot see: Hermes running turns (and so compactions) in a process that
did not load the plugin (``status``, ``selftest``; read-only).

The guard protects only the processes that load it. Hermes can run turns elsewhere: a child
process that does not load plugins (upstream's ``plugins.isolation: host``,
``dashboard.turn_isolation``), a process started before the guard was enabled and never
restarted, or any Hermes with the plugin switched off for it. Two signs, each read from
what the home records, never from message text alone:

* **config.yaml asks for it**: ``plugins.isolation`` set to anything but ``none``/``off``,
  or ``dashboard.turn_isolation`` true;
* **state.db shows it**: compactions of Hermes's own since config.yaml was last written
  (the latest time the guard can have been enabled) with no record in
  ``session_guard_compressions``. The guard keeps every id, so a session that ended with
  ``end_reason = 'compression'`` (a rotation) is a compaction it did not run; and every
  compaction stores one new summary (Hermes's own summary marker), so summaries first stored
  after that time (each text once, in the session that stored it first: a copy carried into
  a later compaction or a hand-off child is not another), beyond the guard's
  ``done``/``failed`` records of the session then, are compactions without it (a rotation's
  child is counted once, as its parent's rotation). A guard that stepped aside records a
  ``failed`` row and is not counted.

Either sign means the home is not protected the way ``selftest`` would otherwise claim;
:func:`turns_elsewhere` returns the finding with one actionable line.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import host
from ..hostinfo import state_db_path
from .config_findings import isolation_settings, read_config
from .state_inspection import HomeError, readonly_connection

SIGNATURE = "turns_outside_the_guard"
_GUARD_TABLE = "session_guard_compressions"
_RECORDED = ("done", "failed")  # a guarded compaction's record (failed: it may have stepped aside)


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")}


def unguarded_compactions(db_path: Path, since: float) -> dict[str, int]:
    """Per session id, Hermes's compactions stored after ``since`` with no guard record."""
    if not db_path.exists():
        return {}
    with readonly_connection(db_path, snapshot=True) as conn:
        tables = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"sessions", "messages"} <= tables:
            return {}
        out: Counter[str] = Counter()
        children: set[str] = set()
        if {"end_reason", "ended_at"} <= _columns(conn, "sessions"):
            for parent, ended_at in conn.execute(
                    "SELECT id, ended_at FROM sessions WHERE end_reason = 'compression' AND ended_at >= ?", (since,)):
                out[str(parent)] += 1
                children.update(str(c[0]) for c in conn.execute(
                    "SELECT id FROM sessions WHERE parent_session_id = ? AND started_at >= ?", (parent, ended_at - 1)))
        # each summary text once, in the session where it was first stored, however often it was
        # carried forward (a later compaction's head, a hand-off child's seed); SQLite reads a bare
        # column of a MIN() aggregate from the row holding the minimum. Hermes's summary markers,
        # as host.carries_summary_marker tests them, in SQL.
        markers = host.summary_prefixes()
        has_marker = " OR ".join(["instr(content, ?) > 0"] * len(markers))
        summaries: Counter[str] = Counter(str(sid) for sid, _first in conn.execute(
            f"SELECT session_id, MIN(timestamp) FROM messages WHERE content IS NOT NULL AND ({has_marker}) "
            "GROUP BY content HAVING MIN(timestamp) >= ?", (*markers, since)))
        recorded: Counter[str] = Counter()
        if _GUARD_TABLE in tables:
            marks = ",".join("?" * len(_RECORDED))
            for (sid,) in conn.execute(f"SELECT session_id FROM {_GUARD_TABLE} WHERE started_at >= ? "
                                       f"AND phase IN ({marks})", (since - 1, *_RECORDED)):
                recorded[str(sid)] += 1
    for sid, n in summaries.items():
        surplus = n - recorded[sid] - (1 if sid in children else 0)
        if surplus > 0:
            out[sid] += surplus
    return dict(out)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def turns_elsewhere(home: Path, db_path: Path | None = None) -> dict[str, Any]:
    """The finding for an enabled ``home`` (JSON-ready): ``found`` and, when found, the
    settings and sessions behind it and one actionable ``line``."""
    config = home / "config.yaml"
    db_path = db_path if db_path is not None else state_db_path(home)
    try:
        cfg = read_config(home)
    except (OSError, ValueError) as exc:
        return {"signature": SIGNATURE, "checked": False, "found": False, "reason": str(exc)}
    since = config.stat().st_mtime if config.exists() else 0.0
    try:
        sessions = unguarded_compactions(db_path, since)
    except (HomeError, sqlite3.Error) as exc:
        return {"signature": SIGNATURE, "checked": False, "found": False, "reason": str(exc)}
    settings = isolation_settings(cfg)
    report: dict[str, Any] = {"signature": SIGNATURE, "checked": True, "found": bool(settings or sessions),
                              "settings": settings, "since": _iso(since),
                              "unguarded_compactions": sum(sessions.values()), "sessions": sorted(sessions)}
    if not report["found"]:
        return report
    why = []
    if settings:
        why.append(f"{config} runs turns in another process ({', '.join(settings)}), which does not load plugins")
    if sessions:
        why.append(f"{report['unguarded_compactions']} compaction(s) in {len(sessions)} session(s) since "
                   f"{report['since']} have no record of the guard: a process that did not load it ran them")
    report["line"] = (
        "NOT PROTECTED: Hermes runs turns the guard cannot see: " + "; ".join(why) + ". Fix: run turns in the "
        "process that loads the guard (remove plugins.isolation / dashboard.turn_isolation from config.yaml) and "
        "restart every Hermes process of this home (gateway, dashboard, CLI); `hermes-session-guard status` "
        "lists the sessions")
    return report
