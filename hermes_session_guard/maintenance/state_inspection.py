"""Read a Hermes home for the operator commands, without writing anything.

:func:`check` is the one home check every command makes first (the home exists,
config.yaml is UTF-8 YAML with a valid ``session_guard:`` section, state.db, if
there is one yet, is a regular, complete Hermes database; optionally that it can
be written now) and raises :class:`HomeError` with one operator-facing sentence
when it is not. ``load_home_state`` then reads state.db through a read-only
SQLite connection that creates no file, inside one read transaction, plus the
gateway routing (``gateway_routing`` table on 0.19, ``sessions/sessions.json`` on
every release).

Why one module: the home check and the read-only snapshot of a home share
one connection discipline (read-only URI, one read transaction) that every command relies on.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import host
from ..config import ConfigError, GuardConfig, load_config
from ..hooks.manager import get_plugin_manager
from ..hooks.specs import BufferTable, LockTable
from ..hostinfo import hermes_home, state_db_path
from ..store import read_snapshot_counts, read_snapshot_references, reference_problem
from ..store.connection import connect

BUSY_TIMEOUT_SECONDS = 2.0
MERGED_END_REASON = "session_guard_merged"


class HomeError(Exception):
    """The home or its state.db cannot be used; the message says why and what to do."""


@dataclass
class SessionInfo:
    id: str
    source: str | None
    parent_id: str | None
    started_at: float
    ended_at: float | None
    end_reason: str | None
    model_config: str | None = None
    rows: int = 0
    live_rows: int = 0
    first_row_id: int | None = None
    last_ts: float | None = None

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    @property
    def ended_by_compression(self) -> bool:
        return self.end_reason == host.COMPRESSION_END_REASON

    @property
    def merged(self) -> bool:
        return self.end_reason == MERGED_END_REASON

    @property
    def may_continue_a_compression(self) -> bool:
        """Not a branch, delegate or tool child (the markers 0.19 writes)."""
        if (self.source or "") == "tool":
            return False
        return not any(marker in (self.model_config or "") for marker in host.NON_CONTINUATION_MARKERS)

    @property
    def last_activity(self) -> float:
        return max(self.last_ts or 0.0, self.started_at or 0.0)


@dataclass
class RoutingEntry:
    """One gateway routing binding: ``where`` is ``table`` (scope set) or ``file``."""

    where: str
    session_key: str
    session_id: str | None
    scope: str = ""
    entry_json: str | None = None

    @property
    def label(self) -> str:
        return f"{self.session_key} ({'gateway_routing' if self.where == 'table' else 'sessions.json'})"


@dataclass
class LockRow:
    kind: str
    table: str
    session_id: str
    holder: str | None
    acquired_at: float | None
    expires_at: float | None
    owned_by_guard: bool

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at < now

    def holder_liveness(self) -> str:
        """``alive``, ``dead`` or ``unknown`` (see :mod:`..locks.liveness`)."""
        from ..locks.liveness import holder_liveness

        return holder_liveness(self.holder)

    def dead(self, now: float) -> bool:
        """Unexpired, but its holder's process is provably gone (crashed or killed)."""
        return not self.expired(now) and self.holder_liveness() == "dead"


@dataclass
class HomeState:
    home: Path
    db_path: Path
    config: GuardConfig
    now: float
    schema_version: int | None = None
    sessions: dict[str, SessionInfo] = field(default_factory=dict)
    orphan_rows: dict[str, int] = field(default_factory=dict)
    marks: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    summaries: dict[str, list[int]] = field(default_factory=dict)
    routing: list[RoutingEntry] = field(default_factory=list)
    routing_file: Path | None = None
    routing_file_data: dict[str, Any] | None = None
    locks: list[LockRow] = field(default_factory=list)
    lock_tables: list[str] = field(default_factory=list)
    buffered: dict[str, int] = field(default_factory=dict)
    buffer_tables: list[str] = field(default_factory=list)
    snapshots: dict[str, int] = field(default_factory=dict)
    # snapshots by reference whose rows Hermes no longer holds as they were: (snapshot, session, detail)
    gone_snapshots: list[tuple[str, str, str]] = field(default_factory=list)
    has_db: bool = True  # False: a fresh home, no Hermes sessions schema in state.db yet (see CheckedHome)


def check_home(home: Path | None = None) -> tuple[Path, GuardConfig]:
    """The home exists and its ``session_guard:`` section is valid."""
    home = Path(home) if home is not None else hermes_home()
    if not home.exists():
        which = ("HERMES_HOME" if os.environ.get("HERMES_HOME", "").strip()
                 else "the default Hermes home (HERMES_HOME is unset)")
        raise HomeError(f"{which} {home} does not exist: Hermes creates it the first time it runs; run `hermes setup` "
                        "(or `hermes` once) as the user Hermes runs as, then run this command again; if Hermes "
                        "runs with another home, set HERMES_HOME to it")
    if not home.is_dir():
        raise HomeError(f"HERMES_HOME {home} is not a directory")
    try:
        config = load_config(home)
    except ConfigError as exc:
        if exc.key.endswith("(file)"):
            raise HomeError(f"{str(exc).split(': ', 1)[-1]}; fix it and retry") from exc
        raise HomeError(f"invalid option in {home / 'config.yaml'}: {exc}; fix it and retry") from exc
    except UnicodeDecodeError as exc:
        raise HomeError(f"{home / 'config.yaml'} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                        f"{exc.start}); save it as UTF-8 and retry") from exc
    except OSError as exc:
        raise HomeError(f"cannot read {home / 'config.yaml'}: {exc}") from exc
    return home, config


def _read_header(db_path: Path) -> bytes:
    try:
        with open(db_path, "rb") as fh:
            return fh.read(100)
    except OSError as exc:
        raise HomeError(f"cannot read {db_path}: {exc.strerror or exc}") from exc


def _header_problem(db_path: Path) -> str | None:
    """A reason why the file cannot be a complete SQLite database, from its header. The header
    is read before the size: a writer that grows the file meanwhile (the rollback journal
    writes the new page count, then the pages) never makes it look truncated."""
    header = _read_header(db_path)
    size = db_path.stat().st_size
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        return "it is not an SQLite database (empty, truncated or another kind of file)"
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    counter_valid = header[24:28] == header[92:96]
    wal = db_path.with_name(db_path.name + "-wal")
    wal_has_frames = wal.exists() and wal.stat().st_size > 32
    if counter_valid and pages and size < pages * page_size and not wal_has_frames:
        return f"it is truncated ({size} bytes on disk, the header describes {pages * page_size})"
    return None


def _friendly(exc: sqlite3.Error, db_path: Path) -> HomeError:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return HomeError(f"{db_path} is locked by another process ({text}); retry when Hermes is idle")
    if "malformed" in text or "not a database" in text or "disk I/O" in text:
        return HomeError(f"{db_path} is damaged or truncated ({text}); restore it from a backup")
    if "unable to open" in text:
        return HomeError(f"cannot open {db_path} read-only ({text})")
    return HomeError(f"cannot read {db_path}: {text}")


def _file_problem(db_path: Path) -> str | None:
    """Why ``db_path`` is not a regular SQLite file the commands can read, or None."""
    if db_path.is_symlink():
        return (f"{db_path} is a symbolic link (to {os.readlink(db_path)}); the guard reads and writes only a "
                "regular state.db file: point HERMES_HOME at the directory that holds the database")
    if not db_path.exists():
        return f"no state.db at {db_path}; is HERMES_HOME the home Hermes runs with?"
    if not db_path.is_file():
        return f"{db_path} is not a file"
    problem = _header_problem(db_path)
    if problem:
        return f"{db_path} cannot be used: {problem}"
    return None


def readonly_uri(db_path: Path) -> str:
    """The URI of a read-only connection that creates no file next to ``db_path``.

    ``mode=ro`` on a WAL database creates ``-wal`` and ``-shm`` files when they do not
    exist (and cannot open it at all in a directory it may not write). When there is
    no ``-wal`` file no connection has the database open in WAL mode and everything
    committed is in the main file, so ``immutable=1`` reads it without creating or
    locking anything. Otherwise (a ``-wal`` file exists, or a rollback-journal
    database) ``mode=ro`` creates nothing either."""
    uri = db_path.resolve().as_uri()
    header = _read_header(db_path)
    wal_mode = len(header) >= 20 and header[18] == 2 and header[19] == 2
    wal = db_path.with_name(db_path.name + "-wal")
    if wal_mode and not wal.exists():
        return uri + "?immutable=1"
    return uri + "?mode=ro"


@contextmanager
def readonly_connection(db_path: Path, *, snapshot: bool = False) -> Iterator[sqlite3.Connection]:
    """A read-only connection to an existing, complete SQLite file (HomeError otherwise);
    with ``snapshot``, inside one read transaction (everything read is one state)."""
    problem = _file_problem(db_path)
    if problem:
        raise HomeError(problem)
    uri = readonly_uri(db_path)
    try:
        conn = connect(uri, timeout=BUSY_TIMEOUT_SECONDS)
    except sqlite3.Error as exc:
        raise _friendly(exc, db_path) from exc
    try:
        if snapshot:
            conn.execute("BEGIN")
        try:
            yield conn
        finally:
            if snapshot:
                conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        raise _friendly(exc, db_path) from exc
    finally:
        conn.close()


def check_hermes_schema(conn: sqlite3.Connection, db_path: Path) -> None:
    for table, columns in host.REQUIRED_COLUMNS.items():
        have = host.table_columns(conn, table)
        if not have:
            raise HomeError(f"{db_path} is not a Hermes state.db (it has no `{table}` table)")
        missing = [c for c in columns if c not in have]
        if missing:
            raise HomeError(f"{db_path} is not a Hermes state.db (table `{table}` lacks {', '.join(missing)})")


@dataclass(frozen=True)
class CheckedHome:
    """A home that passed :func:`check`. ``has_db`` is False on a fresh home: config.yaml and no state.db
    yet, or a state.db without Hermes's sessions schema yet (only Hermes's early tables or the guard's)."""

    home: Path
    config: GuardConfig
    db_path: Path
    has_db: bool


# Tables Hermes itself creates in state.db (hermes_state.py, tools/async_delegation.py, 0.13-0.19);
# 0.19 creates ``async_delegations`` when its plugins load, before the sessions schema exists.
HERMES_STATE_TABLES = frozenset({
    "async_delegations", "compression_locks", "gateway_routing", "schema_version", "session_model_usage",
    "state_meta", "telegram_dm_topic_bindings", "telegram_dm_topic_bindings_new", "telegram_dm_topic_mode",
})


def _no_sessions_yet(conn: sqlite3.Connection) -> bool:
    """Hermes (or the guard, loaded as its plugin) created state.db before Hermes wrote its
    sessions schema: no ``sessions``/``messages`` table, and every table is one of Hermes's
    own or the guard's ``session_guard_*`` (a foreign file has others)."""
    names = [str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    if not names or "sessions" in names or "messages" in names:
        return False
    return all(n in HERMES_STATE_TABLES or n.startswith(("session_guard_", "sqlite_")) for n in names)


def write_problem(home: Path, db_path: Path) -> str | None:
    """Why a command cannot write to this home's state.db now, or None."""
    read_only = "this command writes to it (the read-only commands are doctor, status and snapshots)"
    if not os.access(home, os.W_OK):
        return f"HERMES_HOME {home} is read-only; {read_only}"
    if db_path.exists() and not os.access(db_path, os.W_OK):
        return f"{db_path} is read-only; {read_only}"
    return None


def database_busy(db_path: Path, timeout: float = 0.5) -> str | None:
    """SQLite's reason why state.db cannot take a write transaction now (another writer holds one), or None."""
    conn = connect(db_path, timeout=timeout, autocommit=True)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return None
    except sqlite3.Error as exc:
        return str(exc)
    finally:
        conn.close()


def busy_problem(db_path: Path) -> str | None:
    """Why state.db cannot take a write transaction now (another process holds one), or None."""
    try:
        busy = database_busy(db_path, BUSY_TIMEOUT_SECONDS)
    except sqlite3.Error as exc:
        return f"cannot open {db_path} for writing ({exc})"
    if busy is None:
        return None
    return f"{db_path} is locked by another process that is writing to it ({busy}); retry when Hermes is idle"


def check(home: Path | None = None, *, writes: bool = False, empty_ok: bool = False) -> CheckedHome:
    """The one home check every command makes before it reads or writes anything.

    The home exists and is a directory, config.yaml is UTF-8 YAML with a valid
    ``session_guard:`` section, and state.db (when there is one) is a regular,
    complete SQLite file with Hermes's tables, read through a read-only connection
    that creates nothing. Nothing opens a suspect file through Hermes's SessionDB
    (0.18.2+ would move a malformed state.db aside and write a new one). With
    ``writes`` the home and state.db must be writable and no other process may be
    holding a write transaction; ``empty_ok`` accepts a home with neither config.yaml
    nor state.db. Raises :class:`HomeError` (one sentence) otherwise."""
    home, config = check_home(home)
    db_path = state_db_path(home)
    if not db_path.exists() and not db_path.is_symlink():
        if not empty_ok and not (home / "config.yaml").exists():
            raise HomeError(f"no state.db at {db_path} and no config.yaml in {home}; "
                            "is HERMES_HOME the home Hermes runs with?")
        checked = CheckedHome(home, config, db_path, has_db=False)
    else:
        with readonly_connection(db_path, snapshot=True) as conn:
            fresh = _no_sessions_yet(conn)
            if not fresh:
                check_hermes_schema(conn, db_path)
        checked = CheckedHome(home, config, db_path, has_db=not fresh)
    if writes:
        problem = write_problem(home, db_path)
        if problem is None and checked.has_db:
            problem = busy_problem(db_path)
        if problem:
            raise HomeError(problem)
    return checked


def _sessions(conn: sqlite3.Connection, stats: dict[str, dict[str, Any]]) -> dict[str, SessionInfo]:
    out: dict[str, SessionInfo] = {}
    for row in host.read_sessions(conn):
        sid = str(row["id"])
        st = stats.get(sid, {})
        out[sid] = SessionInfo(
            id=sid,
            source=row.get("source"),
            parent_id=row.get("parent_session_id") or None,
            started_at=float(row.get("started_at") or 0.0),
            ended_at=row.get("ended_at"),
            end_reason=row.get("end_reason"),
            model_config=row.get("model_config"),
            rows=st.get("count", 0),
            live_rows=st.get("live", 0),
            first_row_id=st.get("first_id"),
            last_ts=st.get("last_ts"),
        )
    return out


def registered_lock_tables() -> list[LockTable]:
    return [t for group in get_plugin_manager().hook.session_guard_lock_tables() for t in group or []]


def registered_buffer_tables() -> list[BufferTable]:
    return [t for group in get_plugin_manager().hook.session_guard_buffer_tables() for t in group or []]


def _locks(conn: sqlite3.Connection, state: HomeState) -> None:
    for t in registered_lock_tables():
        cols = host.table_columns(conn, t.table)
        needed = (t.session_column, t.holder_column, t.acquired_column, t.expires_column)
        if not cols or any(c not in cols for c in needed):
            continue
        state.lock_tables.append(t.table)
        for sid, holder, acquired, expires in conn.execute(
            f"SELECT {', '.join(needed)} FROM {t.table} ORDER BY {t.session_column}"
        ):
            state.locks.append(LockRow(t.kind, t.table, str(sid), holder, acquired, expires, t.owned_by_guard))


def _buffers(conn: sqlite3.Connection, state: HomeState) -> None:
    for t in registered_buffer_tables():
        cols = host.table_columns(conn, t.table)
        if t.session_column not in cols:
            continue
        state.buffer_tables.append(t.table)
        for sid, count in conn.execute(
            f"SELECT {t.session_column}, COUNT(*) FROM {t.table} WHERE {t.pending_where} GROUP BY {t.session_column}"
        ):
            state.buffered[str(sid)] = state.buffered.get(str(sid), 0) + int(count)


def _routing(conn: sqlite3.Connection, state: HomeState) -> None:
    for row in host.read_routing_table(conn):
        state.routing.append(RoutingEntry("table", row["session_key"], row["session_id"], scope=row["scope"],
                                          entry_json=row["entry_json"]))
    _routing_file(state)


def _routing_file(state: HomeState) -> None:
    try:
        path, data = host.read_routing_file(state.home)
    except (OSError, ValueError) as exc:
        raise HomeError(f"cannot read the gateway routing file: {exc}") from exc
    state.routing_file, state.routing_file_data = path, data
    for key, sid in host.routing_file_entries(data).items():
        state.routing.append(RoutingEntry("file", key, sid))


def load_home_state(home: Path | None = None, *, now: float | None = None) -> HomeState:
    """Everything the operator commands need, read in one read-only transaction."""
    checked = check(home)
    state = HomeState(home=checked.home, db_path=checked.db_path, config=checked.config,
                      now=time.time() if now is None else now, has_db=checked.has_db)
    if not checked.has_db:
        _routing_file(state)
        return state
    with readonly_connection(checked.db_path, snapshot=True) as conn:
        check_hermes_schema(conn, checked.db_path)
        state.schema_version = host.read_schema_version(conn)
        stats = host.read_message_stats(conn)
        state.sessions = _sessions(conn, stats)
        state.orphan_rows = {sid: st["count"] for sid, st in stats.items() if sid not in state.sessions}
        ended = [s.id for s in state.sessions.values() if s.ended_by_compression]
        state.marks = host.read_message_marks(conn, ended)
        state.summaries = host.read_summary_rows(conn)
        _routing(conn, state)
        _locks(conn, state)
        _buffers(conn, state)
        state.snapshots = read_snapshot_counts(conn)
        state.gone_snapshots = _gone_references(conn)
    return state


def _gone_references(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    """Snapshots by reference (native mode) whose rows changed since they were recorded."""
    gone = []
    for snapshot_id, sid, runs, count, digest in read_snapshot_references(conn):
        problem = reference_problem(host.rows_by_runs(conn, sid, runs), count, digest)
        if problem is not None:
            gone.append((snapshot_id, sid, problem))
    return gone


def read_rows(db_path: Path, session_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Every stored row of the given sessions (all columns), in row order, read-only."""
    with readonly_connection(db_path) as conn:
        return {sid: host.read_session_rows(conn, sid) for sid in session_ids}


def read_system_prompt(db_path: Path, session_id: str) -> str | None:
    with readonly_connection(db_path) as conn:
        return host.read_system_prompt(conn, session_id)
