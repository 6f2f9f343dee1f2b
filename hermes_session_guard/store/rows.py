"""How a message is stored in and read back from a snapshot row, and the text
identity (hash) the summaries and the text index key on."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..safe_text import encodable, json_text, searchable, utf8_bytes


def message_text(message: dict[str, Any]) -> str | None:
    """The text of a message's content (list-of-parts content joined)."""
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p]
        return "\n".join(parts)
    return str(content)


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def text_hash(text: str | None) -> str:
    """Stable identity of a message text (surrounding whitespace ignored: the host
    strips some rows when it loads them)."""
    return hashlib.sha256(utf8_bytes((text or "").strip())).hexdigest()[:32]


def _row_parts(message: Any) -> tuple[str | None, str | None, str]:
    """(role, text, json of the rest). A string ``content`` is stored once, in the
    ``content`` column (searchable), and left out of ``message_json``."""
    if not isinstance(message, dict):
        message = {"role": getattr(message, "role", None), "content": getattr(message, "content", None)}
    content = message.get("content")
    role = _text_or_none(message.get("role"))
    role = None if role is None else searchable(role)
    if isinstance(content, str) and encodable(content):
        rest = {k: v for k, v in message.items() if k != "content"}
        return role, content, json_text(rest)
    # Not a plain UTF-8 string (list-of-parts content, or text holding lone surrogates):
    # the whole message goes into the JSON, verbatim (escaped where UTF-8 cannot carry
    # it, see safe_text); the content column keeps a searchable copy.
    text = message_text(message)
    return role, None if text is None else searchable(text), json_text(message)


def _row_message(message_json: str, content: str | None) -> dict[str, Any]:
    msg: dict[str, Any] = json.loads(message_json)
    if "content" not in msg:
        msg["content"] = content
    return msg
