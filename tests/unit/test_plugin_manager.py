"""hooks.manager.get_plugin_manager: one manager per process, built once even when threads race."""

from __future__ import annotations

import threading
import time
from typing import Any

import pluggy
import pytest

from hermes_session_guard.hooks import manager


def test_threads_asking_at_once_share_one_manager_and_load_extensions_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manager, "_manager", None)
    loads: list[str] = []
    real = pluggy.PluginManager.load_setuptools_entrypoints

    def slow_load(self: pluggy.PluginManager, group: str, name: Any = None) -> int:
        loads.append(group)
        time.sleep(0.05)  # widen the window another thread could build a second manager in
        return real(self, group, name)

    monkeypatch.setattr(pluggy.PluginManager, "load_setuptools_entrypoints", slow_load)
    start = threading.Barrier(8)
    got: list[pluggy.PluginManager] = []

    def ask() -> None:
        start.wait()
        got.append(manager.get_plugin_manager())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len({id(pm) for pm in got}) == 1
    assert loads == [manager.hookspecs.PROJECT]
    assert manager.get_plugin_manager() is got[0]
