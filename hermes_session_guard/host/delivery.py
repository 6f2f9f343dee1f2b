"""The platform-adapter delivery shim: per-instance ``send`` /
``edit_message`` / ``send_draft`` wrappers that route outgoing text through a filter
(which may withhold it), and the dashboard's JSON response helper."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import Any

from ..fail_open import failing_open

_shimmed_adapters: weakref.WeakSet[Any] = weakref.WeakSet()
# send_for_platform: the relay adapter's second send path (scheduled and home deliveries, 0.20+)
_DELIVERY_METHODS = ("send", "edit_message", "send_draft", "send_for_platform")


def _content_slot(fn: Any) -> int | None:
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("content") if "content" in names else None


def delivered_nothing() -> Any:
    """The result a platform send reports when the guard withheld the whole text."""
    from gateway.platforms.base import SendResult

    return SendResult(success=True, message_id=None)


def shim_adapter(adapter: Any, transform: Callable[[str], str | None]) -> None:
    """Route this adapter's outgoing text through ``transform`` (per instance: every
    platform subclass overrides ``send``). ``None`` from ``transform`` withholds
    the message."""
    if adapter in _shimmed_adapters:
        return
    for name in _DELIVERY_METHODS:
        bound = getattr(adapter, name, None)
        slot = _content_slot(bound) if callable(bound) else None
        if slot is None or name in vars(adapter):
            continue
        setattr(adapter, name, _filtered_delivery(bound, slot, transform))
    _shimmed_adapters.add(adapter)


def _filtered_delivery(bound: Any, slot: int, transform: Callable[[str], str | None]) -> Any:
    """The delivery shim for one bound ``send``/``edit_message``/``send_draft`` (text at ``slot``)."""
    async def deliver(*args: Any, **kwargs: Any) -> Any:
        if "content" in kwargs:
            content = kwargs["content"]
        elif len(args) > slot:
            content = args[slot]
        else:
            return await bound(*args, **kwargs)
        if isinstance(content, str):
            # fail open: deliver what the host wrote
            with failing_open("the delivery filter", "message sent unfiltered", advice=None) as failed:
                new = transform(content)
            if failed:
                new = content
            if new is None:
                return delivered_nothing()
            if "content" in kwargs:
                kwargs["content"] = new
            else:
                args = (*args[:slot], new, *args[slot + 1:])
        return await bound(*args, **kwargs)

    deliver.__signature__ = inspect.signature(bound)  # type: ignore[attr-defined]
    deliver.__name__ = getattr(bound, "__name__", "send")
    return deliver


def unshim_adapters() -> None:
    """Remove the delivery shims from every adapter :func:`shim_adapter` wrapped."""
    for adapter in list(_shimmed_adapters):
        for name in _DELIVERY_METHODS:
            vars(adapter).pop(name, None)
    _shimmed_adapters.clear()


def json_response_like(response: Any, payload: Any) -> Any:
    """An aiohttp JSON response carrying ``payload`` with ``response``'s status and headers."""
    from aiohttp import web

    new = web.json_response(payload, status=response.status)
    for key, value in response.headers.items():
        if key.lower() not in ("content-type", "content-length"):
            new.headers[key] = value
    return new
