"""Built-in behaviour of the guard, registered as ordinary pluggy hook implementations."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..host import NATIVE_LOCK_TABLE
from ..inbox.repository import INBOX_TABLE, UNDELIVERED
from ..seam_behaviour import LockMode
from ..store import LOCK_TABLE
from .specs import BufferTable, CompactionEvent, LockTable, hookimpl


def snapshot_timestamp(created_at: float) -> str:
    """UTC timestamp used in snapshot ids, e.g. ``20260528T161635.123456Z``."""
    return datetime.fromtimestamp(created_at, UTC).strftime("%Y%m%dT%H%M%S.%fZ")


@hookimpl(trylast=True)
def session_guard_snapshot_id(session_id: str, created_at: float) -> str:
    return f"{session_id}.snapshot.{snapshot_timestamp(created_at)}"


@hookimpl
def session_guard_lock_tables() -> list[LockTable]:
    """Hermes's native lock (0.16+; cleared through its own API) and the guard's own
    lease table (cleared by the guard's SQL), in that order."""
    return [
        LockTable(kind=LockMode.NATIVE, table=NATIVE_LOCK_TABLE, owned_by_guard=False),
        LockTable(kind=LockMode.GUARD, table=LOCK_TABLE, owned_by_guard=True),
    ]


@hookimpl
def session_guard_buffer_tables() -> list[BufferTable]:
    """The guard's inbox: messages that arrived while their session compressed and
    whose turn has not finished yet (buffered, or handed to the gateway)."""
    states = ", ".join(f"'{s}'" for s in UNDELIVERED)
    return [BufferTable(table=INBOX_TABLE, session_column="session_id", pending_where=f"state IN ({states})")]


@hookimpl
def session_guard_compaction_event(event: CompactionEvent, agent: Any) -> None:
    """The compaction events on the client streams and chats, and as OpenTelemetry
    span and metrics when its API is importable (docs/events.md)."""
    from .. import telemetry
    from ..host import client_events
    from ..runtime import current_runtime

    runtime = current_runtime()
    chat_status = runtime is None or runtime.config.events.chat_status
    chat_records = runtime is not None and runtime.config.events.chat_completions_records
    try:
        telemetry.record(event)
    finally:
        client_events.deliver(agent, event, chat_status, chat_records)
        if runtime is not None and chat_status and event.ended and not client_events.has_status_channel(agent):
            # No one to tell while it runs (the gateway's session hygiene compacts with a
            # quiet agent before the turn): a gateway says it before the turn's answer.
            runtime.notices.add(event.session_id, client_events.status_text(event))
