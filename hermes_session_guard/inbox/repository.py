"""The inbox: a durable per-session FIFO of messages that arrived while the session
was compressing, kept in the guard's own ``session_guard_inbox`` table.

A message moves through three states, each change one committed transaction:

``buffered``
    stored in arrival order (``seq``) with everything needed to rebuild it;
    the sender's receipt is sent only after this commit.
``dispatched``
    handed to the gateway as the next turn by one gateway runner (``owner``).
``delivered``
    the turn that carried it has finished: the message is in the session's
    transcript. Set exactly once.
``failed``
    could not be turned back into a gateway message (logged loudly, kept for inspection).

A ``dispatched`` message whose owner is gone (crash, restart) is either found in
the transcript (then ``delivered``) or put back to ``buffered`` and replayed.

Durability: the append is committed and on disk before it returns (the sender's
receipt promises that). The later state changes are committed without waiting for
the disk (WAL ``synchronous=NORMAL``): they survive a process crash; a power loss
can roll the latest back to ``buffered``/``dispatched``, which the startup replay
resolves from the transcript.
Nothing here knows Hermes; the gateway side is in :mod:`hermes_session_guard.seams.buffering`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..safe_text import json_text, searchable
from ..store import GuardStore

BUFFERED = "buffered"
DISPATCHED = "dispatched"
DELIVERED = "delivered"
FAILED = "failed"
UNDELIVERED = (BUFFERED, DISPATCHED)
INBOX_TABLE = "session_guard_inbox"

_COLUMNS = (
    "seq, session_key, session_id, op_id, position, state, text, user_id, payload,"
    " buffered_at, dispatched_at, delivered_at, owner"
)


@dataclass(frozen=True)
class InboxEntry:
    seq: int
    session_key: str
    session_id: str | None
    op_id: str | None
    position: int
    state: str
    text: str | None
    user_id: str | None
    payload: dict[str, Any]
    buffered_at: float
    dispatched_at: float | None
    delivered_at: float | None
    owner: str | None

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> InboxEntry:
        values = list(row)
        values[8] = json.loads(values[8])
        return cls(*values)


class InboxFull(Exception):
    """The operator's ``buffer.max_messages`` is reached for this session."""

    def __init__(self, waiting: int, limit: int) -> None:
        super().__init__(f"{waiting} messages already waiting (limit {limit})")
        self.waiting = waiting
        self.limit = limit


class Inbox:
    """The ``session_guard_inbox`` table of one state.db."""

    def __init__(self, store: GuardStore) -> None:
        self.store = store

    def append(
        self,
        *,
        session_key: str,
        session_id: str | None,
        op_id: str | None,
        payload: dict[str, Any],
        text: str | None = None,
        user_id: str | None = None,
        max_messages: int = 0,
    ) -> InboxEntry:
        """Store one message at the tail (committed before returning). With
        ``max_messages`` > 0 and that many undelivered already, raise :class:`InboxFull`."""
        data = json_text(payload)  # any str, lone surrogates included (safe_text)
        text = None if text is None else searchable(text)
        now = time.time()
        with self.store.transaction(wait_for_disk=True) as conn:
            if max_messages > 0:
                (waiting,) = conn.execute(
                    "SELECT COUNT(*) FROM session_guard_inbox WHERE session_key = ? AND state IN (?, ?)",
                    (session_key, *UNDELIVERED),
                ).fetchone()
                if waiting >= max_messages:
                    raise InboxFull(waiting, max_messages)
            (position,) = conn.execute(
                "SELECT COALESCE(MAX(position), 0) + 1 FROM session_guard_inbox WHERE session_key = ? AND op_id IS ?",
                (session_key, op_id),
            ).fetchone()
            cur = conn.execute(
                "INSERT INTO session_guard_inbox(session_key, session_id, op_id, position, state, text, user_id,"
                " payload, buffered_at) VALUES (?,?,?,?,?,?,?,?,?)",
                (session_key, session_id, op_id, position, BUFFERED, text, user_id, data, now),
            )
            seq = int(cur.lastrowid or 0)
        return InboxEntry(seq, session_key, session_id, op_id, position, BUFFERED, text, user_id,
                          json.loads(data), now, None, None, None)

    # -- reading --------------------------------------------------------------------
    def entries(self, session_key: str | None = None, states: Iterable[str] | None = None) -> list[InboxEntry]:
        query = f"SELECT {_COLUMNS} FROM session_guard_inbox WHERE 1=1"
        params: list[Any] = []
        if session_key is not None:
            query += " AND session_key = ?"
            params.append(session_key)
        if states is not None:
            states = tuple(states)
            query += f" AND state IN ({','.join('?' * len(states))})"
            params.extend(states)
        return [InboxEntry.from_row(r) for r in self.store.read_all(query + " ORDER BY seq", params)]

    def has_undelivered(self, session_key: str) -> bool:
        return self.store.read_one("SELECT 1 FROM session_guard_inbox WHERE session_key = ? AND state IN (?, ?)"
                                   " LIMIT 1", (session_key, *UNDELIVERED)) is not None

    def buffered_during(self, op_id: str) -> int:
        """How many messages were buffered while compression ``op_id`` ran (any state now)."""
        return int(self.store.read_one("SELECT COUNT(*) FROM session_guard_inbox WHERE op_id = ?", (op_id,))[0])

    def latest_op(self, session_key: str) -> str | None:
        """The compression op of the newest undelivered message (the queue it joins)."""
        row = self.store.read_one("SELECT op_id FROM session_guard_inbox WHERE session_key = ? AND state IN (?, ?)"
                                  " ORDER BY seq DESC LIMIT 1", (session_key, *UNDELIVERED))
        return row[0] if row else None

    def undelivered_keys(self) -> list[str]:
        return [r[0] for r in self.store.read_all("SELECT session_key, MIN(seq) AS first FROM session_guard_inbox"
                                                  " WHERE state IN (?, ?) GROUP BY session_key ORDER BY first",
                                                  UNDELIVERED)]

    # -- state changes --------------------------------------------------------------
    def settle_and_dispatch(
        self, session_key: str, owner: str, *, keep: Iterable[int] = (), dispatch: bool = True
    ) -> tuple[list[InboxEntry], InboxEntry | None]:
        """In one transaction: mark every message ``owner`` dispatched for this session
        (except ``keep``, still in flight) delivered, then (with ``dispatch``) move the
        oldest buffered one to dispatched. Returns (newly delivered, dispatched or None)."""
        keep = set(keep)
        now = time.time()
        with self.store.transaction(wait_for_disk=False) as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM session_guard_inbox WHERE session_key = ? AND state = ? AND owner = ?"
                " ORDER BY seq",
                (session_key, DISPATCHED, owner),
            ).fetchall()
            settled = [InboxEntry.from_row(r) for r in rows if r[0] not in keep]
            if settled:
                conn.executemany(
                    "UPDATE session_guard_inbox SET state = ?, delivered_at = ? WHERE seq = ? AND state = ?",
                    [(DELIVERED, now, e.seq, DISPATCHED) for e in settled],
                )
            nxt = None
            if dispatch:
                row = conn.execute(
                    f"SELECT {_COLUMNS} FROM session_guard_inbox WHERE session_key = ? AND state = ?"
                    " ORDER BY seq LIMIT 1",
                    (session_key, BUFFERED),
                ).fetchone()
                if row is not None:
                    conn.execute(
                        "UPDATE session_guard_inbox SET state = ?, dispatched_at = ?, owner = ? WHERE seq = ?",
                        (DISPATCHED, now, owner, row[0]),
                    )
                    nxt = InboxEntry.from_row(row)
        return settled, nxt

    def requeue(self, seq: int) -> bool:
        """Put a dispatched message back in the queue (it keeps its place)."""
        with self.store.transaction(wait_for_disk=False) as conn:
            cur = conn.execute(
                "UPDATE session_guard_inbox SET state = ?, dispatched_at = NULL, owner = NULL"
                " WHERE seq = ? AND state = ?",
                (BUFFERED, seq, DISPATCHED),
            )
        return cur.rowcount > 0

    def mark_delivered(self, seqs: Iterable[int]) -> int:
        now = time.time()
        with self.store.transaction(wait_for_disk=False) as conn:
            cur = conn.executemany(
                "UPDATE session_guard_inbox SET state = ?, delivered_at = ? WHERE seq = ? AND state != ?",
                [(DELIVERED, now, s, DELIVERED) for s in seqs],
            )
        return cur.rowcount

    def fail(self, seq: int) -> None:
        with self.store.transaction() as conn:
            conn.execute("UPDATE session_guard_inbox SET state = ? WHERE seq = ?", (FAILED, seq))
