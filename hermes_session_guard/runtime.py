"""Process-wide state of an installed guard: config, audit log, stores, seam status."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from .audit import AuditLog
from .config import GuardConfig
from .hostinfo import hermes_home
from .session_lock import SessionLocks
from .store import GuardStore


@dataclass
class SeamStatus:
    name: str
    target: str
    state: str  # "patched" | "skipped" | "failed"
    reason: str = ""
    failure_policy: str = ""

    def as_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


@dataclass
class Runtime:
    config: GuardConfig
    host_version: str | None
    fixed_home: Path | None = None
    seams: list[SeamStatus] = field(default_factory=list)
    _stores: dict[Path, GuardStore] = field(default_factory=dict)
    _locks: dict[Path, SessionLocks] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.audit = AuditLog(lambda: self.audit_path)

    @property
    def home(self) -> Path:
        """``HERMES_HOME`` now (resolved per use: profiles and tests switch it)."""
        return self.fixed_home or hermes_home()

    @property
    def audit_path(self) -> Path:
        path = Path(self.config.audit.path)
        return path if path.is_absolute() else self.home / path

    def store_for(self, db_path: Path) -> GuardStore:
        key = Path(db_path).resolve()
        with self._lock:
            store = self._stores.get(key)
            if store is None:
                store = self._stores[key] = GuardStore(key)
            return store

    def locks_for(self, db_path: Path) -> SessionLocks:
        """The compression locks of one state.db (shared by every agent of this process)."""
        key = Path(db_path).resolve()
        with self._lock:
            locks = self._locks.get(key)
            if locks is None:
                locks = self._locks[key] = SessionLocks()
            return locks

    def seam_patched(self, name: str) -> bool:
        return any(s.name == name and s.state == "patched" for s in self.seams)

    def close(self) -> None:
        with self._lock:
            for locks in self._locks.values():
                locks.close()
            self._locks.clear()
            for store in self._stores.values():
                store.close()
            self._stores.clear()
