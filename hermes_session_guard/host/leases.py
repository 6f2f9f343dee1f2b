"""Hermes's own compression lock (``compression_locks``, 0.16+) as a lease
table, and the thread-local re-entry that lets the host's acquire succeed while the
guard already holds the lock."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..seam_behaviour import LockMode
from ..store.connection import database_key
from .agent import session_db


class NativeLeases:
    """Hermes's own ``compression_locks`` rows (0.16+), through its SessionDB methods."""

    name: str = LockMode.NATIVE

    def __init__(self, db: Any) -> None:
        self.db = db

    def try_acquire(self, session_id: str, holder: str, ttl_seconds: float) -> bool:
        """Hermes answers False both when another holder has the lock and when its
        database refused the write (it logs that and "fails safe"); only the first is
        a busy lock. A refusal with nobody holding the lock, twice in a row, raises
        (the lease table is unavailable) instead of being polled for the whole wait."""
        for _ in range(2):
            if self.db.try_acquire_compression_lock(session_id, holder, ttl_seconds=ttl_seconds):
                return True
            if self.holder(session_id) is not None:
                return False
        raise RuntimeError("Hermes could not take its compression lock and nobody holds it "
                           "(state.db refused the write; see Hermes's own warning)")

    def refresh(self, session_id: str, holder: str, ttl_seconds: float) -> bool:
        refresh = getattr(self.db, "refresh_compression_lock", None)
        if callable(refresh):
            return bool(refresh(session_id, holder, ttl_seconds=ttl_seconds))
        write = getattr(self.db, "_execute_write", None)
        if callable(write):
            # 0.16-0.17 have no refresh method: extend the guard's own row with the
            # statement 0.18.2's refresh_compression_lock runs, through the SessionDB's
            # own write path (its lock and retry), holder-qualified like Hermes's.
            now = time.time()

            def _extend(conn: Any) -> int:
                return int(conn.execute(
                    "UPDATE compression_locks SET expires_at = ? WHERE session_id = ? AND holder = ?"
                    " AND expires_at >= ?", (now + ttl_seconds, session_id, holder, now),
                ).rowcount)

            return bool(write(_extend))
        # A SessionDB without either: the lock stays ours until the TTL it was taken with runs out.
        return self.holder(session_id) == holder

    def release(self, session_id: str, holder: str) -> None:
        """Hermes's release logs and swallows a database error; a lock still held
        afterwards is reported as a failed release, so the guard retries it."""
        self.db.release_compression_lock(session_id, holder)
        if self.holder(session_id) == holder:
            raise RuntimeError("Hermes could not release its compression lock (state.db refused the write)")

    def holder(self, session_id: str) -> str | None:
        found = self.db.get_compression_lock_holder(session_id)
        return str(found) if found else None


def native_leases(agent: Any) -> NativeLeases | None:
    """The agent's SessionDB as a lease table, when it has Hermes's lock API (0.16+;
    ``refresh_compression_lock`` only from 0.18.2, see :meth:`NativeLeases.refresh`)."""
    db = session_db(agent)
    if db is None or not all(
        callable(getattr(db, name, None))
        for name in ("try_acquire_compression_lock", "release_compression_lock", "get_compression_lock_holder")
    ):
        return None
    return NativeLeases(db)


_native_held = threading.local()


def _db_key(db: Any) -> str:
    path = getattr(db, "db_path", None)
    return str(database_key(path)) if path else f"id:{id(db)}"


@contextmanager
def native_lock_reentry(leases: NativeLeases, sid: str) -> Iterator[None]:
    """While the guard holds Hermes's lock on ``sid``, the host's own acquire of that
    lock on this thread succeeds (see the ``native_lock_reentry`` seam) instead of
    seeing the guard as a competitor and skipping."""
    held: set[tuple[str, str]] = getattr(_native_held, "keys", None) or set()
    key = (_db_key(leases.db), sid)
    _native_held.keys = held | {key}
    try:
        yield
    finally:
        _native_held.keys = held


def native_lock_held_here(db: Any, sid: Any) -> bool:
    held = getattr(_native_held, "keys", None)
    return held is not None and (_db_key(db), str(sid)) in held


def clear_expired_native_lock(db: Any, sid: str, holder: str) -> bool:
    """Let the host reclaim an expired compression lock (its acquire deletes expired
    rows) and release it again at once. False when the lock is still live."""
    if not db.try_acquire_compression_lock(sid, holder, ttl_seconds=5.0):
        return False
    db.release_compression_lock(sid, holder)
    return True
