"""Process-wide state of an installed guard: config, audit log, stores, seam status."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .audit import AuditLog, audit_file
from .config import GuardConfig
from .contract.compaction_log import CompactionLog
from .contract.compressing import CompressingSessions
from .hostinfo import hermes_home, state_db_path
from .locks import presence
from .locks.session_lock import SessionLocks
from .seam_behaviour import Behaviour, SeamState
from .store import GuardStore, database_key, snapshots_recorded


@dataclass
class SeamStatus:
    name: str
    target: str
    state: SeamState
    reason: str = ""
    failure_policy: str = ""
    row: str = ""  # the seam-table row applied (its version range), "" when none

    def as_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


class PendingNotices:
    """Messages for a gateway conversation that no status channel could carry yet
    (keyed by the session the conversation is routed to; a few per session at most)."""

    MAX_PER_SESSION = 5

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, list[str]] = {}

    def add(self, session_id: str, text: str) -> None:
        with self._lock:
            queue = self._pending.setdefault(session_id, [])
            queue.append(text)
            del queue[: -self.MAX_PER_SESSION]

    def pop(self, session_id: str) -> list[str]:
        with self._lock:
            return self._pending.pop(session_id, [])


@dataclass
class Runtime:
    config: GuardConfig
    host_version: str | None
    fixed_home: Path | None = None
    seams: list[SeamStatus] = field(default_factory=list)
    compactions: CompactionLog = field(default_factory=CompactionLog)
    compressing: CompressingSessions = field(default_factory=CompressingSessions)
    notices: PendingNotices = field(default_factory=PendingNotices)
    # seam -> the behaviour values of the row applied for the installed Hermes (seams.py)
    behaviour: dict[str, Behaviour] = field(default_factory=dict)
    host_in_table: bool = True  # False: a release outside the seam table (seams verified by signature)
    compat_note: str = ""  # plain words for selftest and the log when host_in_table is False
    # a release newer than the table: this process's verification plan (seams.verification.Plan)
    verification: Any = None
    unverified_seams: set[str] = field(default_factory=set)  # left off until selftest verifies them
    _stores: dict[Path, GuardStore] = field(default_factory=dict)
    _locks: dict[Path, SessionLocks] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _session_dbs: dict[str, Path] = field(default_factory=dict)
    _with_snapshots: set[tuple[Path, str]] = field(default_factory=set)
    _audit_path: tuple[tuple[str, Path], Path] | None = None

    def __post_init__(self) -> None:
        self.audit = AuditLog(lambda: self.audit_path, home=lambda: self.home)

    @property
    def home(self) -> Path:
        """``HERMES_HOME`` now (resolved per use: profiles and tests switch it)."""
        return self.fixed_home or hermes_home()

    @property
    def audit_path(self) -> Path:
        """The configured audit file, under the home now (read at every audit line: the
        path is built once per configured path and home)."""
        key = (self.config.audit.path, self.home)
        cached = self._audit_path
        if cached is None or cached[0] != key:
            cached = self._audit_path = (key, audit_file(key[1], key[0]))
        return cached[1]

    def store_for(self, db_path: Path) -> GuardStore:
        key = database_key(db_path)
        with self._lock:
            store = self._stores.get(key)
            if store is None:
                store = self._stores[key] = GuardStore(key)
        # This process runs the guard on that state.db: operators' commands see it (presence;
        # once per database, a failed announcement retried at most once a minute).
        presence.announce_quietly(key)
        return store

    def locks_for(self, db_path: Path) -> SessionLocks:
        """The compression locks of one state.db (shared by every agent of this process)."""
        key = database_key(db_path)
        with self._lock:
            locks = self._locks.get(key)
            if locks is None:
                locks = self._locks[key] = SessionLocks()
            return locks

    def seam_patched(self, name: str) -> bool:
        return any(s.name == name and s.state == "patched" for s in self.seams)

    def remember_session(self, session_id: str, db_path: Path) -> None:
        """The state.db an agent of ``session_id`` writes to (tools only learn the id)."""
        if session_id:
            self._session_dbs[session_id] = Path(db_path)

    def db_for_session(self, session_id: str) -> Path:
        return self._session_dbs.get(session_id) or state_db_path(self.home)

    def has_snapshots(self, session_id: str, db_path: Path | None = None) -> bool:
        """Whether ``session_id`` has compacted history (cached once true: snapshots are never removed
        while the guard runs)."""
        if not session_id:
            return False
        path = Path(db_path) if db_path is not None else self.db_for_session(session_id)
        key = (database_key(path), session_id)
        if key in self._with_snapshots:
            return True
        if not path.exists():
            return False
        with self._lock:
            store = self._stores.get(key[0])
        # A database the guard has not opened yet (every transcript Hermes loads asks) is read
        # through a connection closed at once: no store, no tables, no handle left behind.
        found = store.has_snapshots(session_id) if store is not None else snapshots_recorded(path, session_id)
        if found:
            self._with_snapshots.add(key)
        return found

    def note_snapshot(self, session_id: str, db_path: Path) -> None:
        self._with_snapshots.add((database_key(db_path), session_id))

    def close(self) -> None:
        with self._lock:
            for locks in self._locks.values():
                locks.close()
            self._locks.clear()
            for store in self._stores.values():
                store.close()
            self._stores.clear()


_current: Runtime | None = None


def current_runtime() -> Runtime | None:
    """The runtime :func:`hermes_session_guard.install` made in this process; None before
    install and after uninstall. Hooks, the recall tool and commands read it here, so none of
    them imports the patcher."""
    return _current


def set_current_runtime(runtime: Runtime | None) -> None:
    """Only :mod:`hermes_session_guard.seams.apply` sets it (install / uninstall)."""
    global _current
    _current = runtime
