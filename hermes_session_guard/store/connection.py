"""The store's one SQLite connection to state.db: opening (file mode, WAL, pragmas,
schema), write transactions with their durability level, and reads."""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from ..fail_open import failing_open
from ..file_modes import make_private_dirs
from ..files import create_file
from .schema import _FTS_SCHEMA, _SCHEMA, LEGACY_INDEX, SCHEMA_VERSION, add_missing_columns

log = logging.getLogger("hermes_session_guard")


_keys: dict[str, Path] = {}  # an absolute path as callers give it -> the file it names
_KEYS_MAX = 256


def database_key(db_path: Path | str) -> Path:
    """The resolved path one state.db is known by in this process (its store, its locks,
    its readers). Resolving costs a ``stat`` per path component, and every compression
    asks several times; an absolute path is resolved once (a link moved under a running
    process keeps its first answer), a relative one every time (the working directory may
    change)."""
    raw = os.fspath(db_path)
    key = _keys.get(raw)
    if key is None:
        key = Path(raw).resolve()
        if os.path.isabs(raw):
            if len(_keys) >= _KEYS_MAX:
                _keys.clear()
            _keys[raw] = key
    return key


def connect(target: Path | str, *, read_only: bool = False, timeout: float = 5.0, autocommit: bool = False,
            any_thread: bool = False) -> sqlite3.Connection:
    """The one way the guard opens an SQLite connection (the store's own included).

    ``target``: a database path, or a ``file:`` URI built already (a read-only one that
    creates no file: ``maintenance.state_inspection.readonly_uri``). ``read_only`` opens a
    path with ``mode=ro``; ``timeout`` is SQLite's busy wait; ``autocommit`` leaves
    transactions to the caller's own ``BEGIN``; ``any_thread`` lets other threads use the
    connection (the caller serialises them)."""
    isolation: Literal["DEFERRED"] | None = None if autocommit else "DEFERRED"  # Python's default is DEFERRED
    if isinstance(target, str) and target.startswith("file:"):
        return sqlite3.connect(target, uri=True, timeout=timeout, isolation_level=isolation,
                               check_same_thread=not any_thread)
    if read_only:
        return sqlite3.connect(f"{Path(target).resolve().as_uri()}?mode=ro", uri=True, timeout=timeout,
                               isolation_level=isolation, check_same_thread=not any_thread)
    return sqlite3.connect(str(target), timeout=timeout, isolation_level=isolation, check_same_thread=not any_thread)


def _journal_mode(conn: sqlite3.Connection) -> str:
    """The journal mode state.db has. Hermes chooses it (WAL on 0.13-0.19; 0.20+ keeps a
    file in rollback mode where WAL is unsafe: an SQLite with the WAL-reset bug, a network
    or cross-VM filesystem, ``database.journal_mode: delete``), so the guard reads it and
    never sets it."""
    row = conn.execute("PRAGMA journal_mode").fetchone()
    return str(row[0]).lower() if row and row[0] is not None else ""


def _read_only_error(exc: BaseException) -> bool:
    """SQLITE_READONLY: the file (or the connection) cannot be written."""
    return "readonly" in str(exc).lower() or "read-only" in str(exc).lower()


def _drop_legacy_index(conn: sqlite3.Connection) -> None:
    """Drop the indexes an earlier layout kept (``LEGACY_INDEX``): derived data, rebuilt
    as the one text index by the first search or recall."""
    present = {(str(r[0]), str(r[1])) for r in conn.execute(
        "SELECT type, name FROM sqlite_master WHERE name LIKE 'session_guard_recall%'"
        " OR name LIKE 'session_guard_search%'")}
    for kind, name in LEGACY_INDEX:
        if (kind, name) not in present:
            continue
        try:
            conn.execute(f"DROP {kind.upper()} IF EXISTS {name}")
        except sqlite3.OperationalError as exc:
            if _read_only_error(exc):
                raise
            return  # an SQLite without FTS5 cannot drop an FTS5 table: left as it is, unread


class StoreConnection:
    """Thread-safe access to the ``session_guard_*`` tables of one state.db: every
    repository of the store works through :meth:`transaction` and :meth:`reading`."""

    def __init__(self, db_path: Path | str, *, timeout: float = 30.0) -> None:
        self.db_path = Path(db_path)
        self._timeout = timeout
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self.fts = True
        self._wal = False
        self._synchronous = 2  # the connection's own level once set up (see _connect)
        self._opened_read_only = False  # the connection was opened while the file was read-only
        self._tables_made: set[str] = set()  # tables created on first use (ensure_table)
        self._depth = 0  # transaction() calls open in the thread holding _lock

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            make_private_dirs(self.db_path.parent)
            if not self.db_path.exists():  # a state.db the guard creates is 0600, the home owner's (-wal/-shm follow)
                try:
                    create_file(self.db_path, b"", home=self.db_path.parent)
                except OSError:
                    pass  # created meanwhile, or not creatable: SQLite says which below
            conn = connect(self.db_path, timeout=self._timeout, autocommit=True, any_thread=True)
            conn.execute(f"PRAGMA busy_timeout={int(self._timeout * 1000)}")
            self._wal = _journal_mode(conn) == "wal"
            if sys.platform != "darwin" and self._wal:
                # No fsync per commit: leases and generation records are short-lived, and a
                # snapshot is always committed before the Hermes write that replaces the rows
                # it keeps, whose own (synchronous) commit makes the earlier WAL frames durable.
                # A power cut can lose at most the latest bookkeeping rows (summary tags,
                # text index, hand-off records, inbox state changes the startup replay
                # re-derives), never a snapshot of rows Hermes replaced. A commit that must be
                # on disk before the guard tells anyone (a buffered message's receipt) asks
                # for it: see transaction(). macOS keeps FULL, as Hermes does there.
                conn.execute("PRAGMA synchronous=NORMAL")
            self._synchronous = int(conn.execute("PRAGMA synchronous").fetchone()[0])
            conn.executescript(_SCHEMA)
            try:
                conn.executescript(_FTS_SCHEMA)
                self.fts = True
            except sqlite3.OperationalError as exc:  # an SQLite built without FTS5
                log.warning("session guard: SQLite has no FTS5 (%s); recall falls back to a slower scan", exc)
                self.fts = False
            try:
                add_missing_columns(conn)
                _drop_legacy_index(conn)
                conn.execute(
                    "INSERT INTO session_guard_meta(key, value) VALUES ('schema_version', ?)"
                    " ON CONFLICT(key) DO UPDATE SET value = excluded.value"
                    " WHERE CAST(value AS INTEGER) < CAST(excluded.value AS INTEGER)",
                    (str(SCHEMA_VERSION),),
                )
            except sqlite3.OperationalError as exc:
                if not _read_only_error(exc):
                    conn.close()
                    raise
                # Opened on a read-only file: the guard's tables can still be read
                # (recall, status). Every write fails on its own (its caller reports it)
                # and drops this connection, so the guard writes again once the file is
                # writable.
                log.debug("session guard: %s opened read-only (%s)", self.db_path, exc)
                self._opened_read_only = True
            else:
                self._opened_read_only = False
            self._conn = conn
        return self._conn

    def _rollback(self, conn: sqlite3.Connection) -> None:
        """Roll back what is left of a failed transaction. SQLite may already have
        rolled it back itself (a full disk, an I/O error); a rollback that fails
        leaves the connection unusable, so it is dropped and reopened on next use."""
        if not conn.in_transaction:
            return
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            log.debug("session guard: rollback failed (%s); reopening the connection", exc)
            self._drop_connection()

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except sqlite3.Error:
                pass

    @contextmanager
    def transaction(self, *, wait_for_disk: bool | None = None) -> Iterator[sqlite3.Connection]:
        """One write transaction, committed at the connection's own level (see _connect).
        ``wait_for_disk=True`` makes this commit wait until the data is on disk
        (``synchronous=FULL`` for it): for a promise made right after it, such as a
        buffered message's receipt. ``wait_for_disk=False`` (WAL only,
        ``synchronous=NORMAL`` for it) survives a process crash but a power loss may
        roll it back; only for changes the guard can re-derive (the next synchronous
        commit or checkpoint makes it durable too).

        Nested in another ``transaction()`` of the same thread it is part of that one: one
        commit for several repositories' writes (an error in it rolls the whole one back),
        at the outer one's level."""
        carrier = getattr(_riding, "carrier", None)
        if carrier is not None and carrier[0] is self:  # a rider's write, inside Hermes's transaction
            yield carrier[1]
            return
        with self._lock:
            if self._depth and self._conn is not None:
                self._depth += 1
                try:
                    yield self._conn
                finally:
                    self._depth -= 1
                return
            if self._opened_read_only:
                self._drop_connection()  # the file may be writable again: a fresh connection can tell
            conn = self._connect()
            level = self._synchronous
            if wait_for_disk is True and level < 2:
                level = 2
            elif wait_for_disk is False and self._wal and level > 1:
                level = 1
            changed = level != self._synchronous
            if changed:
                conn.execute(f"PRAGMA synchronous={level}")
            try:
                conn.execute("BEGIN IMMEDIATE")
                self._depth = 1
                committed = False
                try:
                    yield conn
                    conn.execute("COMMIT")
                    committed = True
                finally:
                    if not committed:
                        # The error that failed the transaction is the one to report,
                        # never a rollback's "no transaction is active".
                        self._rollback(conn)
            except sqlite3.Error as exc:
                if _read_only_error(exc):
                    # A connection opened on a read-only file never writes again.
                    self._drop_connection()
                raise
            finally:
                self._depth = 0
                if changed and self._conn is conn:
                    try:
                        conn.execute(f"PRAGMA synchronous={self._synchronous}")
                    except sqlite3.Error:
                        self._drop_connection()

    def ensure_table(self, name: str, ddl: str) -> None:
        """Create one of the guard's tables that exist only once used (``ddl`` is
        ``CREATE ... IF NOT EXISTS``), once per connection object."""
        if name not in self._tables_made:
            with self.transaction() as conn:
                conn.execute(ddl)
            self._tables_made.add(name)

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._connect()

    def read_one(self, sql: str, params: Sequence[object] = ()) -> Any:
        """The first row of one read (None when there is none)."""
        with self.reading() as conn:
            return conn.execute(sql, params).fetchone()

    def read_all(self, sql: str, params: Sequence[object] = ()) -> list[Any]:
        with self.reading() as conn:
            return conn.execute(sql, params).fetchall()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


# -- the guard's rows carried by Hermes's own commits -----------------------------------
# .waiting: this thread's riders; .carrier: (store, Hermes's connection) of the one writing;
# .compaction: Hermes's archive_and_compact runs on this thread (its commit is the compaction's)
_riding = threading.local()
_riders_lock = threading.Lock()


class Rider:
    """Rows of the guard's that the next write transaction Hermes commits on this thread
    carries (0.20+, the ``host_commit`` seam): ``write`` runs inside it, after Hermes's own
    writes, in a savepoint, with the store's :meth:`StoreConnection.transaction` handing it
    Hermes's connection. The rows then cost no commit of their own, and they are committed,
    or rolled back, with Hermes's. A failure of the guard's own write rolls back only its
    savepoint: Hermes's transaction goes on as it would alone (``state`` says ``failed`` and
    the caller writes them on its own). ``state``: ``waiting``, ``aboard`` (written inside a
    transaction not yet committed), ``committed``, ``failed``, ``rolled_back`` (Hermes's
    transaction failed) or ``cancelled``. ``compaction``: only the commit of Hermes's
    compaction itself carries it (``archive_and_compact``, the ``compaction_commit`` seam),
    not the commits Hermes makes before it."""

    __slots__ = ("store", "label", "write", "state", "compaction", "_queue")

    def __init__(self, store: StoreConnection, label: str, write: Callable[[], object], compaction: bool) -> None:
        self.store, self.label, self.write, self.compaction = store, label, write, compaction
        self.state = "waiting"
        self._queue: list[Rider] | None = None

    def run(self, conn: sqlite3.Connection) -> None:
        """Write inside Hermes's open transaction on ``conn`` (called again if Hermes retries it)."""
        with failing_open(f"{self.label} carried by Hermes's commit", "written on its own", level=logging.DEBUG,
                          advice=None) as failed:
            conn.execute("SAVEPOINT session_guard")
            _riding.carrier = (self.store, conn)
            wrote = False
            try:
                self.write()
                wrote = True
            finally:
                _riding.carrier = None
                if not wrote:  # the guard's rows only; Hermes's transaction goes on
                    conn.execute("ROLLBACK TO session_guard")
                conn.execute("RELEASE session_guard")
            self.state = "aboard"
        if failed:
            self.state = "failed"

    def alight(self) -> bool:
        """Whether the rows were committed with Hermes's transaction; a rider still waiting
        is cancelled (it rides no later commit), so the caller writes them on its own."""
        with _riders_lock:
            if self.state == "waiting":
                self.state = "cancelled"
                if self._queue is not None and self in self._queue:
                    self._queue.remove(self)
            return self.state == "committed"


def board(store: StoreConnection, label: str, write: Callable[[], object], *, compaction: bool = False) -> Rider:
    """A :class:`Rider` for the next write transaction Hermes commits on this thread (its
    compaction's, with ``compaction``)."""
    rider = Rider(store, label, write, compaction)
    with _riders_lock:
        queue = getattr(_riding, "waiting", None)
        if queue is None:
            queue = _riding.waiting = []
        rider._queue = queue
        queue.append(rider)
    return rider


def take_riders() -> list[Rider]:
    """The riders waiting on this thread that the write transaction about to run carries."""
    queue = getattr(_riding, "waiting", None)
    if not queue:
        return []
    compacting = getattr(_riding, "compaction", 0) > 0
    with _riders_lock:
        taken = [rider for rider in queue if compacting or not rider.compaction]
        queue[:] = [rider for rider in queue if rider not in taken]
        for rider in taken:
            rider._queue = None
    return taken


@contextmanager
def compaction_commit() -> Iterator[None]:
    """Hermes's compaction (``archive_and_compact``) runs on this thread: its write
    transaction carries the riders waiting for it."""
    _riding.compaction = getattr(_riding, "compaction", 0) + 1
    try:
        yield
    finally:
        _riding.compaction -= 1


def carry(riders: list[Rider], fn: Callable[[sqlite3.Connection], object]) -> Callable[[sqlite3.Connection], object]:
    """Hermes's transaction body ``fn`` followed by the riders' writes."""

    def body(conn: sqlite3.Connection) -> object:
        result = fn(conn)
        for rider in riders:
            if rider.state in ("waiting", "aboard"):
                rider.run(conn)
        return result

    return body


def arrived(riders: list[Rider], committed: bool) -> None:
    """Hermes's transaction ended: the riders written in it were committed, or rolled back with it."""
    with _riders_lock:
        for rider in riders:
            if rider.state == "aboard":
                rider.state = "committed" if committed else "rolled_back"
            elif rider.state == "waiting":  # its write never ran (Hermes's body failed first)
                rider.state = "rolled_back"
