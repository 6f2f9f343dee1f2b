"""hermes-session-guard: session-stable context compression for Hermes Agent.

Hermes loads this module through the ``hermes_agent.plugins`` entry point
``session-guard`` and calls :func:`register`. Embedders and tests can switch the
guard on without plugin discovery with :func:`install` / :func:`uninstall`.
The package map (parts, arrows, rules) is ``docs/architecture.md``.
"""

from __future__ import annotations

import logging
from typing import Any

from . import host as _host
from . import redaction_core as _redaction_core
from .config import ConfigError, GuardConfig, load_config
from .fail_open import failing_open
from .handoff import extension as _handoff_extension
from .handoff.redaction import redact_guard_patterns as _guard_patterns
from .hooks.manager import switch_extension as _switch_extension
from .hostinfo import GUARD_VERSION, hermes_home
from .runtime import current_runtime
from .seams.apply import is_installed, uninstall
from .seams.apply import switch_on as _switch_on
from .store.snapshots import bind_archived_reader as _bind_archived_reader
from .summaries import host_port as _host_port

# The composition root: summaries/ reads Hermes's markers and state.db through host/,
# handed in here so it never imports host/ (docs/architecture.md, rule 3).
_host_port.bind(_host)
# store/ reads snapshots by reference (Hermes's archived rows, native mode) through host/.
_bind_archived_reader(_host.referenced_messages)
# The secret mask below every part (the audit log, the compaction events, the dashboard)
# runs the hand-off extension's full pattern pass; its own pass stands in without it.
_redaction_core.bind(_guard_patterns)

__version__ = GUARD_VERSION
__all__ = ["ConfigError", "GuardConfig", "install", "uninstall", "register", "is_installed", "current_runtime"]

log = logging.getLogger("hermes_session_guard")


def install(config: GuardConfig | dict[str, Any] | None = None) -> Any:
    """Patch the installed Hermes. ``config`` is a :class:`GuardConfig`, the raw
    ``session_guard`` mapping, or ``None`` for the defaults. The hand-off extension
    (``handoff/``) is registered on the guard's hooks when ``handoff.enabled`` is true
    and unregistered otherwise. Idempotent."""
    runtime = _switch_on(config)
    _switch_extension(_handoff_extension.NAME, _handoff_extension,
                      runtime is not None and runtime.config.handoff.enabled)
    return runtime


def register(ctx: Any) -> None:
    """Hermes plugin entry point: read ``session_guard:`` from config.yaml, patch the
    seams, and add ``hermes session-guard ...``, the ``session_guard_recall`` tool and
    ``/handoff-packet``. Never raises into the host."""
    with failing_open("registering the `hermes session-guard` command",
                      "Hermes runs without `hermes session-guard`; the guard itself stays on",
                      advice=None, level=logging.WARNING):
        from .commands.cli import register_cli

        register_cli(ctx)
    with failing_open("registering the session_guard_recall tool",
                      "the agent runs without the session_guard_recall tool; the guard itself stays on",
                      advice=None, level=logging.WARNING):
        from .summaries.recall_tool import register_after_toolset_keys, register_recall_tool

        # On Hermes's background discovery thread (0.20), after Hermes writes this launch's
        # plugin toolset keys (the ``toolset_keys`` seam); any other way, now.
        if _host.discovering_in_background():
            register_after_toolset_keys(ctx)
        else:
            register_recall_tool(ctx)
    with failing_open("registering the /handoff-packet slash command",
                      "Hermes runs without /handoff-packet; the guard itself stays on", advice=None,
                      level=logging.WARNING):
        from .commands.cli import register_slash_commands

        register_slash_commands(ctx)
    try:
        _configure_and_install()
    finally:
        with failing_open("registering the session_guard_recall tool",
                          "the agent runs without the session_guard_recall tool; the guard itself stays on",
                          advice=None, level=logging.WARNING):
            _register_recall_unless_waiting()


def _register_recall_unless_waiting() -> None:
    """The recall tool held back for Hermes's plugin toolset keys registers now unless the
    ``toolset_keys`` seam is patched to register it after Hermes writes them."""
    from .seam_behaviour import SeamState
    from .summaries.recall_tool import register_waiting

    runtime = current_runtime()
    if runtime is None or not any(s.name == "toolset_keys" and s.state == SeamState.PATCHED for s in runtime.seams):
        register_waiting()


def _configure_and_install() -> None:
    """Read ``session_guard:`` from config.yaml and patch the seams (one ERROR line when it cannot)."""
    try:
        config = load_config(hermes_home())
    except ConfigError as exc:
        if exc.key.endswith("(file)"):  # not a regular file, too large, not UTF-8, not YAML, aliases unbounded
            log.error("session guard DISABLED: cannot use config.yaml (%s). Hermes continues unguarded; "
                      "fix the file and restart.", str(exc).split(": ", 1)[-1])
            return
        log.error("session guard DISABLED: invalid config.yaml option %s (%s). Hermes continues unguarded; "
                  "fix the option and restart.", exc.key, exc)
        return
    except (OSError, ValueError) as exc:  # unreadable or not UTF-8: no config to go by
        log.error("session guard DISABLED: cannot read config.yaml (%s). Hermes continues unguarded; "
                  "fix the file and restart.", type(exc).__name__)
        return
    with failing_open("install", "session guard DISABLED, Hermes continues unguarded"):
        install(config)
