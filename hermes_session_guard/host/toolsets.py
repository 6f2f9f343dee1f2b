"""Hermes's plugin discovery thread and its toolset resolution (0.20).

On 0.20 the CLI (and every command that can run an agent) starts plugin discovery on a
background thread (``hermes_cli.plugins.start_background_plugin_discovery``); while that
thread runs, Hermes resolves a platform's toolsets with the plugin toolset keys the last
launch wrote to ``cache/plugin_toolset_keys.json`` (``get_plugin_toolset_keys_nowait``),
and the thread rewrites that file when discovery ends (``_persist_plugin_toolset_keys``).
"""

from __future__ import annotations

import sys
import threading


def _discovery_thread() -> threading.Thread | None:
    plugins = sys.modules.get("hermes_cli.plugins")
    thread = getattr(plugins, "_background_discovery_thread", None)
    return thread if isinstance(thread, threading.Thread) else None


def discovering_in_background() -> bool:
    """This code runs on Hermes's background plugin-discovery thread."""
    thread = _discovery_thread()
    return thread is not None and thread is threading.current_thread()


def discovered_in_background() -> bool:
    """This process ran Hermes's background plugin discovery, so a toolset list resolved
    while it ran came from the plugin toolset keys of the last launch."""
    return _discovery_thread() is not None


def platform_toolsets(platform: str) -> set[str]:
    """Hermes's own resolution of ``platform``'s toolsets from config.yaml
    (``hermes_cli.tools_config._get_platform_tools``), with the plugins registered now."""
    from hermes_cli.config import load_config
    from hermes_cli.tools_config import _get_platform_tools

    return {str(name) for name in _get_platform_tools(load_config() or {}, platform)}
