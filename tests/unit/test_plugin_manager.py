"""hooks.manager: one manager per process, built once even when threads race; each
extension loaded on its own, a broken one left out with a warning."""

from __future__ import annotations

import logging
import threading
import time
import types
from dataclasses import dataclass
from typing import Any

import pytest

from hermes_session_guard.hooks import manager
from hermes_session_guard.hooks.specs import hookimpl


@dataclass
class FakeEntryPoint:
    """What load_extensions reads of an importlib.metadata.EntryPoint."""

    name: str
    value: str
    target: Any

    def load(self) -> Any:
        if isinstance(self.target, Exception):
            raise self.target
        return self.target


def _extension(**hooks: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{name: hookimpl(fn) for name, fn in hooks.items()})


def _events_seen(into: list[str]) -> types.SimpleNamespace:
    def session_guard_compression_failed(session_id: str, op_id: str, reason: str) -> None:
        into.append(session_id)

    return _extension(session_guard_compression_failed=session_guard_compression_failed)


def test_threads_asking_at_once_share_one_manager_and_load_extensions_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manager, "_manager", None)
    loads: list[int] = []

    def slow_entry_points() -> list[FakeEntryPoint]:
        loads.append(1)
        time.sleep(0.05)  # widen the window another thread could build a second manager in
        return []

    monkeypatch.setattr(manager, "_entry_points", slow_entry_points)
    start = threading.Barrier(8)
    got: list[Any] = []

    def ask() -> None:
        start.wait()
        got.append(manager.get_plugin_manager())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len({id(pm) for pm in got}) == 1
    assert loads == [1]
    assert manager.get_plugin_manager() is got[0]


@pytest.mark.parametrize("broken", [
    ImportError("no module named notes_extra"),
    # implements a hook no spec declares: check_pending() refuses it
    _extension(session_guard_no_such_hook=lambda session_id: None),
    # implements a declared hook with an argument the spec does not have: register() refuses it
    _extension(session_guard_compression_failed=lambda session_id, op_id, reason, extra: None),
], ids=["import-fails", "unknown-hook", "bad-arguments"])
def test_a_broken_extension_is_left_out_and_the_others_still_run(monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture,
                                                                  broken: Any) -> None:
    monkeypatch.setattr(manager, "_manager", None)
    seen: list[str] = []
    entry_points = [FakeEntryPoint("before", "ext_before:hooks", _events_seen(seen)),
                    FakeEntryPoint("broken", "ext_broken:hooks", broken),
                    FakeEntryPoint("after", "ext_after:hooks", _events_seen(seen))]
    monkeypatch.setattr(manager, "_entry_points", lambda: entry_points)
    with caplog.at_level(logging.WARNING, logger="hermes_session_guard"):
        pm = manager.get_plugin_manager()
    assert pm.get_plugin("broken") is None
    assert pm.get_plugin("builtin") is not None
    pm.hook.session_guard_compression_failed(session_id="s1", op_id="op", reason="r")
    assert seen == ["s1", "s1"]  # both working extensions answered
    lines = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(lines) == 1 and "'broken'" in lines[0]


def test_the_built_in_hooks_pass_check_pending(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manager, "_manager", None)
    monkeypatch.setattr(manager, "_entry_points", lambda: [])
    manager.get_plugin_manager().check_pending()  # raises PluginValidationError on an unknown hook
