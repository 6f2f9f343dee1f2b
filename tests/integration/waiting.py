"""Waiting on what a test can observe (a predicate, where a thread is parked), not on a time."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from hermes_session_guard import host
from hermes_session_guard.inbox.repository import Inbox
from hermes_session_guard.runtime import current_runtime


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


async def send_while_busy(gateway: Any, llm: Any, text: str, timeout: float = 10.0) -> bool:
    """Send the platform message ``text`` to the session whose turn is running, and wait
    until the gateway took it (whether within ``timeout`` seconds): it waits in the adapter's
    pending slot or the runner's queue, or in the guard's inbox, or its turn waits for the
    running one (:data:`TURN_WAITS`), or a turn reached the model since it was sent (a
    release that interrupts the running turn and answers at once, rewording the message)."""
    key = gateway.session_key()
    asked = len(llm.chat_requests())
    await gateway.send_text(text)

    def taken() -> bool:
        waiting = [gateway.adapter._pending_messages.get(key),
                   *(getattr(gateway.runner, "_queued_events", {}).get(key) or ())]
        if any(getattr(event, "text", None) == text for event in waiting):
            return True
        runtime = current_runtime()
        inbox = Inbox(runtime.store_for(host.runner_db_path(gateway.runner))) if runtime is not None else None
        if inbox is not None and any(entry.text == text for entry in inbox.entries(key)):
            return True
        return len(llm.chat_requests()) > asked or parked_in(TURN_WAITS)

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if taken():
            return True
        await asyncio.sleep(0.01)
    return False
