"""Quiet CLI one-shots (`hermes chat -Q -q`) print no guard warning, and the guard's recall
tool still reaches the model of a resumed session with compacted history.

Hermes 0.20 starts plugin discovery on a background thread and, while it runs, resolves the
CLI's toolsets with the plugin toolset keys the last launch wrote to
``cache/plugin_toolset_keys.json``; its CLI then checks each name against the plugins loaded
so far and printed ``Warning: Unknown toolsets: session_guard`` on stdout whenever the guard
had not loaded yet (8 of 12 runs). A directory plugin that takes a while to register, loaded
before the guard, makes every launch after the first lose that race, on any machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes_session_guard.seams.table import select_row

from ..fake_llm import ScriptedLLMServer
from .conftest import HOST, MODES
from .host_names import HOST_NAMES
from .test_recall_tool import FACT_A, SID_A, _compacted_session, _reachable, turn_requests

BIN = Path(sys.executable).parent
SLOW_PLUGIN = "slow-start"
SLOW_SECONDS = 2


def _hermes() -> str:
    """Hermes's own console script here (the 0.20.1 repackaging installs it as ``hermesx``)."""
    from importlib import metadata

    for ep in metadata.entry_points(group="console_scripts"):
        if ep.value.replace(" ", "") == "hermes_cli.main:main" and (BIN / ep.name).exists():
            return str(BIN / ep.name)
    return str(BIN / "hermes")


def _slow_plugin_first(home: Path) -> None:
    """A directory plugin enabled before the guard whose ``register`` sleeps: Hermes loads it
    first, so the guard registers its toolset only after the CLI has read and checked its own."""
    plugin = home / "plugins" / SLOW_PLUGIN
    plugin.mkdir(parents=True)
    (plugin / "plugin.yaml").write_text(f"name: {SLOW_PLUGIN}\nversion: 0.1.0\n", encoding="utf-8")
    (plugin / "__init__.py").write_text(f"import time\n\n\ndef register(ctx):\n    time.sleep({SLOW_SECONDS})\n",
                                        encoding="utf-8")
    config_path = home / "config.yaml"
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    config["plugins"]["enabled"] = [SLOW_PLUGIN, *config["plugins"]["enabled"]]
    config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")


def _one_shot(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HERMES_HOME=str(home))
    env.pop("HERMES_SESSION_ID", None)
    return subprocess.run([_hermes(), "chat", "-Q", "-q", *args], env=env, capture_output=True, text=True,
                          timeout=180, cwd=home)


def test_quiet_one_shots_carry_no_guard_warning_and_recall_stays_offered(
    guard: Any, db: Any, llm: ScriptedLLMServer, home: Path
) -> None:
    _compacted_session(db, llm, SID_A, "a", FACT_A, MODES[0])
    db.close()
    _slow_plugin_first(home)
    llm.reset()

    runs = [_one_shot(home, "hello")]  # Hermes 0.20 writes its plugin toolset keys in this launch
    seen = len(turn_requests(llm))
    # this one reads them, and checks them while the slow plugin holds the guard back
    runs.append(_one_shot(home, "what was the foreign key error?", "--resume", SID_A))

    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
        assert "session_guard" not in run.stdout, run.stdout
        assert "session guard" not in run.stdout.lower(), run.stdout
    resumed = turn_requests(llm)[seen:]
    assert resumed, "the resumed one-shot sent no request to the model"
    assert _reachable(resumed[0].body), json.dumps(sorted(
        t.get("function", {}).get("name") or t.get("name") for t in resumed[0].body.get("tools") or []))


def test_the_toolset_seams_lean_on_names_this_release_has() -> None:
    """Where the table patches ``toolset_keys`` / ``agent_toolsets``, the Hermes names the
    host adapter reads resolve here."""
    import importlib

    rows = [select_row(seam, HOST) for seam in ("toolset_keys", "agent_toolsets")]
    if not any(row is not None and row.wrapper is not None for row in rows):
        pytest.skip("the table patches neither seam on this release")
    missing = []
    for dotted in HOST_NAMES["background plugin discovery and toolset resolution (0.20)"]:
        module, _, name = dotted.rpartition(".")
        if not hasattr(importlib.import_module(module), name):
            missing.append(dotted)
    assert not missing
