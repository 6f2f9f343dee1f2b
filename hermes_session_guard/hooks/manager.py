"""The guard's pluggy plugin manager (one per process, built once under a lock)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from importlib import metadata

import pluggy

from ..fail_open import failing_open
from . import builtin as builtin_hooks
from . import specs as hookspecs

_manager: pluggy.PluginManager | None = None
_manager_lock = threading.Lock()
# The extensions switched on inside the package (by name): registered on the manager
# now, or when it is built (switch_extension)
_switched_on: dict[str, object] = {}
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
            for name, plugin in _switched_on.items():
                pm.register(plugin, name=name)
            load_extensions(pm, _entry_points())
            _manager = pm
        return _manager


def switch_extension(name: str, plugin: object, on: bool) -> None:
    """Register the extension ``plugin`` under ``name`` (``on``) or unregister it: the
    composition root's switch for an extension inside the package, as its option says.
    A manager not built yet registers it when it is built, after the built-in hooks
    and before the installed extensions. Idempotent."""
    with _manager_lock:
        if on:
            _switched_on[name] = plugin
        else:
            _switched_on.pop(name, None)
        pm = _manager
        if pm is None:
            return
        registered = pm.get_plugin(name)
        if on and registered is None:
            pm.register(plugin, name=name)
        elif not on and registered is plugin:
            pm.unregister(name=name)


def _entry_points() -> Iterable[metadata.EntryPoint]:
    """The installed extensions: the ``hermes_session_guard`` entry-point group."""
    return metadata.entry_points(group=hookspecs.PROJECT)


def load_extensions(pm: pluggy.PluginManager, entry_points: Iterable[metadata.EntryPoint]) -> list[str]:
    """Register each extension on its own, then ``check_pending()``: an extension that fails
    to import, to register (a hook implementation whose arguments no spec has) or to validate
    (a hook no spec declares) is left out with a warning naming it; the others and the
    built-in hooks keep working. Returns the names registered."""
    loaded: list[str] = []
    for ep in entry_points:
        if pm.get_plugin(ep.name) is not None or pm.is_blocked(ep.name):
            continue
        with failing_open(f"extension {ep.name!r} ({ep.value})", "it is left out, the guard runs without it",
                          advice=None, level=logging.WARNING) as failed:
            pm.register(ep.load(), name=ep.name)
        if failed:
            continue
        loaded.append(ep.name)
    for _ in range(len(loaded) + 1):
        try:
            pm.check_pending()
            break
        except pluggy.PluginValidationError as exc:
            name = pm.get_name(exc.plugin) or repr(exc.plugin)
            pm.unregister(exc.plugin)
            if name in loaded:
                loaded.remove(name)
            log.warning("session guard: extension %r left out, the guard runs without it: %s", name, exc)
    return loaded
