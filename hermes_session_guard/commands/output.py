"""Shared output of the operator commands: one clear error line, JSON or text."""

from __future__ import annotations

import json
import sys
from typing import Any

EXIT_FOUND = 1
EXIT_ERROR = 2


def fail(message: str, as_json: bool, **extra: Any) -> int:
    """Report a refusal or bad input: one message, exit status 2, nothing written."""
    message = " ".join(message.split())
    if as_json:
        print(json.dumps({"ok": False, "error": message, **extra}, indent=2))
    else:
        print(f"error: {message}", file=sys.stderr)
    return EXIT_ERROR


def argument_problem(value: str | None, what: str, *, required: bool = True) -> str | None:
    """Why a command-line text argument cannot be used, or None: empty (when ``required``;
    an empty session id would match any session as a prefix) or not UTF-8 (undecodable
    bytes reach Python as lone surrogates, which no file or database can store)."""
    if value is None:
        return f"{what} is missing" if required else None
    if required and not value.strip():
        return f"{what} is empty; name a session"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        try:
            raw = value.encode("utf-8", "surrogateescape")
            raw.decode("utf-8")
        except UnicodeDecodeError as bad:
            return f"{what} is not UTF-8 text (byte 0x{raw[bad.start]:02x} at offset {bad.start})"
        except UnicodeEncodeError:
            pass
        return f"{what} is not UTF-8 text (character {exc.start})"
    return None


def display(value: str) -> str:
    """``value`` printable on any stream (undecodable bytes shown as escapes)."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def emit_json(payload: dict[str, Any]) -> None:
    print(json.dumps(payload, indent=2, ensure_ascii=False, default=str))
