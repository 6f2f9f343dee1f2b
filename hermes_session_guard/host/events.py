"""Gateway ``MessageEvent`` objects: what may be buffered, their text and
origin, and a JSON-safe payload to rebuild one in another process (tagged with its
inbox sequence number)."""

from __future__ import annotations

from typing import Any

INBOX_TAG = "_session_guard_inbox_seq"


def event_is_plain_message(event: Any) -> bool:
    """A user message the guard may buffer: not a slash command, not a synthetic event."""
    if getattr(event, "internal", False):
        return False
    text = getattr(event, "text", None) or ""
    return not text.lstrip().startswith("/")


def event_text(event: Any) -> str:
    return str(getattr(event, "text", None) or "")


def event_user_id(event: Any) -> str | None:
    user = getattr(getattr(event, "source", None), "user_id", None)
    return str(user) if user is not None else None


def event_chat_id(event: Any) -> str | None:
    chat = getattr(getattr(event, "source", None), "chat_id", None)
    return str(chat) if chat is not None else None


def event_platform(payload: dict[str, Any]) -> str | None:
    return (payload.get("source") or {}).get("platform")


def event_payload(event: Any) -> dict[str, Any]:
    """Everything needed to rebuild ``event`` in another process (JSON-safe).
    ``raw_message`` (the platform's own object) is not kept."""
    import dataclasses
    import json
    from datetime import datetime
    from enum import Enum

    out: dict[str, Any] = {}
    for f in dataclasses.fields(event):
        if f.name == "raw_message":
            continue
        value = getattr(event, f.name, None)
        if f.name == "source":
            out["source"] = value.to_dict() if value is not None else None
            continue
        if isinstance(value, Enum):
            value = value.value
        elif isinstance(value, datetime):
            value = value.isoformat()
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        out[f.name] = value
    return out


def event_from_payload(payload: dict[str, Any], seq: int | None = None) -> Any:
    """A MessageEvent of the installed Hermes rebuilt from :func:`event_payload`
    (fields this Hermes does not know are left out), tagged with its inbox ``seq``."""
    import dataclasses
    from datetime import datetime

    from gateway.platforms.base import MessageEvent, MessageType
    from gateway.session import SessionSource

    known = {f.name for f in dataclasses.fields(MessageEvent) if f.init}  # 0.21+ has init=False fields
    kwargs: dict[str, Any] = {k: v for k, v in payload.items() if k in known}
    if kwargs.get("source") is not None:
        kwargs["source"] = SessionSource.from_dict(kwargs["source"])
    if "message_type" in kwargs:
        try:
            kwargs["message_type"] = MessageType(kwargs["message_type"])
        except ValueError:
            kwargs["message_type"] = MessageType.TEXT
    if isinstance(kwargs.get("timestamp"), str):
        try:
            kwargs["timestamp"] = datetime.fromisoformat(kwargs["timestamp"])
        except ValueError:
            kwargs.pop("timestamp")
    kwargs.setdefault("text", "")
    event = MessageEvent(**kwargs)
    if seq is not None:
        setattr(event, INBOX_TAG, seq)
    return event


def event_inbox_seq(event: Any) -> int | None:
    seq = getattr(event, INBOX_TAG, None)
    return seq if isinstance(seq, int) else None
