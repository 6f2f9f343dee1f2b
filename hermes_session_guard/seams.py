"""The one table of host seams: which Hermes function the guard wraps, per version range.

A row says: for Hermes versions in ``[since, until)``, wrap ``module:attribute``
(whose parameters must start with ``params``) with the wrapper built by
``wrapper``; what to do when the guard itself fails inside it
(``failure_policy``); and version-specific behaviour as data (``behaviour``).
Adding a Hermes release is adding or widening rows here, plus tests.

Failure policies (the ADR explains each choice):

``open``
    a guard error before the host runs hands the call to the host untouched
    (with an ERROR log line naming the seam); Hermes keeps working with its own
    behaviour.
``closed``
    a guard error refuses the guarded action (and logs why); used where
    proceeding would lose or fork data.

Behaviour values of the compression rows:

``strategy``
    how the host is kept from rotating the id (see :mod:`.compression`).
``lock``
    which cross-process lease serialises compressions of one session
    (see :mod:`.session_lock`): ``guard`` (the guard's ``session_guard_locks``)
    or ``native`` (Hermes's ``compression_locks``, held by the guard and
    re-entered by the host through the ``native_lock_reentry`` seam).
``lock_failure``
    ``closed``: when the lease table itself fails, the compression is skipped
    (transcript unchanged, Hermes retries on a later turn) instead of running
    unlocked, because an unlocked compression can fork the session.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import host_adapter as host
from .compression import DETACH_DB, HOST_IN_PLACE, LockPolicy, guarded_compression
from .hostinfo import Version
from .runtime import Runtime
from .session_lock import LOCK_GUARD, LOCK_NATIVE

log = logging.getLogger("hermes_session_guard")

Wrapper = Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]


@dataclass(frozen=True)
class SeamRow:
    seam: str
    since: Version
    until: Version
    module: str
    attribute: str
    params: tuple[str, ...]
    wrapper: Callable[[Runtime, SeamRow], Wrapper]
    failure_policy: str
    behaviour: dict[str, str] = field(default_factory=dict)
    note: str = ""

    @property
    def target(self) -> str:
        return f"{self.module}:{self.attribute}"

    def covers(self, version: Version) -> bool:
        return self.since <= version < self.until

    @property
    def range_text(self) -> str:
        return f">={'.'.join(map(str, self.since))},<{'.'.join(map(str, self.until))}"


def compression_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """Adapt the host's compression call shape to :func:`guarded_compression`.

    ``AIAgent._compress_context(self, messages, system_message, ...)`` (method) and
    ``compress_context(agent, messages, system_message, ...)`` (module function)
    differ only in where the agent comes from."""
    strategy = row.behaviour["strategy"]
    lock = LockPolicy(mode=row.behaviour.get("lock", LOCK_GUARD),
                      on_failure=row.behaviour.get("lock_failure", "closed"))

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        called = False

        def call_host() -> Any:
            nonlocal called
            called = True
            return wrapped(*args, **kwargs)

        try:
            if instance is not None:
                agent, rest = instance, args
            else:
                agent, rest = (args[0], args[1:]) if args else (kwargs.get("agent"), ())
            messages = rest[0] if rest else kwargs.get("messages")
            system_message = rest[1] if len(rest) > 1 else kwargs.get("system_message")
            return guarded_compression(runtime, strategy, agent, messages, call_host,
                                       system_message=system_message, lock=lock)
        except Exception as exc:
            if called:
                raise
            log.error(
                "session guard: seam %s failed before the host ran (%s: %s); failing open, "
                "Hermes compresses unguarded this time. Run `hermes-session-guard selftest`.",
                row.target, type(exc).__name__, exc,
            )
            return wrapped(*args, **kwargs)

    return wrapper


def native_lock_reentry_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """``SessionDB.try_acquire_compression_lock(self, session_id, holder, ...)``: True
    without touching the table when this thread's guarded operation already holds
    the lock on that session; otherwise Hermes's own acquire, unchanged."""

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            sid = args[0] if args else kwargs.get("session_id")
            if host.native_lock_held_here(instance, sid):
                return True
        except Exception as exc:
            log.error("session guard: seam %s failed (%s: %s); failing open to Hermes's own lock.",
                      row.target, type(exc).__name__, exc)
        return wrapped(*args, **kwargs)

    return wrapper


_COMPRESSION_METHOD_PARAMS = ("self", "messages", "system_message")
_COMPRESSION_FUNCTION_PARAMS = ("agent", "messages", "system_message")

SEAMS: tuple[SeamRow, ...] = (
    SeamRow(
        seam="compression",
        since=(0, 14, 0),
        until=(0, 15, 0),
        module="run_agent",
        attribute="AIAgent._compress_context",
        params=_COMPRESSION_METHOD_PARAMS,
        wrapper=compression_wrapper,
        failure_policy="open",
        behaviour={"strategy": DETACH_DB, "lock": LOCK_GUARD, "lock_failure": "closed"},
        note="compression lives in the method and always rotates; run it with the SessionDB detached",
    ),
    SeamRow(
        seam="compression",
        since=(0, 18, 2),
        until=(0, 20, 0),
        module="agent.conversation_compression",
        attribute="compress_context",
        params=_COMPRESSION_FUNCTION_PARAMS,
        wrapper=compression_wrapper,
        failure_policy="open",
        behaviour={"strategy": HOST_IN_PLACE, "lock": LOCK_NATIVE, "lock_failure": "closed"},
        note="host has in-place compaction and a native lock; force in-place on",
    ),
    SeamRow(
        seam="native_lock_reentry",
        since=(0, 18, 2),
        until=(0, 20, 0),
        module="hermes_state",
        attribute="SessionDB.try_acquire_compression_lock",
        params=("self", "session_id", "holder"),
        wrapper=native_lock_reentry_wrapper,
        failure_policy="open",
        note="the guard holds Hermes's compression lock for the whole operation; the host's acquire re-enters it",
    ),
)


def seam_names() -> list[str]:
    seen: list[str] = []
    for row in SEAMS:
        if row.seam not in seen:
            seen.append(row.seam)
    return seen


def rows_for(seam: str) -> list[SeamRow]:
    return [row for row in SEAMS if row.seam == seam]


def select_row(seam: str, version: Version | None) -> SeamRow | None:
    if version is None:
        return None
    for row in rows_for(seam):
        if row.covers(version):
            return row
    return None
