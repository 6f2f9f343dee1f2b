"""What people see: compaction summaries are a backend mechanism.

``session_guard.summaries.visible``:

``false`` (default)
    display surfaces drop standalone summaries and show a merged message without
    its summary block; text delivered to a chat platform has every summary block
    removed (a message that was nothing but a summary is not sent).
``tagged``
    everything is shown, and surfaces that carry message metadata mark summaries
    with ``is_compressed_summary: true`` so a frontend can decide.

The model's own context is never filtered here: only display copies are.
"""

from __future__ import annotations

from typing import Any

from .store import message_text
from .summaries import SUMMARY_TAG, is_summary_message, is_summary_text, original_part

HIDDEN = "false"
TAGGED = "tagged"


def display_messages(messages: list[Any], mode: str) -> list[Any]:
    """A display copy of ``messages``: summaries hidden (``false``) or tagged."""
    out: list[Any] = []
    for message in messages:
        if not is_summary_message(message):
            out.append(message)
            continue
        if mode == TAGGED:
            out.append({**message, SUMMARY_TAG: True})
            continue
        text = message_text(message)
        # A summary in an engine's own format (tagged from what the compaction produced)
        # is the whole message; only a Hermes summary can be merged into a turn.
        rest = original_part(text) if is_summary_text(text) else ""
        if rest:
            clean = {k: v for k, v in message.items() if k != SUMMARY_TAG and not k.startswith("_compressed")}
            clean["content"] = rest
            out.append(clean)
    return out


def outgoing_text(text: str, mode: str) -> str | None:
    """Text a chat platform receives: summary blocks removed in ``false`` mode;
    ``None`` when nothing else is left (the message is not sent)."""
    if mode == TAGGED or not is_summary_text(text):
        return text
    kept = original_part(text)
    if kept == text.strip():
        return text
    return kept or None


def tag_rendered(entries: list[Any]) -> list[Any]:
    """Mark rendered history entries (``{"role", "text"}``) that carry a summary."""
    for entry in entries:
        if isinstance(entry, dict) and is_summary_text(str(entry.get("text") or entry.get("content") or "")):
            entry[SUMMARY_TAG] = True
    return entries
