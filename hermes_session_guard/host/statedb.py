"""state.db and the gateway routing index for the operator commands: doctor
and status read Hermes's tables by plain SQL on a read-only connection (the host offers
no read-only API on every release); repair writes Hermes data only through the
SessionDB methods here. Also opening Hermes's own ``SessionDB``."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..fail_open import failing_open
from ..files import atomic_write_text
from .agent import db_path, session_db
from .markers import SUMMARY_MARKERS

log = logging.getLogger("hermes_session_guard")

COMPRESSION_END_REASON = "compression"
ROUTING_FILE = Path("sessions") / "sessions.json"
NATIVE_LOCK_TABLE = "compression_locks"
ROUTING_TABLE = "gateway_routing"
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "sessions": ("id", "source", "parent_session_id", "started_at", "ended_at", "end_reason"),
    "messages": ("id", "session_id", "role", "content", "timestamp"),
}
# model_config keys that mark a child as a branch or a delegate, not a continuation (0.19)
NON_CONTINUATION_MARKERS = ("_branched_from", "_delegate_from")
_JSON_COLUMNS = ("tool_calls", "reasoning_details", "codex_reasoning_items", "codex_message_items")
_ROW_ONLY_KEYS = ("id", "session_id", "active", "compacted")


def table_columns(conn: Any, table: str) -> set[str]:
    return {str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")}


def read_sessions(conn: Any) -> list[dict[str, Any]]:
    cols = table_columns(conn, "sessions")
    wanted = [c for c in ("id", "source", "parent_session_id", "started_at", "ended_at", "end_reason",
                          "model_config") if c in cols]
    rows = conn.execute(f"SELECT {', '.join(wanted)} FROM sessions ORDER BY started_at, id").fetchall()
    return [dict(zip(wanted, r, strict=True)) for r in rows]


def _live_clause(conn: Any) -> str:
    return " AND active = 1" if "active" in table_columns(conn, "messages") else ""


def read_message_stats(conn: Any) -> dict[str, dict[str, Any]]:
    """Per session id (including ids with no session row): row count, live row count,
    first row id and the last timestamp."""
    live = "SUM(active)" if "active" in table_columns(conn, "messages") else "COUNT(*)"
    out: dict[str, dict[str, Any]] = {}
    for sid, count, live_count, first_id, last_ts in conn.execute(
        f"SELECT session_id, COUNT(*), {live}, MIN(id), MAX(timestamp) FROM messages GROUP BY session_id"
    ):
        out[str(sid)] = {"count": int(count), "live": int(live_count or 0), "first_id": first_id, "last_ts": last_ts}
    return out


def read_message_marks(conn: Any, session_ids: list[str]) -> dict[str, list[tuple[int, float]]]:
    """``(row id, timestamp)`` of every row of the given sessions, in row order."""
    out: dict[str, list[tuple[int, float]]] = {sid: [] for sid in session_ids}
    for sid in session_ids:
        out[sid] = [(int(i), float(ts or 0.0)) for i, ts in conn.execute(
            "SELECT id, timestamp FROM messages WHERE session_id = ? ORDER BY id", (sid,))]
    return out


def read_session_rows(conn: Any, sid: str) -> list[dict[str, Any]]:
    """Every stored row of ``sid`` (all columns, live or archived), in row order."""
    cur = conn.execute("SELECT * FROM messages WHERE session_id = ? ORDER BY id", (sid,))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def is_live_row(row: dict[str, Any]) -> bool:
    return row.get("active", 1) in (1, None)


def session_exists(conn: Any, sid: str) -> bool:
    """Whether Hermes's ``sessions`` table has a row ``sid``."""
    return conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is not None


def read_system_prompt(conn: Any, sid: str) -> str | None:
    if "system_prompt" not in table_columns(conn, "sessions"):
        return None
    row = conn.execute("SELECT system_prompt FROM sessions WHERE id = ?", (sid,)).fetchone()
    return row[0] if row else None


def read_summary_rows(conn: Any) -> dict[str, list[int]]:
    """Live rows that carry a compaction summary (standalone or merged), per session."""
    like = " OR ".join("content LIKE ?" for _ in SUMMARY_MARKERS)
    out: dict[str, list[int]] = {}
    for sid, mid in conn.execute(
        f"SELECT session_id, id FROM messages WHERE ({like}){_live_clause(conn)} ORDER BY id",
        tuple(f"%{m}%" for m in SUMMARY_MARKERS),
    ):
        out.setdefault(str(sid), []).append(int(mid))
    return out


def read_schema_version(conn: Any) -> int | None:
    try:
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    except sqlite3.Error as exc:  # no schema_version table: unknown
        log.debug("session guard: reading schema_version failed (%s: %s)", type(exc).__name__, exc)
        return None
    return int(row[0]) if row and row[0] is not None else None


def read_routing_table(conn: Any) -> list[dict[str, Any]]:
    """Rows of ``gateway_routing`` (0.19+); an empty list where the table does not exist."""
    if not table_columns(conn, ROUTING_TABLE):
        return []
    out = []
    for scope, key, entry_json in conn.execute(
        f"SELECT scope, session_key, entry_json FROM {ROUTING_TABLE} ORDER BY scope, session_key"
    ):
        try:
            entry = json.loads(entry_json)
        except (TypeError, ValueError):
            entry = None
        out.append({"scope": scope, "session_key": key, "entry_json": entry_json,
                    "session_id": entry.get("session_id") if isinstance(entry, dict) else None})
    return out


def read_routing_file(home: Path) -> tuple[Path, dict[str, Any] | None]:
    """``sessions/sessions.json``: the routing index on 0.14, a mirror of the table on 0.19.
    ``None`` when the file does not exist; ValueError when it is not a JSON object."""
    path = home / ROUTING_FILE
    if not path.exists():
        return path, None
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return path, data


def routing_file_entries(data: dict[str, Any] | None) -> dict[str, str]:
    """``session_key -> session_id`` of a sessions.json mapping (sentinel keys skipped)."""
    out: dict[str, str] = {}
    for key, entry in (data or {}).items():
        if not key.startswith("_") and isinstance(entry, dict) and entry.get("session_id"):
            out[key] = str(entry["session_id"])
    return out


def write_routing_file(path: Path, data: dict[str, Any], *, home: Path | None = None) -> None:
    """Rewrite sessions.json the way the gateway does: a temp file in the same
    directory, then an atomic replace (fsynced, see :func:`atomic_write_text`). The file
    keeps its owner, group and mode; under ``home`` no link is followed (a linked
    ``sessions/`` or ``sessions.json`` is refused)."""
    atomic_write_text(path, json.dumps(data, indent=2), home=home)


def host_schema_version() -> int | None:
    """The state.db schema version the installed Hermes writes (None: not installed)."""
    try:
        import hermes_state
    except ImportError as exc:
        log.debug("session guard: hermes_state is not importable (%s: %s)", type(exc).__name__, exc)
        return None
    value = getattr(hermes_state, "SCHEMA_VERSION", None)
    if value is None:  # 0.21+: hermes_state is split, the constant lives in hermes_state_common
        try:
            import hermes_state_common
        except ImportError:
            return None
        value = getattr(hermes_state_common, "SCHEMA_VERSION", None)
    return int(value) if isinstance(value, int) else None


def gateway_running() -> bool | None:
    """Whether a gateway holds this ``HERMES_HOME``'s runtime lock (None: cannot tell)."""
    try:
        from gateway import status
    except ImportError as exc:
        log.debug("session guard: gateway.status is not importable (%s: %s)", type(exc).__name__, exc)
        return None
    with failing_open("the gateway runtime lock check", "whether a gateway runs is unknown", level=logging.DEBUG,
                      advice=None):
        return bool(status.is_gateway_runtime_lock_active())
    return None


_OPEN_ATTEMPTS = 5


def open_session_db(path: Path) -> Any:
    """Hermes's own ``SessionDB`` on ``path``. Opening runs the release's schema check,
    which on 0.19 probes the FTS tables; an opener racing another one can see a
    transient ``sqlite3.OperationalError`` (busy, or ``vtable constructor failed``).
    Such an open is retried a few times with a short backoff before the error stands."""
    from hermes_state import SessionDB

    for attempt in range(1, _OPEN_ATTEMPTS + 1):
        try:
            return SessionDB(db_path=Path(path))
        except sqlite3.OperationalError as exc:
            if attempt == _OPEN_ATTEMPTS:
                raise
            log.warning("session guard: opening %s failed (%s: attempt %d of %d); retrying",
                        path, type(exc).__name__, attempt, _OPEN_ATTEMPTS)
            time.sleep(0.05 * attempt)
    raise AssertionError("unreachable")  # pragma: no cover


def as_message(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row as a message dict the SessionDB writers accept (JSON columns decoded,
    row bookkeeping dropped, original timestamp kept where the host honours it)."""
    msg = {k: v for k, v in row.items() if k not in _ROW_ONLY_KEYS and (v is not None or k in ("role", "content"))}
    for key in _JSON_COLUMNS:
        if isinstance(msg.get(key), str):
            try:
                msg[key] = json.loads(msg[key])
            except ValueError:
                pass
    return msg


def set_live_transcript(db: Any, sid: str, messages: list[dict[str, Any]]) -> str:
    """Make ``messages`` the live transcript of ``sid`` in one host transaction.
    0.18.2+: ``archive_and_compact`` keeps the previous rows (inactive, searchable);
    older hosts: ``replace_messages`` (the caller keeps those rows as a snapshot first)."""
    if callable(getattr(db, "archive_and_compact", None)):
        db.archive_and_compact(sid, messages)
        return "archive_and_compact"
    db.replace_messages(sid, messages)
    return "replace_messages"


def reopen_session(db: Any, sid: str) -> None:
    db.reopen_session(sid)


def end_session(db: Any, sid: str, reason: str) -> None:
    """End ``sid`` with ``reason``; an already ended session is re-ended (the host's
    ``end_session`` keeps the first reason, so it is reopened first)."""
    db.reopen_session(sid)
    db.end_session(sid, reason)


def ensure_session_row(db: Any, sid: str, source: str = "unknown") -> None:
    db.ensure_session(sid, source=source)


def update_system_prompt(db: Any, sid: str, prompt: str) -> None:
    db.update_system_prompt(sid, prompt)


def save_routing_entry(db: Any, scope: str, key: str, entry_json: str) -> None:
    db.save_gateway_routing_entry(key, entry_json, scope=scope)


@contextmanager
def session_db_for(agent: Any) -> Iterator[Any]:
    """The agent's SessionDB, or one opened (and closed again) on its state.db
    (0.14's gateway hygiene agent has none)."""
    own = session_db(agent)
    if own is not None:
        yield own
        return
    db = open_session_db(db_path(agent))
    try:
        yield db
    finally:
        with failing_open("closing the SessionDB", "its connection is left to the garbage collector",
                          level=logging.DEBUG, advice=None):
            db.close()
