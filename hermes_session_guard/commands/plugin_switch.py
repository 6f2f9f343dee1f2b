"""What ``enable`` and ``disable`` share: the home check, the edit, one line of output."""

from __future__ import annotations

import argparse
import errno
import os
from pathlib import Path

from .. import dashboard_plugin
from ..maintenance.plugin_config import PLUGIN_NAME, PluginConfigError, guard_enabled, set_enabled, undo
from ..maintenance.state_inspection import HomeError, check
from .output import emit_json, fail


def add_switch_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _why(exc: OSError) -> str:
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and exc.filename:
        return f"{exc.filename} is read-only ({exc.strerror})"
    return str(exc)


def _settle(home: Path, enable: bool, prepared: Path | None) -> str:
    """After an interrupt: the dashboard plugin made to agree with what config.yaml says
    now, so the switch either completed or was rolled back, never half of each."""
    try:
        enabled_now = guard_enabled(home)[0]
    except PluginConfigError:
        enabled_now = not enable  # unreadable now: the plugin goes back to how it was
    staged = prepared if prepared is not None and os.path.lexists(prepared) else None
    present = os.path.lexists(dashboard_plugin.plugin_dir(home))
    if enable and enabled_now:
        if staged is not None:
            dashboard_plugin.commit(home, staged)
        elif not present:
            dashboard_plugin.write(home)
        return "completed"
    if not enable and not enabled_now:
        dashboard_plugin.discard(staged)
        return "completed"
    if enable:
        dashboard_plugin.discard(staged)
    elif staged is not None:
        dashboard_plugin.reattach(home, staged)
    elif not present:  # none to put back (interrupted inside the move): written again
        dashboard_plugin.write(home)
    return "rolled back"


def switch(args: argparse.Namespace, *, enable: bool) -> int:
    """Everything that can refuse is tried before config.yaml changes: the dashboard plugin
    is built under a hidden name (enable) or moved out of sight (disable) first, then
    config.yaml is edited, then the plugin is put in place (or deleted); a failure after
    the edit puts config.yaml back. An interrupt (Ctrl-C) at any step ends with the
    switch completed or rolled back as config.yaml then says (:func:`_settle`), one line,
    exit 2."""
    try:
        checked = check(empty_ok=True)
    except HomeError as exc:
        return fail(str(exc), args.json)
    home = checked.home
    steps: list[Path | None] = []
    try:
        return _switch(args, home, enable, steps)
    except KeyboardInterrupt:
        outcome = _settle(home, enable, next((s for s in reversed(steps) if s is not None), None))
        return fail(f"interrupted; `{'enable' if enable else 'disable'}` was {outcome} (config.yaml and the "
                    "dashboard plugin agree)", args.json)


def _switch(args: argparse.Namespace, home: Path, enable: bool, steps: list[Path | None]) -> int:
    word = "enabled" if enable else "disabled"
    target = dashboard_plugin.plugin_dir(home)
    try:
        dashboard_plugin.check(home, removing=not enable)
        prepared = dashboard_plugin.stage(home) if enable else dashboard_plugin.detach(home, steps)
        steps.append(prepared)
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
