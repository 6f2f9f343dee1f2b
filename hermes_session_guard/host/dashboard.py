"""Hermes's web dashboard (``hermes_cli.web_server.app``, a FastAPI app): its session
messages view ``GET /api/sessions/{id}/messages`` answers state.db rows, summaries
included. The guard puts a response filter in front of the app's middleware stack
(an ASGI shim on this one app object, removed by :func:`unshim_dashboards`): for that
route, the JSON ``messages`` list goes through the guard's display filter; every
other request passes untouched. Failure policy: open (the response as Hermes built it)."""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from ..fail_open import failing_open

MESSAGES_ROUTE = re.compile(r"^/api/sessions/([^/]+)/messages/?$")
MessagesFilter = Callable[[str, list[Any]], list[Any]]

_shimmed: weakref.WeakSet[Any] = weakref.WeakSet()


class _FilteredMessages:
    """ASGI app: ``inner`` with the messages route's JSON body filtered."""

    def __init__(self, inner: Any, keep: MessagesFilter) -> None:
        self.inner, self.keep = inner, keep

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        match = MESSAGES_ROUTE.match(scope.get("path") or "") \
            if scope.get("type") == "http" and scope.get("method") == "GET" else None
        if match is None:
            await self.inner(scope, receive, send)
            return
        start: dict[str, Any] = {}
        body = bytearray()

        async def held(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            body.extend(message.get("body", b""))
            if message.get("more_body"):
                return
            head, payload = self.rewrite(start, bytes(body), unquote(match.group(1)))
            await send(head)
            await send({"type": "http.response.body", "body": payload})

        await self.inner(scope, receive, held)

    def rewrite(self, start: dict[str, Any], body: bytes, session_id: str) -> tuple[dict[str, Any], bytes]:
        # fail open: the page shows what Hermes answered
        with failing_open("filtering the dashboard's session messages", "shown as Hermes built them",
                          advice=None):
            headers = list(start.get("headers") or [])
            kind = next((v for k, v in headers if k.lower() == b"content-type"), b"")
            if start.get("status") != 200 or b"json" not in kind:
                return start, body
            data = json.loads(body)
            messages = data.get("messages") if isinstance(data, dict) else None
            if not isinstance(messages, list):
                return start, body
            data["messages"] = self.keep(session_id, messages)
            new = json.dumps(data, ensure_ascii=False).encode("utf-8")
            headers = [(k, str(len(new)).encode() if k.lower() == b"content-length" else v) for k, v in headers]
            return {**start, "headers": headers}, new
        return start, body


def shim_dashboard(app: Any, keep: MessagesFilter) -> None:
    """Put the filter in front of ``app``'s middleware stack (built now or later); once per app."""
    if app in _shimmed:
        return
    build = app.build_middleware_stack

    def build_filtered() -> Any:
        return _FilteredMessages(build(), keep)

    app.build_middleware_stack = build_filtered
    if getattr(app, "middleware_stack", None) is not None:
        app.middleware_stack = _FilteredMessages(app.middleware_stack, keep)
    _shimmed.add(app)


def dashboard_app() -> Any | None:
    """The dashboard app of this process, where Hermes imported its web server."""
    import sys

    module = sys.modules.get("hermes_cli.web_server")
    return getattr(module, "app", None) if module is not None else None


def unshim_dashboards() -> None:
    for app in list(_shimmed):
        vars(app).pop("build_middleware_stack", None)
        stack = getattr(app, "middleware_stack", None)
        if isinstance(stack, _FilteredMessages):
            app.middleware_stack = stack.inner
    _shimmed.clear()
