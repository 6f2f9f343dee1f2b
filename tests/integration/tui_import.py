"""Hermes's TUI gateway (``tui_gateway.server``) in the host tests: importing it, a
transport that keeps its frames, a resumed session's prompts.

Hermes 0.21.3+ declares Python 3.14 and its TUI gateway relies on 3.14's deferred
annotations: on 3.11, annotations naming what a module never imports (``Path`` in
``tui_gateway/methods_onboarding.py`` on 0.22.2) raise ``NameError`` at import. These
machines have no 3.14, so on an older Python the tests compile the ``tui_gateway`` package
with ``from __future__ import annotations`` (annotations kept as strings, never evaluated
at import, as 3.14 defers them); nothing else about the code changes. Only the tests do
this: the guard patches whatever Hermes imported, however it was imported."""

from __future__ import annotations
import __future__

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .api_turns import Reply
from .conftest import HOST

PACKAGE = "tui_gateway"
# Upstream 0.21.3 is the first release that declares Python >= 3.14.
WRITTEN_FOR_PY314 = HOST >= (0, 21, 3)


class _DeferredAnnotationsLoader(importlib.machinery.SourceFileLoader):
    def path_stats(self, path: str) -> Any:
        raise OSError(path)  # no bytecode cache: compiled here every time, never written

    def source_to_code(self, data: Any, path: Any, *, _optimize: int = -1) -> Any:  # type: ignore[override]
        return compile(data, path, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True,
                       optimize=_optimize)


class _DeferredAnnotationsFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != PACKAGE and not name.startswith(PACKAGE + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and type(spec.loader) is importlib.machinery.SourceFileLoader:
            spec.loader = _DeferredAnnotationsLoader(spec.loader.name, spec.loader.path)
        return spec


def _defer_annotations() -> None:
    installed = any(isinstance(f, _DeferredAnnotationsFinder) for f in sys.meta_path)
    if WRITTEN_FOR_PY314 and sys.version_info < (3, 14) and not installed:
        # Just before the path finder: after wrapt's finder, whose post-import hooks patch the guard's lazy rows.
        at = next((i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder), len(sys.meta_path))
        sys.meta_path.insert(at, _DeferredAnnotationsFinder())


def tui_server() -> Any:
    """``tui_gateway.server``, or a skip naming why this host cannot import it. It keeps the
    real stdout for JSON-RPC and points ``sys.stdout`` at stderr: put it back."""
    if PACKAGE + ".server" not in sys.modules:
        _defer_annotations()
    saved = sys.stdout
    try:
        return importlib.import_module(PACKAGE + ".server")
    except Exception as exc:  # ImportError where there is none
        pytest.skip(f"tui_gateway.server does not import on this host ({type(exc).__name__}: {exc})")
    finally:
        sys.stdout = saved


class TuiFrames:
    """A tui_gateway transport that keeps the frames it is given."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def write(self, obj: dict[str, Any]) -> bool:
        with self.lock:
            self.frames.append(obj)
        return True

    def close(self) -> None:
        return None

    def events(self, sid: str, kind: str) -> list[dict[str, Any]]:
        """The payloads of the session's ``kind`` events, in order."""
        with self.lock:
            return [dict(f["params"].get("payload") or {}) for f in self.frames
                    if f.get("method") == "event" and f["params"].get("type") == kind
                    and f["params"].get("session_id") == sid]

    def completed(self, sid: str) -> list[str]:
        return [str(p.get("text", "")) for p in self.events(sid, "message.complete")]


def tui_gateway(db: Any) -> Iterator[tuple[Any, TuiFrames]]:
    """``tui_gateway.server`` bound to a :class:`TuiFrames` transport, with ``db`` as its
    SessionDB; afterwards its sessions are closed and its own SessionDB is back."""
    server = tui_server()
    from tui_gateway.transport import bind_transport, reset_transport

    frames = TuiFrames()
    token = bind_transport(frames)
    before_db = getattr(server, "_db", None)
    server._db = db
    try:
        yield server, frames
    finally:
        reset_transport(token)
        for live in list(getattr(server, "_sessions", {})):
            try:
                server.handle_request({"jsonrpc": "2.0", "id": "close", "method": "session.close",
                                       "params": {"session_id": live}})
            except Exception:
                pass
        server._db = before_db


def tui_resume(server: Any, frames: TuiFrames, sid: str, wait: float = 180.0) -> Callable[[str], Reply]:
    """``session.resume`` of ``sid`` now (it reads the stored history); the returned callable
    runs one ``prompt.submit`` on it and waits for its ``message.complete`` event."""
    resumed = server.handle_request({"jsonrpc": "2.0", "id": 1, "method": "session.resume",
                                     "params": {"session_id": sid, "eager_build": True}})
    assert "result" in resumed, resumed
    live = resumed["result"]["session_id"]

    def send(text: str) -> Reply:
        from tui_gateway.transport import bind_transport

        bind_transport(frames)
        ack = server.handle_request({"jsonrpc": "2.0", "id": 2, "method": "prompt.submit",
                                     "params": {"session_id": live, "text": text}})
        assert "result" in ack, ack
        deadline = time.monotonic() + wait
        while not frames.completed(live):
            assert time.monotonic() < deadline, "the TUI turn never completed"
            time.sleep(0.05)
        return Reply(frames.completed(live)[0].strip(), 200, sid, None)

    send.live = live  # type: ignore[attr-defined]
    return send
