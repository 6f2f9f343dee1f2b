"""What people see: compaction summaries are a backend mechanism.

``session_guard.summaries.visible``:

``false`` (default)
    display surfaces drop standalone summaries and show a merged message without
    its summary block; text delivered to a chat platform loses any summary the
    guard recorded that a model repeated verbatim (a message that was nothing but
    that summary is not sent).
``tagged``
    everything is shown, and surfaces that carry message metadata mark summaries
    with ``is_compressed_summary: true`` so a frontend can decide.

What is a summary is decided by what was recorded (the guard's tag, Hermes's own
flag, the content hashes the guard stored, the summaries this process tagged),
never by the summary prefix appearing in a message: a reply or a user message
that quotes ``[CONTEXT SUMMARY]:`` is shown and delivered whole.

The model's own context is never filtered here: only display copies are.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Iterable
from typing import Any

from ..store import message_text
from .tags import (
    SUMMARY_TAG,
    is_summary_message,
    original_part,
    recorded_summaries,
    split_summary,
)

HIDDEN = "false"
TAGGED = "tagged"

# A repeated summary shorter than this is not looked for in outgoing text (a
# near-empty summary would match ordinary words).
MIN_REPEATED_CHARS = 40
# How many of the latest recorded summaries outgoing text is compared with.
MAX_RECENT = 64


def display_messages(messages: list[Any], mode: str, known_hashes: Collection[str] = ()) -> list[Any]:
    """A display copy of ``messages``: recorded summaries hidden (``false``) or tagged."""
    out: list[Any] = []
    for message in messages:
        if not is_summary_message(message, known_hashes):
            out.append(message)
            continue
        if mode == TAGGED:
            out.append({**message, SUMMARY_TAG: True})
            continue
        text = message_text(message)
        # A summary in an engine's own format (tagged from what the compaction produced)
        # is the whole message; only a Hermes summary can be merged into a turn.
        rest = original_part(text) if text and split_summary(text)[1] else ""
        if rest:
            clean = {k: v for k, v in message.items() if k != SUMMARY_TAG and not k.startswith("_compressed")}
            clean["content"] = rest
            out.append(clean)
    return out


def _blocks(summary_texts: Iterable[str]) -> list[str]:
    """The summary blocks (prefix through end marker) of recorded summary texts,
    longest first."""
    out = set()
    for text in summary_texts:
        block = (split_summary(text)[1] or text).strip()
        if len(block) >= MIN_REPEATED_CHARS:
            out.add(block)
    return sorted(out, key=len, reverse=True)


@functools.lru_cache(maxsize=128)
def _loose(block: str) -> re.Pattern[str]:
    """``block`` matched with any run of whitespace between its words (and the
    whitespace after it, so the cut leaves no gap)."""
    return re.compile(r"\s+".join(re.escape(word) for word in block.split()) + r"\s*")


def outgoing_text(text: str, mode: str, summary_texts: Iterable[str] | None = None) -> str | None:
    """Text a chat platform receives: in ``false`` mode, every recorded summary
    (``summary_texts``; default: those this process recorded) that the text repeats
    is cut out; ``None`` when nothing else is left (the message is not sent). Text
    that only mentions the summary prefix goes out unchanged."""
    if mode == TAGGED or not text:
        return text
    blocks = _blocks(recorded_summaries()[:MAX_RECENT] if summary_texts is None else summary_texts)
    kept = text
    for block in blocks:
        if block.split()[0] in kept:  # cheap test before the pattern
            kept = _loose(block).sub("", kept)
    if kept == text:
        return text
    return kept.strip() or None


def tag_rendered(entries: list[Any], history: list[Any] | None = None) -> list[Any]:
    """Mark rendered history entries (``{"role", "text"}``) rendered from a recorded
    summary of ``history``."""
    texts = {(message_text(m) or "").strip() for m in history or [] if is_summary_message(m)}
    texts.discard("")
    if not texts:
        return entries
    for entry in entries:
        if isinstance(entry, dict) and str(entry.get("text") or entry.get("content") or "").strip() in texts:
            entry[SUMMARY_TAG] = True
    return entries
