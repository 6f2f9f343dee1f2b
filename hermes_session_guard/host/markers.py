"""The host's compaction-summary markers (prefixes, merged-summary header and
delimiter, the in-memory summary flag), read from the installed compressor module
with built-in defaults for hosts that do not define them."""

from __future__ import annotations

import logging
from typing import Any

# One source for the defaults and the host's in-memory summary flag (0.17+): summaries/
# reads them without importing host/.
from ..summaries.host_port import DEFAULT_MERGED_MARKERS as _DEFAULT_MERGED_MARKERS
from ..summaries.host_port import DEFAULT_SUMMARY_PREFIXES as _DEFAULT_SUMMARY_PREFIXES
from ..summaries.host_port import NATIVE_SUMMARY_KEY

__all__ = ["NATIVE_SUMMARY_KEY", "SUMMARY_MARKERS", "carries_summary_marker", "merged_summary_markers",
           "summary_prefixes"]

log = logging.getLogger("hermes_session_guard")

_markers: dict[str, tuple[str, ...]] = {}


def _compressor_module() -> Any:
    try:
        from agent import context_compressor as cc
    except ImportError as exc:  # the built-in default markers stand in
        log.debug("session guard: agent.context_compressor is not importable (%s: %s)", type(exc).__name__, exc)
        return None
    return cc


def summary_prefixes() -> tuple[str, ...]:
    """The host's summary markers: ``SUMMARY_PREFIX``, the historical prefixes it
    still recognises (0.19) and the legacy one first (so a summary body can be cut
    after them), then the short stable markers."""
    cached = _markers.get("prefixes")
    if cached:
        return cached
    cc = _compressor_module()
    if cc is None:
        return _DEFAULT_SUMMARY_PREFIXES
    candidates = (
        getattr(cc, "SUMMARY_PREFIX", None),
        *tuple(getattr(cc, "_HISTORICAL_SUMMARY_PREFIXES", ()) or ()),
        getattr(cc, "LEGACY_SUMMARY_PREFIX", None),
    )
    found = tuple(p for p in candidates if isinstance(p, str) and p)
    # The short stable markers last: a summary body is cut after the full prefix.
    _markers["prefixes"] = found + tuple(p for p in _DEFAULT_SUMMARY_PREFIXES if p not in found)
    return _markers["prefixes"]


def merged_summary_markers() -> tuple[str, str]:
    """``(prior_context_header, delimiter)`` of a summary merged into a tail
    message (0.19); the defaults are harmless on hosts that never write them."""
    cached = _markers.get("merged")
    if cached:
        return cached[0], cached[1]
    cc = _compressor_module()
    header = getattr(cc, "_MERGED_PRIOR_CONTEXT_HEADER", None) or _DEFAULT_MERGED_MARKERS[0]
    delimiter = getattr(cc, "_MERGED_SUMMARY_DELIMITER", None) or _DEFAULT_MERGED_MARKERS[1]
    if cc is not None:
        _markers["merged"] = (header, delimiter)
    return header, delimiter


SUMMARY_MARKERS = _DEFAULT_SUMMARY_PREFIXES  # the same on every supported release


def carries_summary_marker(text: str) -> bool:
    """The stored text holds a compaction summary (standalone or merged into a turn)."""
    return any(marker in text for marker in SUMMARY_MARKERS)
