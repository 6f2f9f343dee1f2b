"""The guard's own extension points, as pluggy hook specifications.

Third-party packages add behaviour by implementing these hooks (and exposing
them through the ``hermes_session_guard`` entry-point group) instead of patching
the guard. The guard's built-in behaviour is registered the same way, from
:mod:`hermes_session_guard.builtin_hooks`.
"""

from __future__ import annotations

from typing import Any

import pluggy

PROJECT = "hermes_session_guard"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec(firstresult=True)
def session_guard_snapshot_id(session_id: str, created_at: float) -> str | None:
    """Return the id under which the pre-compression transcript of ``session_id``
    is stored. The built-in answer is ``<session_id>.snapshot.<UTC timestamp>``."""


@hookspec
def session_guard_before_compression(session_id: str, op_id: str, messages: list[Any]) -> None:
    """Called before the host compresses ``session_id`` (lock held)."""


@hookspec
def session_guard_after_compression(
    session_id: str, op_id: str, snapshot_id: str | None, compressed: list[Any]
) -> None:
    """Called after a compression kept ``session_id`` live and stored its snapshot."""


@hookspec
def session_guard_compression_failed(session_id: str, op_id: str, reason: str) -> None:
    """Called when a compression aborted and left the transcript unchanged."""


@hookspec
def session_guard_transcript_adopted(session_id: str, op_id: str, generation: int, adopted: list[Any]) -> None:
    """Called when a compression found its message list behind the session's latest
    compaction and took the live transcript (plus its own new messages) instead of
    compacting again."""
