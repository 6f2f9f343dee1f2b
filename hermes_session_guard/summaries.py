"""Recognising the host's compaction summaries inside a message list."""

from __future__ import annotations

from typing import Any

from . import host_adapter as host
from .store import message_text


def is_summary_text(text: str | None) -> bool:
    """True when ``text`` carries a compaction summary, standalone or merged into
    another message (0.19 puts the prefix after a merge delimiter, so look anywhere)."""
    return bool(text) and any(p in text for p in host.summary_prefixes())


def summary_indices(messages: list[Any]) -> list[int]:
    return [i for i, m in enumerate(messages) if isinstance(m, dict) and is_summary_text(message_text(m))]


# Where a summary merged into a tail message ends (0.14+: the tail follows it).
SUMMARY_END_MARKER = "--- END OF CONTEXT SUMMARY"


def summary_body(text: str) -> str:
    """What follows the prefix, up to a merged message's end marker: the summary
    the model wrote."""
    for prefix in host.summary_prefixes():
        if prefix in text:
            text = text.split(prefix, 1)[1]
            break
    return text.split(SUMMARY_END_MARKER, 1)[0].strip()


def summary_is_empty(messages: list[Any]) -> bool:
    """The compressor inserted a summary marker with nothing behind it (an empty
    answer from the summary model that the host did not treat as a failure)."""
    found = summary_indices(messages)
    return bool(found) and all(not summary_body(message_text(messages[i]) or "") for i in found)


def summary_body_size(messages: list[Any]) -> int:
    """Characters of summary text (after the prefixes) in ``messages``."""
    return sum(len(summary_body(message_text(messages[i]) or "")) for i in summary_indices(messages))


# 0.19's merge form keeps the tail message's own text BEFORE the summary, between these.
MERGED_PRIOR_HEADER = "[PRIOR CONTEXT — for reference only; not a new message]"
MERGED_SUMMARY_DELIMITER = "[END OF PRIOR CONTEXT — COMPACTION SUMMARY BELOW]"


def text_without_summary(text: str) -> str:
    """What a message says besides a compaction summary merged into it ("" for a
    standalone summary): the text after the end marker (0.14+) or the prior text
    wrapped before the summary (0.19)."""
    if not is_summary_text(text):
        return text
    if SUMMARY_END_MARKER in text:
        after = text.split(SUMMARY_END_MARKER, 1)[1]
        after = after.split("---", 1)[1] if "---" in after else ""
        return after.strip()
    if MERGED_SUMMARY_DELIMITER in text:
        before = text.split(MERGED_SUMMARY_DELIMITER, 1)[0]
        return before.replace(MERGED_PRIOR_HEADER, "", 1).strip()
    return ""
