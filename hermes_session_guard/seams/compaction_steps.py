"""The steps a Hermes design supplies to the guarded compression, and what they may use of it.

:mod:`.compression` runs one sequence for every release (pin, phase row, lock or defer,
generation check or adopt, tag, record, reference, release); where Hermes's designs differ,
it asks the strategy's :class:`CompactionSteps`, chosen by the seam row's ``strategy``
through :data:`STEPS` (each strategy's module registers its steps with :func:`register`):

- :mod:`.legacy.detached_compaction` (``detach_db``, 0.13-0.17): Hermes compacts with its
  SessionDB detached; the guard writes the compacted transcript under the same id.
- :mod:`.legacy.in_place_compaction` (``host_in_place``, 0.18-0.19): Hermes's own in-place
  compaction, forced on, under the guard's lock; the snapshot is written ahead of Hermes's
  archive (the steps both in-place designs share are :mod:`.in_place_compaction`'s).
- :mod:`.native_compaction` (``host_native``): Hermes compacts in place under its own lock;
  the snapshot references the rows Hermes keeps, written in Hermes's own commit.

The base class holds the neutral steps (nothing to add) and leaves abstract the two every
design answers (what the live rows are read with, what scope Hermes runs in); each strategy
overrides what its design needs. A strategy's steps are made per operation and keep that operation's state
of their own (:class:`Compaction` is what they may read and write of the rest).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Protocol

from ..locks.session_lock import GuardLeases, LeaseTable, LockGrant
from ..runtime import Runtime
from ..seam_behaviour import Behaviour
from ..store import GuardStore, SnapshotInfo

# What Hermes's compression returns: the list the conversation continues with, and the system prompt.
Result = tuple[list[Any], str]


class Compaction(Protocol):
    """The operation (:class:`.compression._Operation`) as the strategies see it."""

    runtime: Runtime
    agent: Any
    sid: str
    db_path: Path
    store: GuardStore
    audit: Any
    before: list[Any]
    behaviour: Behaviour
    cooldown_before: float
    phase_error: str | None
    begun: bool
    written_ahead: str | None
    persisted: list[Any] | None
    error_type: str | None
    live_ids: list[tuple[int, int]] | None
    live_is_before: bool

    def begin(self, **steps: float) -> None: ...
    def write_row(self, steps: dict[str, float]) -> None: ...
    def summary_steps(self) -> dict[str, float]: ...
    def leave_unchanged(self, status: str, reason: str, level: str = "info", *,
                        system_prompt: str | None = None, **extra: Any) -> Result: ...
    def arrived_meanwhile(self, foreign: list[Any]) -> list[Any]: ...
    def mine(self) -> Any: ...
    def rows_read(self, runs: list[tuple[int, int]]) -> tuple[int, str]: ...
    def store_reference(self, snapshot_id: str, created_at: float, runs: list[tuple[int, int]],
                        matching: list[Any] | None = None,
                        read: tuple[int, str] | None = None) -> SnapshotInfo | None: ...
    def write_snapshot(self, snapshot_id: str, created_at: float) -> None: ...


class CompactionSteps(ABC):
    """One Hermes design's steps of one guarded compression (the neutral ones here)."""

    # Hermes keeps the id by itself (it compacts in place): a guard error before Hermes runs
    # steps aside, since Hermes alone cannot rotate (compression_entry.stepped_aside).
    host_keeps_id = False

    def __init__(self, op: Compaction) -> None:
        self.op = op

    # -- lock and generation check ------------------------------------------------------
    def lease_table(self, mode: str) -> LeaseTable:
        """The lease table the guard's own lock takes (a row whose ``lock`` is not ``host``):
        the guard's table (the legacy strategies may hold Hermes's, ``lock: native``)."""
        return GuardLeases(self.op.store)

    def host_may_reenter(self, grant: LockGrant | None) -> AbstractContextManager[None]:
        """The scope in which Hermes's own acquire of a lock the guard holds re-enters it."""
        return nullcontext()

    @abstractmethod
    def live_rows(self) -> tuple[list[dict[str, Any]] | None, list[tuple[int, int]] | None]:
        """The live rows as stored (host.live_brief) and, where the steps need them, their ids as runs."""

    def stale_check(self) -> Callable[[], bool] | None:
        """Asked by the engine shim once Hermes holds its own lease, if the design has one."""
        return None

    # -- Hermes's compression call -------------------------------------------------------
    def before_summary(self, unreachable: bool) -> None:
        """Before the summary's start is noted; ``unreachable``: the shim cannot reach the engine."""
        return  # nothing to add

    def record_summary_start(self, engine: Any, unreachable: bool) -> None:
        """The phase row learns that the summary started."""
        self.op.begin(**self.op.summary_steps())

    @abstractmethod
    def host_call(self) -> AbstractContextManager[Any]:
        """The scope Hermes's compression runs in (what keeps it from rotating the id)."""

    def engine_returned(self, snapshot_id: str, created_at: float, arrived: list[list[Any]]) -> None:
        """Hermes's context engine returned a compaction, before Hermes writes it; ``arrived[0]``:
        the turns other writers stored, carried over after the compacted block."""
        return  # nothing to add

    def host_returned(self, snapshot_id: str) -> None:
        """Hermes's compression call returned or raised."""
        return  # nothing to add

    # -- settling Hermes's result --------------------------------------------------------
    def refused(self, system_prompt: str) -> Result | None:
        """Hermes declined to compact (its own lock): the outcome, or None."""
        return None

    def commit_failed(self) -> bool:
        """Hermes's own commit of the compaction failed and it handed the list back unchanged."""
        return False

    def host_wrote(self, compressed: list[Any]) -> bool:
        """Whether what must be written by Hermes is (False: nothing was, fail closed)."""
        return True

    def lease_lapsed(self, reason: str, system_prompt: str) -> Result | None:
        """The guard's lease lapsed while the summary ran: the outcome, or None to go on."""
        self.op.audit.warning("lock.lost", reason=reason)
        return None

    def before_persisting(self, foreign: list[Any]) -> list[Any]:
        """The turns to carry over, just before the guard persists anything."""
        return foreign

    def keep_snapshot(self, planned_id: str, created_at: float) -> str | None:
        """The snapshot (a copy, unless written ahead): its id, or None when none was kept."""
        if self.op.written_ahead is None:
            self.op.write_snapshot(planned_id, created_at)
        return planned_id

    def persist(self, compressed: list[Any], foreign: list[Any], system_prompt: str) -> list[Any]:
        """Write the compacted transcript where Hermes does not: the list the conversation continues with."""
        return compressed

    def persistence_failed(self, reason: str, exc: BaseException | None, system_prompt: str) -> Result | None:
        """The guard's persistence failed: the outcome, or None (the compaction stands without a snapshot)."""
        self.op.audit.warning("snapshot.failed", reason=reason)
        return None

    def carry_over(self, compressed: list[Any], foreign: list[Any]) -> list[Any]:
        """The turns other writers stored, kept live after the compacted block: those carried over."""
        return foreign

    def announce_boundary(self) -> None:
        """Tell Hermes's own parts a compaction boundary passed, where Hermes itself did not."""
        return  # nothing to add

    def persisted_after_guard_error(self, compressed: list[Any]) -> list[Any] | None:
        """After a guard error once Hermes ran, before the guard looked: what state.db holds, if compacted."""
        return None

    def adopted(self) -> None:
        """The live transcript was adopted instead of a compaction."""
        return  # nothing to add


# Each Hermes design's steps, by the seam row's ``strategy`` (filled by :func:`register`: the
# core's own strategy by :mod:`.compression`, the older releases' by the table's import of
# :mod:`.legacy`, so the core never names them).
STEPS: dict[str, type[CompactionSteps]] = {}


def register(strategy: str, steps: type[CompactionSteps]) -> None:
    """``steps`` run the compression rows whose ``strategy`` is ``strategy``."""
    STEPS[strategy] = steps
