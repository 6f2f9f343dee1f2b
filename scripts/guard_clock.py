"""The guard's own CPU time in a guarded compression, told apart from Hermes's.

Thread CPU time is charged to the innermost instrumented frame: the guard's
``guarded_compression`` (in whichever thread runs it: Hermes 0.20+ compacts in a worker
thread) and the guard's context-engine shim are the guard's; the compression function the guard
wraps (from the seam table), the context engine's own ``compress``, the system
prompt builder and Hermes's compression lock methods (which Hermes calls itself unguarded)
are Hermes's; the guard's rows written inside Hermes's transactions (0.20+, ``Rider.run``) are
the guard's, the commit that carries them Hermes's. The caller's ``AIAgent._compress_context``
(:func:`caller_kind`) is the guard's where it is the guarded function itself (0.13-0.14), and
Hermes's where it is Hermes's forwarder to the guarded ``compress_context`` (0.15+; on 0.20+
it does work of its own there, 1.1-1.3 ms per 48-message compaction, guarded or not). What
the guard's wrappers do outside ``guarded_compression`` (a few attribute reads) counts as
Hermes's. Used by ``bench_compression.py --own``.
"""

from __future__ import annotations

import functools
import importlib
import threading
import time
from collections.abc import Callable
from typing import Any

GUARD, HOST = "guard", "host"


class OwnClock:
    def __init__(self) -> None:
        self.totals = {GUARD: 0.0, HOST: 0.0}
        self._local = threading.local()

    def timed(self, kind: str, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def clocked(*args: Any, **kwargs: Any) -> Any:
            stack = self._local.__dict__.setdefault("stack", [])
            stack.append(0.0)  # the time of instrumented frames inside this one
            started = time.thread_time()
            try:
                return func(*args, **kwargs)
            finally:
                inclusive = time.thread_time() - started
                inner = stack.pop()
                self.totals[kind] += inclusive - inner
                if stack:
                    stack[-1] += inclusive
        return clocked

    def take(self) -> dict[str, float]:
        out, self.totals = self.totals, {GUARD: 0.0, HOST: 0.0}
        return out


def _replace(target: str, wrap: Callable[[Any], Any]) -> None:
    module, _, attribute = target.partition(":")
    owner: Any = importlib.import_module(module)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    setattr(owner, name, wrap(getattr(owner, name)))


def caller_kind(version: str) -> str:
    """Whose the caller's ``AIAgent._compress_context`` call is: the guard's where the seam
    table wraps that very function, Hermes's where it forwards to the function the guard wraps."""
    from hermes_session_guard.hostinfo import parse_version
    from hermes_session_guard.seams.table import select_row

    row = select_row("compression", parse_version(version))
    return GUARD if row is None or row.target.endswith(":AIAgent._compress_context") else HOST


def instrument(clock: OwnClock, version: str) -> None:
    """Before the guard is installed: Hermes's functions the guard will wrap, timed as Hermes's."""
    from hermes_session_guard.host import engine_shim
    from hermes_session_guard.hostinfo import parse_version
    from hermes_session_guard.seams.table import select_row

    for seam in ("compression", "system_prompt"):
        row = select_row(seam, parse_version(version))
        if row is not None:
            _replace(row.target, functools.partial(clock.timed, HOST))
    compressor = importlib.import_module("agent.context_compressor").ContextCompressor
    compressor.compress = clock.timed(HOST, compressor.compress)
    # Hermes's compression lock (0.16+): unguarded, Hermes takes and releases it itself in every
    # compression; guarded on 0.16-0.19 the guard takes it through these same methods instead
    # (Hermes's own acquire re-enters), so the two writes are Hermes's either way.
    session_db = importlib.import_module("hermes_state").SessionDB
    for name in ("try_acquire_compression_lock", "release_compression_lock"):
        if hasattr(session_db, name):
            setattr(session_db, name, clock.timed(HOST, getattr(session_db, name)))
    make = engine_shim._make_engine_shim

    def make_shim(cls: Any) -> Any:
        shim = make(cls)
        clocked = clock.timed(GUARD, shim)
        clocked.__signature__ = shim.__signature__  # type: ignore[attr-defined]
        clocked.__session_guard_shim__ = True  # type: ignore[attr-defined]
        return clocked

    engine_shim._make_engine_shim = make_shim
    # The guarded compression itself, in whatever thread runs it: Hermes 0.20+ runs the
    # compaction in a worker thread, where the timed caller above is not on the stack.
    from hermes_session_guard.seams import compression_entry

    compression_entry.guarded_compression = clock.timed(GUARD, compression_entry.guarded_compression)
    # 0.20+: the guard's rows written inside Hermes's own transactions (store.connection.Rider)
    # are the guard's, though they run within Hermes's call; the commit that carries them is Hermes's.
    from hermes_session_guard.store.connection import Rider

    Rider.run = clock.timed(GUARD, Rider.run)  # type: ignore[method-assign]
