"""One ``repair --apply`` per state.db at a time.

The slot is a single row of ``session_guard_repair_lock``, taken in one
``BEGIN IMMEDIATE`` transaction. Its holder string carries the process identity
(:mod:`.liveness`), so a repair that was killed does not block the next one: a
holder that is provably dead is replaced at once; one of unknown liveness
(written on another machine) only after ``STALE_SECONDS``. The repair keeps the
slot for its whole run (re-planning, backup, writes, the check afterwards) and
releases it holder-qualified.

Each step uses its own short-lived connection, closed before the repair reads
the home again: the home reader opens state.db's header as a plain file, and a
process must not do that while it holds an SQLite connection to the file (closing
the plain file drops the process's POSIX locks on it, so another process may
delete a WAL this one still uses).
"""

from __future__ import annotations

import time
import uuid
from contextlib import closing
from pathlib import Path

from ..store.connection import connect
from ..store.schema import REPAIR_LOCK_DDL
from . import liveness

STALE_SECONDS = 3600.0


def new_holder(op_id: str) -> str:
    ident = liveness.this_process()
    return f"pid={ident.pid}:repair-op={op_id}:nonce={uuid.uuid4().hex[:6]}:{ident.fields()}"


def acquire(db_path: Path | str, holder: str) -> tuple[bool, str | None, float | None]:
    """Take the repair slot for ``holder``. Returns (taken, the other holder, since when)."""
    now = time.time()
    with closing(connect(db_path, autocommit=True)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(REPAIR_LOCK_DDL)
        row = conn.execute("SELECT holder, acquired_at FROM session_guard_repair_lock WHERE slot = 1").fetchone()
        if row is not None:
            other, since = str(row[0]), float(row[1])
            state = liveness.holder_liveness(other)
            if state == liveness.ALIVE or (state == liveness.UNKNOWN and now - since < STALE_SECONDS):
                conn.execute("ROLLBACK")
                return False, other, since
        conn.execute("INSERT OR REPLACE INTO session_guard_repair_lock(slot, holder, acquired_at) VALUES (1, ?, ?)",
                     (holder, now))
        conn.execute("COMMIT")
    return True, None, None


def release(db_path: Path | str, holder: str) -> None:
    with closing(connect(db_path, autocommit=True)) as conn:
        conn.execute(REPAIR_LOCK_DDL)
        conn.execute("DELETE FROM session_guard_repair_lock WHERE slot = 1 AND holder = ?", (holder,))
