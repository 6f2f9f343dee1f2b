"""What ``summaries/`` needs from Hermes, handed in from outside.

``summaries/`` never imports ``host/`` or Hermes (docs/architecture.md, rule 3). The
package's composition root (``hermes_session_guard/__init__.py``) binds ``host/`` here
once, at import; every call below asks the bound object at call time, so a test that
patches ``host.<name>`` is seen. Unbound (``summaries/`` imported on its own), the
markers fall back to the ones every supported release writes, and a state.db read
raises :class:`HostNotBound` naming what is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

#: Hermes's own in-memory summary flag (0.17+); releases before it do not know the key.
NATIVE_SUMMARY_KEY = "_compressed_summary"
DEFAULT_SUMMARY_PREFIXES = ("[CONTEXT COMPACTION — REFERENCE ONLY]", "[CONTEXT SUMMARY]:")
DEFAULT_MERGED_MARKERS = (
    "[PRIOR CONTEXT — for reference only; not a new message]",
    "[END OF PRIOR CONTEXT — COMPACTION SUMMARY BELOW]",
)


class HostFacts(Protocol):
    """The part of ``host/`` that ``summaries/`` calls."""

    def summary_prefixes(self) -> tuple[str, ...]: ...
    def merged_summary_markers(self) -> tuple[str, str]: ...
    def compression_ancestors(self, db_path: Path, sid: str, limit: int = 64) -> list[str]: ...
    def stored_turns(self, db_path: Path, sid: str, after_id: int, *,
                     archived_only: bool) -> list[tuple[int, int, str, str]]: ...
    def last_row_id(self, db_path: Path, sid: str) -> int: ...
    def stored_message(self, db_path: Path, row_id: int) -> str | None: ...
    def session_id(self, agent: Any) -> str: ...
    def db_path(self, agent: Any) -> Path: ...
    def tool_names(self, agent: Any) -> set[str]: ...


class HostNotBound(RuntimeError):
    """``summaries/`` was asked to read Hermes before the package bound ``host/``."""


_bound: HostFacts | None = None


def bind(facts: HostFacts) -> None:
    """Hand ``summaries/`` the host adapter (idempotent)."""
    global _bound
    _bound = facts


def bound() -> HostFacts:
    if _bound is None:
        raise HostNotBound("summaries/ reads Hermes through host/, which is not bound: import hermes_session_guard "
                           "(its __init__ binds it) before calling the recall tool")
    return _bound


def summary_prefixes() -> tuple[str, ...]:
    return _bound.summary_prefixes() if _bound is not None else DEFAULT_SUMMARY_PREFIXES


def merged_summary_markers() -> tuple[str, str]:
    return _bound.merged_summary_markers() if _bound is not None else DEFAULT_MERGED_MARKERS
