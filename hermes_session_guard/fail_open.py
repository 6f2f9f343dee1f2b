"""The one way the guard catches a broad exception and carries on: ``failing_open``.

Ruff's blind-except rule (BLE001) holds everywhere else in the package, and it lets through
only a broad handler that re-raises (or logs the traceback). Those few sit where an error
must be told apart or undone, not swallowed: the seam envelope (``seams/envelope.py``) tells
Hermes's own error (passed on unchanged) from the guard's and applies the row's failure
policy to the latter, with :func:`report`; ``locks/session_lock.py`` turns a failed acquire
into ``LockUnavailable``; and a few ``except BaseException: ...; raise`` blocks undo a
half-done step only when it fails (a file, a connection, a shim).
``grep -rnE "except (Exception|BaseException)" hermes_session_guard`` lists them all.

A guard step that hits an unexpected error lets the host go on
as it would without the guard and says so, always in the same shape: what failed, the
exception, what that means for this call, and the command that shows more::

    with failing_open(row, "this turn runs without the per-session turn order") as failed:
        ticket = locks.enqueue(sid)
    if failed:
        return wrapped(*args, **kwargs)

The block's exception (an ``Exception``, never a ``BaseException`` such as
``KeyboardInterrupt``) is caught and logged; ``failed`` is true after it and holds the
exception (``failed.exc``, ``failed.reason``) for the caller's own fallback or audit line.

* ``level``: ERROR by default; WARNING or DEBUG where the consequence is routine (an
  optional read, a subscriber); ``None`` where the caller's audit event carries the
  failure (the audit is then the one loud line).
* ``once``: the first occurrence per (what, exception type) at ``level``, repeats at
  DEBUG, for seams on hot paths.
* ``lets_through``: exception types that are part of the block's contract (a refusal the
  caller re-raises) and pass unchanged.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import Any

log = logging.getLogger("hermes_session_guard")

_reported: set[str] = set()
_reported_lock = threading.Lock()


def _name(what: Any) -> str:
    """A seam row (``.target``) names its seam; anything else is said as given."""
    target = getattr(what, "target", None)
    return f"seam {target}" if isinstance(target, str) else str(what)


class failing_open:  # lower case: read as a statement, ``with failing_open(...)``
    """Catch an ``Exception`` from the block, log it in the guard's one shape, and go on
    after the block; see the module docstring."""

    __slots__ = ("what", "consequence", "when", "advice", "once", "level", "lets_through", "exc")

    def __init__(self, what: Any, consequence: str, *, when: str = "", advice: str | None = "selftest",
                 once: bool = False, level: int | None = logging.ERROR,
                 lets_through: tuple[type[BaseException], ...] = ()) -> None:
        self.what, self.consequence, self.when, self.advice = what, consequence, when, advice
        self.once, self.level, self.lets_through = once, level, lets_through
        self.exc: Exception | None = None

    def __enter__(self) -> failing_open:
        return self

    def __exit__(self, _type: type[BaseException] | None, exc: BaseException | None,
                 _tb: TracebackType | None) -> bool:
        if not isinstance(exc, Exception) or isinstance(exc, self.lets_through):
            return False
        self.exc = exc
        if self.level is not None:
            report(self.what, exc, self.consequence, when=self.when, advice=self.advice, once=self.once,
                   level=self.level)
        return True

    def __bool__(self) -> bool:
        return self.exc is not None

    @property
    def reason(self) -> str:
        """``"<ExceptionType>: <message>"`` for an audit line's ``reason``; ``""`` if nothing failed."""
        return f"{type(self.exc).__name__}: {self.exc}" if self.exc is not None else ""


def report(what: Any, exc: BaseException, consequence: str, *, when: str = "", advice: str | None = "selftest",
           once: bool = False, level: int = logging.ERROR, failing: str = "open") -> None:
    """Log that ``what`` (a seam row or a description) failed with ``exc`` and the guard
    failed open (``failing="closed"``: closed) with ``consequence``; ``when`` says at which
    step ("before the turn").
    For an exception the caller already holds (a thread's result, a background task)."""
    name = _name(what)
    if once:
        key = f"{name}:{type(exc).__name__}"
        with _reported_lock:
            if key in _reported:
                level = logging.DEBUG
            _reported.add(key)
    step = f" {when}" if when else ""
    tail = f" Run `hermes-session-guard {advice}`." if advice else ""
    log.log(level, "session guard: %s failed%s (%s: %s); failing %s: %s.%s", name, step, type(exc).__name__, exc,
            failing, consequence, tail)
