"""Waiting on what a test can observe (a predicate, where a thread is parked), not on a time."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Collection


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether ``predicate`` became true within ``timeout`` seconds (polled every 20 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def place(name: str, *path: str) -> tuple[str, str]:
    """A function ``name`` in a file whose path ends with ``path`` (none: any file)."""
    return name, os.path.join("", *path)


def parked_in(places: Collection[tuple[str, str]], thread: threading.Thread | None = None) -> bool:
    """``thread`` (else any thread) is inside one of ``places`` (:func:`place`), seen in its stack."""
    frames = sys._current_frames()
    for frame in [frames.get(thread.ident or -1)] if thread is not None else list(frames.values()):
        while frame is not None:
            code = frame.f_code
            if any(code.co_name == name and code.co_filename.endswith(suffix) for name, suffix in places):
                return True
            frame = frame.f_back
    return False


# Where a turn waits for another turn of its session: the guard's turn order (0.13-0.19: in
# this process, or for another process's lease, polled in a worker thread by an async waiter)
# or Hermes's durable turn lease (0.20+).
TURN_WAITS = [place("wait", "locks", "turn_lock.py"), place("_lease", "locks", "turn_lock.py"),
              place("acquire_session_turn_lease")]
