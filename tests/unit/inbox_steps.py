"""A step the guard itself never takes alone: handing the oldest buffered message to a runner."""

from __future__ import annotations

import time

from hermes_session_guard.inbox import repository
from hermes_session_guard.inbox.repository import BUFFERED, DISPATCHED, Inbox, InboxEntry


def dispatch_next(inbox: Inbox, session_key: str, owner: str) -> InboxEntry | None:
    """Move the oldest buffered message of this session to dispatched (owned by ``owner``);
    returns it as it was before the move, or ``None`` when none is buffered."""
    with inbox.store.transaction(wait_for_disk=False) as conn:
        row = conn.execute(
            f"SELECT {repository._COLUMNS} FROM session_guard_inbox WHERE session_key = ? AND state = ?"
            " ORDER BY seq LIMIT 1",
            (session_key, BUFFERED),
        ).fetchone()
        if row is None:
            return None
        conn.execute(
            "UPDATE session_guard_inbox SET state = ?, dispatched_at = ?, owner = ? WHERE seq = ?",
            (DISPATCHED, time.time(), owner, row[0]),
        )
    return InboxEntry.from_row(row)
