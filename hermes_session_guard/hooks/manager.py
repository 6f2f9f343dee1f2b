"""The guard's pluggy plugin manager (one per process)."""

from __future__ import annotations

import logging

import pluggy

from . import builtin as builtin_hooks
from . import specs as hookspecs

_manager: pluggy.PluginManager | None = None
log = logging.getLogger("hermes_session_guard")


def get_plugin_manager() -> pluggy.PluginManager:
    global _manager
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
