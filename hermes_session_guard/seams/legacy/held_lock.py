"""Hermes's own compression lock held by the guard for a whole compression (the rows'
``lock: native``, Hermes 0.16-0.19): the lease choice both legacy strategies share.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from ... import host
from ...locks.session_lock import LeaseTable, LockGrant
from ...seam_behaviour import LockMode
from ..compaction_steps import CompactionSteps


class HeldNativeLock(CompactionSteps):
    """Steps whose host lets the guard hold Hermes's lock: where ``native_lock_usable``."""

    def native_lock_usable(self) -> bool:
        """Whether Hermes's own lease table can be the guard's lock (row ``lock: native``)."""
        return False

    def lease_table(self, mode: str) -> LeaseTable:
        """Hermes's own lock where the row says so and the host either can re-enter it
        (0.18+, which takes it itself inside the call) or never asks for it (0.16-0.17:
        the detached host skips its lock): the strategy's ``native_lock_usable``; otherwise
        (0.13-0.15, or an agent without a SessionDB) the guard's table."""
        if mode == LockMode.NATIVE and self.native_lock_usable():
            native = host.native_leases(self.op.agent)
            if native is not None:
                return native
        return super().lease_table(mode)

    def host_may_reenter(self, grant: LockGrant | None) -> AbstractContextManager[None]:
        if grant is not None and isinstance(grant.lease, host.NativeLeases):
            return host.native_lock_reentry(grant.lease, grant.session_id)
        return nullcontext()
