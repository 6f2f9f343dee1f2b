"""Strategy ``host_in_place`` (Hermes 0.18-0.19): Hermes's own in-place compaction, forced on,
keeps the id and archives the old rows; the guard holds Hermes's native lock for the whole
operation and Hermes's own acquire of it re-enters (the ``native_lock_reentry`` seam, whose
wrapper is here). The steps themselves are the ones both in-place designs share
(:mod:`..in_place_compaction`); what only this design adds is holding Hermes's lock.
"""

from __future__ import annotations

from typing import Any

from ... import host
from ...runtime import Runtime
from ..envelope import fails_as
from ..in_place_compaction import InPlaceCompaction
from ..row import SeamRow, Wrapper
from .held_lock import HeldNativeLock


class HostInPlaceCompaction(HeldNativeLock, InPlaceCompaction):
    """Hermes writes the compaction in place; the guard holds Hermes's lock and writes the snapshot ahead."""

    def native_lock_usable(self) -> bool:
        # Hermes takes its lock itself inside the call: the guard may hold it only if that acquire re-enters
        return self.op.runtime.seam_patched("native_lock_reentry")


def native_lock_reentry_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """``SessionDB.try_acquire_compression_lock(self, session_id, holder, ...)``: True
    without touching the table when this thread's guarded operation already holds
    the lock on that session; otherwise Hermes's own acquire, unchanged."""

    @fails_as("Hermes's own lock decides")
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        sid = args[0] if args else kwargs.get("session_id")
        if host.native_lock_held_here(instance, sid):
            return True
        return wrapped(*args, **kwargs)

    return wrapper
