"""The guard's own cross-process leases (``session_guard_locks`` for compressions, see
:mod:`hermes_session_guard.locks.session_lock`; ``session_guard_turn_locks`` for turns, see
:mod:`hermes_session_guard.locks.turn_lock`) and clearing a row of one of its lock tables."""

from __future__ import annotations

import time

from .connection import StoreConnection
from .schema import LOCK_TABLE, TURN_DDL, TURN_TABLE

_LEASE_DDL = {LOCK_TABLE: None, TURN_TABLE: TURN_DDL}  # the turn table is created on first use


class LeaseRepository(StoreConnection):
    """Leases with an expiry, taken, refreshed and released by their holder: one
    implementation for the compression leases (``session_guard_locks``) and the turn
    leases of 0.13-0.19 (``session_guard_turn_locks``, created on first use). ``now``
    is the caller's wall clock (expiry times are compared across processes)."""

    def _lease_table(self, table: str) -> str:
        if table not in _LEASE_DDL:
            raise ValueError(f"{table} is not one of the guard's lease tables ({', '.join(_LEASE_DDL)})")
        ddl = _LEASE_DDL[table]
        if ddl is not None:
            self.ensure_table(table, ddl)
        return table

    def try_acquire_lease(self, session_id: str, holder: str, ttl_seconds: float, now: float | None = None, *,
                          table: str = LOCK_TABLE) -> bool:
        """Take the lease on ``session_id`` for ``holder`` unless someone else holds an
        unexpired one; an expired lease (its holder crashed) is taken over."""
        table = self._lease_table(table)
        now = time.time() if now is None else now
        with self.transaction() as conn:
            conn.execute(f"DELETE FROM {table} WHERE session_id = ? AND expires_at < ?", (session_id, now))
            conn.execute(
                f"INSERT OR IGNORE INTO {table}(session_id, holder, acquired_at, expires_at) VALUES (?,?,?,?)",
                (session_id, holder, now, now + ttl_seconds),
            )
            row = conn.execute(f"SELECT holder FROM {table} WHERE session_id = ?", (session_id,)).fetchone()
        return row is not None and row[0] == holder

    def refresh_lease(self, session_id: str, holder: str, ttl_seconds: float, now: float | None = None, *,
                      table: str = LOCK_TABLE) -> bool:
        """Extend ``holder``'s lease; False if it expired or belongs to someone else now."""
        table = self._lease_table(table)
        now = time.time() if now is None else now
        with self.transaction() as conn:
            cur = conn.execute(
                f"UPDATE {table} SET expires_at = ? WHERE session_id = ? AND holder = ? AND expires_at >= ?",
                (now + ttl_seconds, session_id, holder, now),
            )
        return cur.rowcount > 0

    def release_lease(self, session_id: str, holder: str, *, table: str = LOCK_TABLE) -> bool:
        """Drop the lease if ``holder`` still owns it (a late holder never frees a successor's)."""
        table = self._lease_table(table)
        with self.transaction() as conn:
            cur = conn.execute(f"DELETE FROM {table} WHERE session_id = ? AND holder = ?", (session_id, holder))
        return cur.rowcount > 0

    def lease_holder(self, session_id: str, now: float | None = None, *, table: str = LOCK_TABLE) -> str | None:
        """Who holds an unexpired lease on ``session_id``, if anyone."""
        table = self._lease_table(table)
        now = time.time() if now is None else now
        row = self.read_one(f"SELECT holder FROM {table} WHERE session_id = ? AND expires_at >= ?", (session_id, now))
        return row[0] if row else None

    def clear_expired_lock(self, *, table: str, session_column: str, expires_column: str, session_id: str,
                           now: float) -> bool:
        """Delete one expired row of one of the guard's own lock tables."""
        if not table.startswith("session_guard_"):
            raise ValueError(f"{table} is not a session guard table")
        with self.transaction() as conn:
            cur = conn.execute(
                f"DELETE FROM {table} WHERE {session_column} = ? AND {expires_column} < ?", (session_id, now)
            )
        return cur.rowcount > 0

    def clear_lock_of(self, *, table: str, session_column: str, holder_column: str, session_id: str,
                      holder: str) -> bool:
        """Delete one row of one of the guard's own lock tables, only while ``holder`` holds it."""
        if not table.startswith("session_guard_"):
            raise ValueError(f"{table} is not a session guard table")
        with self.transaction() as conn:
            cur = conn.execute(
                f"DELETE FROM {table} WHERE {session_column} = ? AND {holder_column} = ?", (session_id, holder)
            )
        return cur.rowcount > 0
