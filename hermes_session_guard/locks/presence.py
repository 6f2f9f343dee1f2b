"""Which processes of this ``HERMES_HOME`` run the guard right now.

A process in which the guard is installed announces itself in
``session_guard_processes`` (state.db) the first time it uses that database:
its identity (host, boot, pid, start time; :mod:`.liveness`), what it is
(``agent``; ``gateway`` once the gateway's seams used it) and when.
It withdraws the row when it exits normally. A process that was killed leaves
its row behind; any reader on the same machine sees from the identity that it is
dead and leaves it out. A row written on another machine is believed while its
heartbeat (written when the process announced itself) is younger than
``REMOTE_FRESH_SECONDS``.

``repair --apply`` refuses while any live process other than itself is listed.
Only sqlite, psutil and atexit: the same on Windows services.
"""

from __future__ import annotations

import atexit
import logging
import sqlite3
import threading
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from ..fail_open import failing_open
from ..store.connection import connect
from ..store.schema import PROCESSES_DDL, PROCESSES_TABLE
from . import liveness

TABLE, DDL = PROCESSES_TABLE, PROCESSES_DDL
# A row from another machine counts as running while its heartbeat is younger than this.
REMOTE_FRESH_SECONDS = 3600.0

_BUSY_SECONDS = 0.5
_RETRY_SECONDS = 60.0
_announced: set[tuple[str, str]] = set()  # (db path, kind)
_retry_at: dict[tuple[str, str], float] = {}
_lock = threading.Lock()
_atexit_registered = False


@dataclass(frozen=True)
class Presence:
    identity: str
    pid: int
    kind: str
    started_at: float
    heartbeat_at: float
    state: str  # liveness.ALIVE | liveness.UNKNOWN

    def describe(self, now: float) -> str:
        ident = liveness.parse(self.identity)
        where = f" on host {ident.host}" if ident and ident.host != liveness.this_process().host else ""
        seen = f", last seen {now - self.heartbeat_at:.0f}s ago" if self.state != liveness.ALIVE else ""
        since = time.strftime("%H:%M:%S", time.localtime(self.started_at))
        return f"{self.kind} pid {self.pid}{where} (running since {since}{seen})"


def own_identity() -> str:
    return liveness.this_process().fields()


def _connect(db_path: Path) -> sqlite3.Connection:
    # Its own short-lived connection with a short busy timeout: announcing must never
    # hold up a compression behind another writer (it is retried later instead).
    return connect(db_path, timeout=_BUSY_SECONDS, autocommit=True)


def announce(db_path: Path | str, kind: str = "agent") -> None:
    """Record this process as a guard-running process of ``db_path`` (idempotent: a
    later call refreshes the heartbeat; ``gateway``, said by the gateway's seams, sticks)."""
    global _atexit_registered
    path = Path(db_path)
    ident = liveness.this_process()
    with closing(_connect(path)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(DDL)
        conn.execute(
            "INSERT INTO session_guard_processes(identity, pid, kind, started_at, heartbeat_at) VALUES (?,?,?,?,?)"
            " ON CONFLICT(identity) DO UPDATE SET heartbeat_at = excluded.heartbeat_at,"
            " kind = CASE WHEN excluded.kind = 'gateway' THEN 'gateway' ELSE kind END",
            (ident.fields(), ident.pid, kind, ident.start, time.time()),
        )
        conn.execute("COMMIT")
    with _lock:
        _announced.add((str(path), kind))
        if not _atexit_registered:
            atexit.register(withdraw_all)
            _atexit_registered = True


def announce_quietly(db_path: Path | str, kind: str = "agent") -> None:
    """:func:`announce` once per database and kind; a failure (busy, read-only) is
    retried at a later call, at most once a minute, and never raised."""
    key = (str(db_path), kind)
    now = time.monotonic()
    with _lock:
        if key in _announced or now < _retry_at.get(key, 0.0):
            return
    if not Path(db_path).exists():
        return  # never create a state.db just to announce ourselves
    with _lock:
        _retry_at[key] = now + _RETRY_SECONDS
    # presence is advisory for operators; never fail the host for it
    with failing_open(f"recording this process in {TABLE}", "it is retried at a later call", advice=None,
                      level=logging.DEBUG):
        announce(db_path, kind)


def withdraw(db_path: Path | str) -> None:
    with closing(_connect(Path(db_path))) as conn:
        conn.execute(DDL)
        conn.execute("DELETE FROM session_guard_processes WHERE identity = ?", (own_identity(),))


def withdraw_all() -> None:
    with _lock:
        paths = sorted({path for path, _kind in _announced})
        _announced.clear()
    for path in paths:
        with failing_open(f"withdrawing this process from {TABLE}", "its row stays until a reader finds it dead",
                          advice=None, level=logging.DEBUG):
            withdraw(path)


def running(conn: sqlite3.Connection, *, now: float | None = None) -> list[Presence]:
    """Guard-running processes of this state.db that are alive or of unknown liveness
    (another machine, heartbeat recent); dead ones and this process are left out."""
    now = time.time() if now is None else now
    try:
        rows = conn.execute(
            "SELECT identity, pid, kind, started_at, heartbeat_at FROM session_guard_processes ORDER BY started_at"
        ).fetchall()
    except sqlite3.OperationalError:
        return []  # no table: no process ever announced itself
    me = own_identity()
    out: list[Presence] = []
    for identity, pid, kind, started, beat in rows:
        if identity == me:
            continue
        state = liveness.holder_liveness(identity)
        if state == liveness.DEAD:
            continue
        if state == liveness.UNKNOWN and now - float(beat) > REMOTE_FRESH_SECONDS:
            continue
        out.append(Presence(str(identity), int(pid), str(kind), float(started), float(beat), state))
    return out
