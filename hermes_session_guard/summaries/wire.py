"""What reaches a model provider: never a key the guard added to a message.

``is_compressed_summary`` is for frontends; strict OpenAI-compatible providers
answer 400 "Extra inputs are not permitted" to any unknown message key, and
Hermes 0.14 sends every key it finds (0.15+ strip ``_``-prefixed keys only).
"""

from __future__ import annotations

from typing import Any

from .host_port import NATIVE_SUMMARY_KEY
from .tags import SOURCE_KEY, SUMMARY_TAG

#: Message keys that exist only inside the process.
GUARD_MESSAGE_KEYS = frozenset({SUMMARY_TAG, NATIVE_SUMMARY_KEY, SOURCE_KEY})


def provider_messages(messages: Any) -> Any:
    """``messages`` with the guard's keys removed (new dicts where needed; the
    caller's dicts are never changed)."""
    if not isinstance(messages, list):
        return messages
    out = []
    for message in messages:
        if isinstance(message, dict) and not GUARD_MESSAGE_KEYS.isdisjoint(message):
            message = {k: v for k, v in message.items() if k not in GUARD_MESSAGE_KEYS}
        out.append(message)
    return out


def carries_guard_keys(messages: Any) -> bool:
    """Whether any message of ``messages`` has a key the guard added."""
    return isinstance(messages, list) and any(
        isinstance(m, dict) and not GUARD_MESSAGE_KEYS.isdisjoint(m) for m in messages
    )
