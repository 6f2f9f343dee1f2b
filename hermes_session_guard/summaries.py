"""Recognising, tagging and annotating the host's compaction summaries.

A summary is a message whose text carries the host's summary prefix, either as
the whole message or merged into the first tail message (0.14: summary first,
then the end marker, then the original text; 0.19: "[PRIOR CONTEXT ...]" header,
the original text, a delimiter, then the summary). Nothing here imports Hermes;
the markers come from :mod:`host_adapter`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from . import host_adapter as host
from .store import message_text, text_hash

#: The guard's own marker key (frontends filter on it; never sent to a provider).
SUMMARY_TAG = "is_compressed_summary"

# Where a summary merged into a tail message ends (0.14+: the tail follows it).
SUMMARY_END_MARKER = "--- END OF CONTEXT SUMMARY"

_HEADER_RE = re.compile(r"^\[Original context: session [^\n\]]*\][ \t]*(?:\n|$)", re.MULTILINE)
_HEADER_SNAPSHOT_RE = re.compile(r"^\[Original context: session [^\n\]]*?, snapshot ([^\n\]]+)\]", re.MULTILINE)


def is_summary_text(text: str | None) -> bool:
    """True when ``text`` carries a compaction summary, standalone or merged into
    another message (0.19 puts the prefix after a merge delimiter, so look anywhere)."""
    return bool(text) and any(p in text for p in host.summary_prefixes())


def is_summary_message(message: Any) -> bool:
    """A summary by the guard's tag, the host's own flag, or the host's prefix."""
    if not isinstance(message, dict):
        return False
    if message.get(SUMMARY_TAG) or message.get(host.NATIVE_SUMMARY_KEY):
        return True
    return is_summary_text(message_text(message))


def summary_indices(messages: list[Any]) -> list[int]:
    return [i for i, m in enumerate(messages) if isinstance(m, dict) and is_summary_text(message_text(m))]


content_hash = text_hash


# -- the recall header ---------------------------------------------------------------


def recall_header(session_id: str, first_turn: int, last_turn: int, snapshot_id: str) -> str:
    return f"[Original context: session {session_id}, turns {first_turn}–{last_turn}, snapshot {snapshot_id}]"


def strip_recall_header(text: str) -> str:
    """Remove the guard's ``[Original context: ...]`` line(s); everything else is kept byte for byte."""
    if "[Original context: session " not in text:
        return text
    return _HEADER_RE.sub("", text)


def header_snapshot_ids(text: str | None) -> list[str]:
    return _HEADER_SNAPSHOT_RE.findall(text or "")


def with_recall_header(text: str, header: str) -> str:
    """``text`` with ``header`` as its own line right after the line carrying the
    summary prefix, so prefix-based detection by the host keeps working."""
    text = strip_recall_header(text)
    found = [(text.find(p), p) for p in host.summary_prefixes() if p in text]
    if not found:
        return text
    start, _prefix = min(found)
    end_of_line = text.find("\n", start)
    if end_of_line < 0:
        return f"{text}\n{header}"
    return f"{text[: end_of_line + 1]}{header}\n{text[end_of_line + 1:]}"


def map_summary_text(message: dict[str, Any], fn: Callable[[str], str]) -> None:
    """Apply ``fn`` to the text that carries the summary (string content, or the
    text part of list content that carries it)."""
    content = message.get("content")
    if isinstance(content, str):
        if is_summary_text(content):
            message["content"] = fn(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str) and is_summary_text(part["text"]):
                part["text"] = fn(part["text"])
                return


# -- what is summary and what is the conversation ------------------------------------


def split_summary(text: str) -> tuple[str, str, str]:
    """``(before, summary_block, after)``: the block runs from the summary prefix (or
    the 0.19 merge delimiter in front of it) through the end-marker line."""
    found = [text.find(p) for p in host.summary_prefixes() if p in text]
    if not found:
        return text, "", ""
    start = prefix_at = min(found)
    prior_header, delimiter = host.merged_summary_markers()
    if delimiter:
        d = text.rfind(delimiter, 0, prefix_at)
        if d >= 0:
            start = d
    marker = text.find(SUMMARY_END_MARKER, prefix_at)
    if marker >= 0:
        nl = text.find("\n", marker)
        end = len(text) if nl < 0 else nl + 1
    else:
        end = len(text)
    before, block, after = text[:start], text[start:end], text[end:]
    if prior_header and before.lstrip().startswith(prior_header):
        before = before.lstrip()[len(prior_header):]
    return before, block, after


def original_part(text: str | None) -> str:
    """The conversation text of a message with every summary block removed
    (empty for a standalone summary; the real user text of a merged one)."""
    text = text or ""
    for _ in range(8):  # a message never carries more than a couple of blocks
        before, block, after = split_summary(text)
        if not block:
            break
        text = f"{before.strip()}\n\n{after.strip()}".strip()
    return text.strip()


def summary_body(text: str) -> str:
    """What follows the prefix, up to a merged message's end marker: the summary
    the model wrote."""
    for prefix in host.summary_prefixes():
        if prefix in text:
            text = text.split(prefix, 1)[1]
            break
    return strip_recall_header(text.split(SUMMARY_END_MARKER, 1)[0]).strip()


def summary_is_empty(messages: list[Any]) -> bool:
    """The compressor inserted a summary marker with nothing behind it (an empty
    answer from the summary model that the host did not treat as a failure)."""
    found = summary_indices(messages)
    return bool(found) and all(not summary_body(message_text(messages[i]) or "") for i in found)


def summary_body_size(messages: list[Any]) -> int:
    """Characters of summary text (after the prefixes) in ``messages``."""
    return sum(len(summary_body(message_text(messages[i]) or "")) for i in summary_indices(messages))


# -- which turns were compacted -----------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    return (
        isinstance(a, dict) and isinstance(b, dict) and a.get("role") == b.get("role")
        and message_text(a) == message_text(b)
    )


def _kept_in(original: Any, new: Any) -> bool:
    """``new`` is ``original`` itself, or ``original`` with the summary merged into it."""
    if _same(original, new):
        return True
    if not (isinstance(original, dict) and isinstance(new, dict)):
        return False
    old_text, new_text = (message_text(original) or "").strip(), message_text(new) or ""
    return bool(old_text) and is_summary_text(new_text) and old_text in new_text


def compacted_range(before: list[Any], after: list[Any]) -> tuple[int, int] | None:
    """1-based positions ``(first, last)`` of the turns of ``before`` that ``after``
    no longer carries verbatim: the protected head and tail are matched from
    both ends, whatever lies between was summarised."""
    n, m = len(before), len(after)
    head = 0
    while head < min(n, m) and _same(before[head], after[head]):
        head += 1
    tail = 0
    while tail < n - head and tail < m - head and _kept_in(before[n - 1 - tail], after[m - 1 - tail]):
        tail += 1
    first, last = head + 1, n - tail
    return (first, last) if first <= last else None


# -- tagging ---------------------------------------------------------------------------


def tag(message: dict[str, Any], native_key: str | None) -> None:
    message[SUMMARY_TAG] = True
    if native_key:
        message[native_key] = True


def new_summary_indices(before: list[Any], after: list[Any]) -> list[int]:
    """Summaries in ``after`` that were not already in ``before`` (an earlier
    summary kept in the protected head keeps its own header)."""
    old = {message_text(m) for m in before if isinstance(m, dict)}
    return [i for i in summary_indices(after) if message_text(after[i]) not in old]


def decorate_summaries(
    before: list[Any],
    after: list[Any],
    *,
    session_id: str,
    snapshot_id: str,
    header: bool,
    native_key: str | None,
    produced: list[int] | None = None,
) -> list[int]:
    """Tag every summary in ``after`` and give the new ones the recall header.
    ``produced``: positions of summaries known from the compaction itself (an engine's
    own format, without Hermes's prefix); they are tagged too (no header: there is
    no prefix line to put it after). Returns the indices of the new summaries."""
    fresh = new_summary_indices(before, after)
    span = compacted_range(before, after)
    for i in sorted({*summary_indices(after), *(produced or ())}):
        tag(after[i], native_key)
    if header and span is not None:
        line = recall_header(session_id, span[0], span[1], snapshot_id)
        for i in fresh:
            map_summary_text(after[i], lambda text: with_recall_header(text, line))
    return fresh


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
