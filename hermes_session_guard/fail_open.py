"""The one way the guard reports that it stepped aside ("failing open").

A seam (or a guard step inside one) that hits an unexpected error lets the host go on
as it would without the guard and says so here, always in the same shape:
what failed, the exception, what that means for this call, and the command that
shows more. ``once`` logs the first occurrence per (what, exception type) at ERROR
and repeats at DEBUG, for seams on hot paths.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger("hermes_session_guard")

_reported: set[str] = set()
_reported_lock = threading.Lock()


def _name(what: Any) -> str:
    """A seam row (``.target``) names its seam; anything else is said as given."""
    target = getattr(what, "target", None)
    return f"seam {target}" if isinstance(target, str) else str(what)


def fail_open(what: Any, exc: BaseException, consequence: str, *, when: str = "", advice: str | None = "selftest",
              once: bool = False) -> None:
    """Log that ``what`` (a seam row or a description) failed with ``exc`` and the guard
    failed open with ``consequence``; ``when`` says at which step ("before the turn")."""
    name = _name(what)
    level = logging.ERROR
    if once:
        key = f"{name}:{type(exc).__name__}"
        with _reported_lock:
            level = logging.DEBUG if key in _reported else logging.ERROR
            _reported.add(key)
    step = f" {when}" if when else ""
    tail = f" Run `hermes-session-guard {advice}`." if advice else ""
    log.log(level, "session guard: %s failed%s (%s: %s); failing open: %s.%s", name, step, type(exc).__name__, exc,
            consequence, tail)
