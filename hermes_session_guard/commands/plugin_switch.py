"""What ``enable`` and ``disable`` share: the home check, the edit, one line of output."""

from __future__ import annotations

import argparse

from .. import dashboard_plugin
from ..maintenance.plugin_config import PLUGIN_NAME, PluginConfigError, set_enabled
from ..maintenance.state_inspection import HomeError, check
from .output import emit_json, fail


def add_switch_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def switch(args: argparse.Namespace, *, enable: bool) -> int:
    word = "enabled" if enable else "disabled"
    try:
        checked = check(empty_ok=True)
        change = set_enabled(checked.home, enable)
    except (HomeError, PluginConfigError) as exc:
        return fail(str(exc), args.json)
    try:  # the dashboard loads no agent plugins: a dashboard plugin switches the guard on there
        if enable:
            dashboard = str(dashboard_plugin.write(checked.home))
        else:
            removed = dashboard_plugin.remove(checked.home)
            dashboard = str(dashboard_plugin.plugin_dir(checked.home)) if removed else None
    except OSError as exc:
        return fail(f"config.yaml {word} the guard, but the dashboard plugin directory "
                    f"{dashboard_plugin.plugin_dir(checked.home)} could not be "
                    f"{'written' if enable else 'removed'}: {exc}", args.json)
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
