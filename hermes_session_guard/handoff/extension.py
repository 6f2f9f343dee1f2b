"""Hand-off as an extension of the guard: its pluggy hook implementations.

It enters the guard the way an installed extension does (docs/extensions.md), through
the guard's own hooks: the composition root (the package's ``__init__.py``) registers
this module on the plugin manager under :data:`NAME` when ``handoff.enabled`` is true
and leaves it out otherwise; nothing else in the guard imports hand-off. Removing it is
removing ``handoff/``, ``commands/handoff.py`` and the root's lines that name them.
"""

from __future__ import annotations

from typing import Any

from ..hooks.specs import hookimpl
from ..runtime import current_runtime

NAME = "handoff"


@hookimpl(trylast=True)
def session_guard_after_compression(session_id: str, op_id: str, compressed: list[Any], agent: Any) -> None:
    """Bounded hand-off to a fresh session after repeated compressions (``handoff:``); it
    runs after the other extensions' implementations of the hook, as it may replace
    ``compressed`` (the conversation's continuation) in place."""
    from .writer import after_compression  # the writer and the packet load at the first compaction, not at start

    runtime = current_runtime()
    if runtime is not None:
        after_compression(runtime, agent, session_id, op_id, compressed)
