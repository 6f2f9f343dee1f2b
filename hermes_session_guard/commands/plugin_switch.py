"""What ``enable`` and ``disable`` share: the home check, the edit, one line of output."""

from __future__ import annotations

import argparse

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
    if args.json:
        emit_json({"ok": True, "config": str(change.path), "changed": change.changed,
                   "backup": str(change.backup) if change.backup else None, "guard_enabled": enable})
        return 0
    if not change.changed:
        print(f"{PLUGIN_NAME} is already {word} in {change.path}; nothing changed")
        return 0
    backup = f" (previous file kept as {change.backup})" if change.backup else ""
    print(f"{PLUGIN_NAME} {word} in {change.path}{backup}; takes effect when Hermes next starts "
          "(restart the gateway)")
    return 0
