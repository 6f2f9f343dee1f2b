"""The commands in a Python environment without hermes-agent: a plain message, no traceback.

Each command runs in its own process in which hermes-agent is made invisible (its
distribution metadata and its top-level modules cannot be found), as in a venv that
has only the guard and its declared dependencies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

HIDE_HERMES = """
import importlib.abc, importlib.metadata as md, sys
HIDDEN = ("run_agent", "hermes_state", "hermes_cli", "agent", "gateway", "tools", "cli", "tui_gateway",
          "acp_adapter", "cron", "hermes_constants", "model_tools", "toolsets")
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Hide())
_version, _distribution = md.version, md.distribution
def version(name):
    if name.replace("_", "-").lower() == "hermes-agent":
        raise md.PackageNotFoundError(name)
    return _version(name)
def distribution(name):
    if name.replace("_", "-").lower() == "hermes-agent":
        raise md.PackageNotFoundError(name)
    return _distribution(name)
md.version, md.distribution = version, distribution
from hermes_session_guard.commands.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def _run(argv: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HERMES_HOME=str(home), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", HIDE_HERMES, *argv], env=env, capture_output=True, text=True,
                          timeout=60, cwd=str(home))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    from .hermes_like_db import rotated_home

    h, _ = rotated_home(tmp_path / "home")
    h.close()
    return h.home


def test_selftest_says_hermes_is_not_installed(home: Path) -> None:
    proc = _run(["selftest"], home)
    assert proc.returncode == 1, proc.stderr
    assert "error: Hermes is not installed in this Python environment" in proc.stdout
    assert "no hermes-agent distribution and no importable hermes_cli" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr and "No module named" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("argv, code", [(["doctor"], 1), (["status"], 0), (["repair"], 0), (["snapshots", "r"], 0),
                                        (["enable"], 0), (["disable"], 0)])
def test_reading_commands_work(home: Path, argv: list[str], code: int) -> None:
    proc = _run(argv, home)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv", [["handoff", "r"], ["repair", "--apply"]])
def test_writing_commands_give_one_clean_error(home: Path, argv: list[str]) -> None:
    proc = _run(argv, home)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "hermes-agent is not" in lines[0] or "not importable" in lines[0]
