"""What ``enable`` and ``disable`` share: the home check, the edit, one line of output."""

from __future__ import annotations

import argparse
import errno

from .. import dashboard_plugin
from ..maintenance.plugin_config import PLUGIN_NAME, PluginConfigError, set_enabled, undo
from ..maintenance.state_inspection import HomeError, check
from .output import emit_json, fail


def add_switch_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _why(exc: OSError) -> str:
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and exc.filename:
        return f"{exc.filename} is read-only ({exc.strerror})"
    return str(exc)


def switch(args: argparse.Namespace, *, enable: bool) -> int:
    """Everything that can refuse is tried before config.yaml changes: the dashboard plugin
    is built under a hidden name (enable) or moved out of sight (disable) first, then
    config.yaml is edited, then the plugin is put in place (or deleted); a failure after
    the edit puts config.yaml back."""
    word = "enabled" if enable else "disabled"
    try:
        checked = check(empty_ok=True)
    except HomeError as exc:
        return fail(str(exc), args.json)
    home = checked.home
    target = dashboard_plugin.plugin_dir(home)
    try:
        dashboard_plugin.check(home, removing=not enable)
        prepared = dashboard_plugin.stage(home) if enable else dashboard_plugin.detach(home)
    except OSError as exc:
        return fail(f"the dashboard plugin directory {target} could not be "
                    f"{'written' if enable else 'removed'}: {_why(exc)}; nothing changed", args.json)
    try:
        change = set_enabled(home, enable)
    except PluginConfigError as exc:
        if enable:
            dashboard_plugin.discard(prepared)
        elif prepared is not None:
            dashboard_plugin.reattach(home, prepared)
        return fail(str(exc), args.json)
    try:
        if enable:
            dashboard = str(dashboard_plugin.commit(home, prepared)) if prepared is not None else None
        else:
            dashboard_plugin.discard(prepared)
            dashboard = str(target) if prepared is not None else None
    except OSError as exc:
        undone = undo(change)
        return fail(f"the dashboard plugin directory {target} could not be written: {_why(exc)}; "
                    + ("config.yaml was put back as it was" if undone or not change.changed else
                       f"config.yaml {word} the guard (it changed meanwhile, so it was not put back)"), args.json)
    if args.json:
        emit_json({"ok": True, "config": str(change.path), "changed": change.changed,
                   "backup": str(change.backup) if change.backup else None, "guard_enabled": enable,
                   "dashboard_plugin": dashboard if enable else None,
                   "dashboard_plugin_removed": None if enable else dashboard})
        return 0
    where = (f"; dashboard plugin in {dashboard}" if enable
             else f"; dashboard plugin {dashboard} removed" if dashboard else "")
    if not change.changed:
        print(f"{PLUGIN_NAME} is already {word} in {change.path}; nothing changed in config.yaml{where}")
        return 0
    backup = f" (previous file kept as {change.backup})" if change.backup else ""
    print(f"{PLUGIN_NAME} {word} in {change.path}{backup}{where}; takes effect when Hermes next starts "
          "(restart the gateway and the dashboard)")
    return 0
