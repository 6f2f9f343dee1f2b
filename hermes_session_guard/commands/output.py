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


def emit_json(payload: dict[str, Any]) -> None:
    print(json.dumps(payload, indent=2, ensure_ascii=False, default=str))
