"""Any Python ``str`` the guard stores or indexes, kept losslessly.

A ``str`` can hold what UTF-8 cannot encode: lone UTF-16 surrogates (``"\\ud83d"``,
half of an emoji split by a truncation, or decoded with ``surrogateescape``).
SQLite's Python driver refuses to bind such text, ``hashlib`` needs bytes, and a
file written as UTF-8 fails. The guard therefore:

* stores structured text as JSON that escapes what UTF-8 cannot carry
  (``\\ud83d`` in the JSON, read back by ``json.loads`` to the very same str);
* keeps plain text columns only for searching and display, with such characters
  replaced (:func:`searchable`); the JSON copy is the verbatim one;
* hashes the ``surrogatepass`` bytes, which equal the UTF-8 bytes for any
  encodable text (hashes of ordinary text do not change).

NUL characters are ordinary for SQLite (bound with their length) and JSON.
"""

from __future__ import annotations

import json
from typing import Any


def encodable(text: str) -> bool:
    """True when ``text`` is valid Unicode for UTF-8 (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def utf8_bytes(text: str) -> bytes:
    """Bytes for hashing: UTF-8, lone surrogates passed through as their 3-byte forms."""
    return text.encode("utf-8", "surrogatepass")


def searchable(text: str) -> str:
    """``text`` with anything UTF-8 cannot carry replaced by U+FFFD (for indexes and
    search columns; the verbatim text lives in the JSON next to it)."""
    if encodable(text):
        return text
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def json_text(value: Any) -> str:
    """JSON for a text column: readable UTF-8 where possible, escaped where the value
    holds text UTF-8 cannot encode. ``json.loads`` gives back exactly ``value``."""
    out = json.dumps(value, ensure_ascii=False, default=str)
    return out if encodable(out) else json.dumps(value, ensure_ascii=True, default=str)


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return searchable(value)
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


def sendable_messages(messages: list[Any]) -> list[Any]:
    """``messages`` itself when every text in it is valid UTF-8; otherwise a list in
    which the messages holding lone surrogates are copies with those replaced by
    U+FFFD (a provider request, an HTTP body and state.db all need valid UTF-8). The
    others are the very same objects. The verbatim originals stay in the snapshot."""
    flags = [not isinstance(m, dict) or _all_encodable(m) for m in messages]
    if all(flags):
        return messages  # the usual case: nothing copied
    return [m if ok else _clean(m) for m, ok in zip(messages, flags, strict=True)]


def _all_encodable(value: Any) -> bool:
    """Every text in ``value`` (strings, dict keys, nested lists and dicts; other objects as
    ``str()`` gives them, as a JSON body would) is valid UTF-8. An ASCII string is, and says
    so without being encoded."""
    if isinstance(value, str):
        return value.isascii() or encodable(value)
    if isinstance(value, dict):
        return all(_all_encodable(k) and _all_encodable(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_all_encodable(v) for v in value)
    return value is None or isinstance(value, int | float) or encodable(str(value))
