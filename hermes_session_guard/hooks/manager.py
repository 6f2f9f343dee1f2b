"""The guard's pluggy plugin manager (one per process, built once under a lock)."""

from __future__ import annotations

import logging
import threading

import pluggy

from . import builtin as builtin_hooks
from . import specs as hookspecs

_manager: pluggy.PluginManager | None = None
_manager_lock = threading.Lock()
log = logging.getLogger("hermes_session_guard")


def get_plugin_manager() -> pluggy.PluginManager:
    """The process's plugin manager: the built-in hooks plus every installed extension.
    Threads asking at once (a gateway's executor threads) get the same one; extensions
    are loaded exactly once."""
    manager = _manager
    if manager is not None:
        return manager
    return _build()


def _build() -> pluggy.PluginManager:
    global _manager
    with _manager_lock:
        if _manager is None:
            pm = pluggy.PluginManager(hookspecs.PROJECT)
            pm.add_hookspecs(hookspecs)
            pm.register(builtin_hooks, name="builtin")
            try:
                pm.load_setuptools_entrypoints(hookspecs.PROJECT)
            except Exception as exc:  # a broken third-party extension must not disable the guard
                log.warning("session guard: loading extensions failed: %s", exc)
            _manager = pm
        return _manager
