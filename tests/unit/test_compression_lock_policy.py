"""How ``guarded_compression`` uses the session lock, without a host: a busy lock
skips naming the holder, a broken lease table fails closed (or open when a row
says so), and the lock is always given back."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import audit
from hermes_session_guard.config import GuardConfig, LockConfig
from hermes_session_guard.locks.session_lock import LockGrant
from hermes_session_guard.runtime import Runtime
from hermes_session_guard.seam_behaviour import Strategy
from hermes_session_guard.seams.compression import LockPolicy, guarded_compression
from hermes_session_guard.store import GuardStore

SID = "20260528_155201_68dc5996"


class Agent:
    """Just what the guard reads from an agent that has no SessionDB."""

    def __init__(self) -> None:
        self.session_id = SID
        self._session_db = None
        self._cached_system_prompt = "cached prompt"


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    rt = Runtime(config=replace(GuardConfig(), lock=LockConfig(wait_seconds=0.05)), host_version="0.14.0")
    yield rt
    rt.close()


def _events(rt: Runtime) -> list[dict[str, Any]]:
    return [e for e in audit.read_events(rt.audit_path) if e.get("op_id")]


def test_busy_session_is_skipped_naming_the_holder_and_the_host_never_runs(runtime: Runtime, tmp_path: Path) -> None:
    db_path = tmp_path / "state.db"
    from hermes_session_guard.locks.session_lock import GuardLeases

    held = runtime.locks_for(db_path).acquire(SID, "winner", wait_seconds=0, lease_seconds=60,
                                              lease=GuardLeases(runtime.store_for(db_path)))
    assert isinstance(held, LockGrant)
    messages = [{"role": "user", "content": "hello"}]
    calls: list[int] = []

    out, prompt = guarded_compression(runtime, Strategy.DETACH_DB, Agent(), messages,
                                      lambda: calls.append(1) or ([], ""))
    held.release()

    assert calls == [] and out is messages and prompt == "cached prompt"
    started, skipped = _events(runtime)
    assert skipped["event"] == "compression.skipped" and skipped["holder"] == held.holder
    assert skipped["session_id"] == SID == started["session_id"] and skipped["waited_ms"] >= 40


def test_broken_lease_table_fails_closed(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> bool:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(GuardStore, "try_acquire_lease", broken)
    messages = [{"role": "user", "content": "hello"}]
    calls: list[int] = []
    out, _ = guarded_compression(runtime, Strategy.DETACH_DB, Agent(), messages, lambda: calls.append(1) or ([], ""))
    assert calls == [] and out is messages
    skipped = _events(runtime)[-1]
    assert skipped["event"] == "compression.skipped" and "disk I/O error" in skipped["reason"]
    assert runtime.locks_for(runtime.home / "state.db").held_sessions() == []


def test_broken_lease_table_with_an_open_policy_compresses_unlocked(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(GuardStore, "try_acquire_lease", lambda *a, **k: (_ for _ in ()).throw(sqlite3.Error("x")))
    calls: list[int] = []
    guarded_compression(runtime, Strategy.DETACH_DB, Agent(), [{"role": "user", "content": "hello"}],
                        lambda: calls.append(1) or ([{"role": "user", "content": "hello"}], "p"),
                        lock=LockPolicy(on_failure="open"))
    assert calls == [1]
    names = [e["event"] for e in _events(runtime)]
    assert "lock.unavailable" in names and names[-1] == "compression.skipped"  # no progress from the stub
    assert _events(runtime)[-1]["lock"] == "none"


def test_the_lock_is_released_when_the_host_raises(runtime: Runtime) -> None:
    def host() -> Any:
        raise RuntimeError("provider exploded")

    with pytest.raises(RuntimeError, match="provider exploded"):
        guarded_compression(runtime, Strategy.DETACH_DB, Agent(), [{"role": "user", "content": "hi"}], host)
    assert runtime.locks_for(runtime.home / "state.db").held_sessions() == []
    assert runtime.store_for(runtime.home / "state.db").lease_holder(SID) is None
    assert _events(runtime)[-1]["event"] == "compression.failed"
