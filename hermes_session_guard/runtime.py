"""Process-wide state of an installed guard: config, audit log, stores, seam status."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from .audit import AuditLog
from .compressing import CompressingSessions
from .config import GuardConfig
from .gateway_transcript import CompactionLog
from .hostinfo import hermes_home
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
    compactions: CompactionLog = field(default_factory=CompactionLog)
    compressing: CompressingSessions = field(default_factory=CompressingSessions)
    _stores: dict[Path, GuardStore] = field(default_factory=dict)
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

    def close(self) -> None:
        with self._lock:
            for store in self._stores.values():
                store.close()
            self._stores.clear()
