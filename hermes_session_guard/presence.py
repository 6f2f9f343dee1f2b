"""Which processes of this ``HERMES_HOME`` run the guard right now.

A process in which the guard is installed announces itself in
``session_guard_processes`` (state.db) the first time it uses that database:
its identity (host, boot, pid, start time; :mod:`.liveness`), what it is
(``agent``; ``gateway`` once the gateway's seams used it) and when.
It withdraws the row when it exits normally. A process that was killed leaves
its row behind; any reader on the same machine sees from the identity that it is
dead and leaves it out (``prune_dead`` deletes such rows). A row written on
another machine is believed while its heartbeat (written when the process
announced itself) is younger than ``REMOTE_FRESH_SECONDS``.

``repair --apply`` refuses while any live process other than itself is listed.
Only sqlite, psutil and atexit: the same on Windows services.
"""

from __future__ import annotations

import atexit
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any

from . import liveness

log = logging.getLogger("hermes_session_guard")

TABLE = "session_guard_processes"
DDL = (
    "CREATE TABLE IF NOT EXISTS session_guard_processes (identity TEXT PRIMARY KEY, pid INTEGER NOT NULL,"
    " kind TEXT NOT NULL, started_at REAL NOT NULL, heartbeat_at REAL NOT NULL)"
)
# A row from another machine counts as running while its heartbeat is younger than this.
REMOTE_FRESH_SECONDS = 3600.0

_announced: dict[str, Any] = {}  # db path -> store
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


def announce(store: Any, kind: str = "agent") -> None:
    """Record this process as a guard-running process of ``store``'s state.db (idempotent;
    a later call refreshes the heartbeat; ``gateway``, said by the gateway's seams, sticks)."""
    global _atexit_registered
    ident = liveness.this_process()
    now = time.time()
    with store.transaction() as conn:
        conn.execute(DDL)
        conn.execute(
            "INSERT INTO session_guard_processes(identity, pid, kind, started_at, heartbeat_at) VALUES (?,?,?,?,?)"
            " ON CONFLICT(identity) DO UPDATE SET heartbeat_at = excluded.heartbeat_at,"
            " kind = CASE WHEN excluded.kind = 'gateway' THEN 'gateway' ELSE kind END",
            (ident.fields(), ident.pid, kind, ident.start, now),
        )
    with _lock:
        _announced[str(store.db_path)] = store
        if not _atexit_registered:
            atexit.register(withdraw_all)
            _atexit_registered = True


def announce_quietly(store: Any, kind: str = "agent") -> None:
    try:
        announce(store, kind)
    except Exception as exc:  # presence is advisory for operators; never fail the host for it
        log.debug("session guard: could not record this process in %s: %s", TABLE, exc)


def withdraw(store: Any) -> None:
    with store.transaction() as conn:
        conn.execute(DDL)
        conn.execute("DELETE FROM session_guard_processes WHERE identity = ?", (own_identity(),))


def withdraw_all() -> None:
    with _lock:
        stores = list(_announced.values())
        _announced.clear()
    for store in stores:
        try:
            withdraw(store)
        except Exception as exc:
            log.debug("session guard: could not withdraw this process from %s: %s", TABLE, exc)


def running(conn: sqlite3.Connection, *, now: float | None = None, include_self: bool = False) -> list[Presence]:
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
        if identity == me and not include_self:
            continue
        state = liveness.holder_liveness(identity)
        if state == liveness.DEAD:
            continue
        if state == liveness.UNKNOWN and now - float(beat) > REMOTE_FRESH_SECONDS:
            continue
        out.append(Presence(str(identity), int(pid), str(kind), float(started), float(beat), state))
    return out


def prune_dead(store: Any) -> int:
    """Delete the rows of processes that are provably gone; returns how many."""
    with store.transaction() as conn:
        conn.execute(DDL)
        rows = conn.execute("SELECT identity FROM session_guard_processes").fetchall()
        dead = [r[0] for r in rows if liveness.holder_dead(r[0])]
        for identity in dead:
            conn.execute("DELETE FROM session_guard_processes WHERE identity = ?", (identity,))
    return len(dead)
