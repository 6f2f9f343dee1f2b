"""The guard's own extension points, as pluggy hook specifications.

Third-party packages add behaviour by implementing these hooks (and exposing
them through the ``hermes_session_guard`` entry-point group) instead of patching
the guard. The guard's built-in behaviour is registered the same way, from
:mod:`hermes_session_guard.hooks.builtin`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pluggy

from ..compaction_event import COMPACTION_COMPLETED as COMPACTION_COMPLETED
from ..compaction_event import COMPACTION_EVENTS as COMPACTION_EVENTS
from ..compaction_event import COMPACTION_FAILED as COMPACTION_FAILED
from ..compaction_event import COMPACTION_SKIPPED as COMPACTION_SKIPPED
from ..compaction_event import COMPACTION_STARTED as COMPACTION_STARTED
from ..compaction_event import CompactionEvent as CompactionEvent

PROJECT = "hermes_session_guard"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclass(frozen=True)
class LockTable:
    """A table of per-session compression locks inside state.db, as the operator
    commands read it (``status`` lists it, ``doctor`` reports expired rows, ``repair``
    clears them). ``owned_by_guard``: rows are cleared by the guard's own SQL;
    otherwise through the host's lock API."""

    kind: str
    table: str
    session_column: str = "session_id"
    holder_column: str = "holder"
    acquired_column: str = "acquired_at"
    expires_column: str = "expires_at"
    owned_by_guard: bool = True


@dataclass(frozen=True)
class BufferTable:
    """A table of messages held back for a session (``status`` counts them).
    ``pending_where`` is an SQL condition selecting rows not delivered yet."""

    table: str
    session_column: str = "session_id"
    pending_where: str = "1"


@hookspec(firstresult=True)
def session_guard_snapshot_id(session_id: str, created_at: float) -> str | None:
    """Return the id under which the pre-compression transcript of ``session_id``
    is stored. The built-in answer is ``<session_id>.snapshot.<UTC timestamp>``."""


@hookspec
def session_guard_before_compression(session_id: str, op_id: str, messages: list[Any]) -> None:
    """Called before the host compresses ``session_id`` (lock held)."""


@hookspec
def session_guard_after_compression(
    session_id: str, op_id: str, snapshot_id: str | None, compressed: list[Any], agent: Any
) -> None:
    """Called after a compression kept ``session_id`` live and stored its snapshot,
    once the session's compression lock is released and outside the operation's
    pinned log context. ``agent`` is the host's agent
    object. ``compressed`` is the list the conversation continues with: an
    implementation that forks the conversation explicitly (the hand-off
    extension, ``handoff/extension.py``) replaces its contents in place.
    Exceptions are logged, never raised into the host."""


@hookspec
def session_guard_compression_failed(session_id: str, op_id: str, reason: str) -> None:
    """Called when a compression aborted and left the transcript unchanged."""


@hookspec
def session_guard_compaction_event(event: CompactionEvent, agent: Any) -> None:
    """Called when a guarded compaction starts (before its lock is asked for) and once
    when it ends, on the compacting thread. The one source of the compaction events:
    the built-in implementation hands them to the client streams of the entry point that
    runs ``agent`` (:mod:`..host.client_events`) and to OpenTelemetry when it is
    importable (:mod:`..telemetry`). Exceptions are logged, never raised into the host."""


@hookspec
def session_guard_transcript_adopted(session_id: str, op_id: str, generation: int, adopted: list[Any]) -> None:
    """Called when a compression found its message list behind the session's latest
    compaction and took the live transcript (plus its own new messages) instead of
    compacting again."""


@hookspec
def session_guard_lock_tables() -> list[LockTable]:
    """Lock tables the operator commands should know about. The built-in answer
    is the host's native ``compression_locks`` (0.16+); the guard's own lock adds its table."""


@hookspec
def session_guard_buffer_tables() -> list[BufferTable]:
    """Tables of messages buffered while a session compresses (``status`` counts them)."""
