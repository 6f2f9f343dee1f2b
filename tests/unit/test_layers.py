"""The import-linter contracts in pyproject.toml hold for the package, and fail on a wrong import.

Each wrong import is planted in a temporary copy of the package (never in the tree), once at
module level and once inside a function (the contracts see function-local imports too).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import importlinter  # noqa: F401  (test extra: the contracts cannot be checked without it)
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "hermes_session_guard"
RUN = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"


def lint(where: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(where)}
    return subprocess.run([sys.executable, "-c", RUN], cwd=where, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_package_keeps_its_contracts() -> None:
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / PACKAGE, tmp_path / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


WRONG = [
    # (module in the copy, planted code, the contract that must break)
    ("contract/generations.py", "import wrapt  # noqa\n", "Only seams/ imports wrapt"),
    ("maintenance/corruption.py", "def _peek():\n    import hermes_state  # noqa\n",
     "Only seams/, host/ and selftest/ import Hermes modules"),
    ("locks/liveness.py", "def _peek():\n    from .. import host  # noqa\n",
     "contract/, locks/, inbox/, summaries/ and store/ reach neither"),
    ("summaries/tags.py", "def _peek():\n    from ..host import markers  # noqa\n",
     "contract/, locks/, inbox/, summaries/ and store/ reach neither"),
    ("summaries/visibility.py", "def _peek():\n    from ..seams import apply  # noqa\n",
     "contract/, locks/, inbox/, summaries/ and store/ reach neither"),
    ("maintenance/state_inspection.py", "def _peek():\n    from ..commands import cli  # noqa\n",
     "Only the entry points"),
    ("host/client_events.py", "def _peek():\n    from ..hooks import specs  # noqa\n",
     "host/, telemetry.py and compaction_event.py import no hooks/"),
    ("telemetry.py", "def _peek():\n    from .hooks import specs  # noqa\n",
     "host/, telemetry.py and compaction_event.py import no hooks/"),
    ("dashboard_plugin.py", "def _peek():\n    from . import install  # noqa\n",
     "Nothing in the package imports its root"),
    ("seams/verification.py", "def _peek():\n    from .. import __version__  # noqa\n",
     "Nothing in the package imports its root"),
    ("hooks/__init__.py", "def _peek():\n    from .. import install  # noqa\n",
     "Nothing in the package imports its root"),
    ("selftest/gateway.py", "def _peek():\n    from . import probe  # noqa\n",
     "No circle of imports"),
    ("store/rows.py", "def _peek():\n    from ..locks import liveness  # noqa\n", "No circle of imports"),
    ("hooks/builtin.py", "def _peek():\n    from ..handoff import writer  # noqa\n",
     "Only the composition root and commands/handoff.py import handoff/"),
    ("commands/status.py", "def _peek():\n    from ..handoff import packet  # noqa\n",
     "Only the composition root and commands/handoff.py import handoff/"),
    # the audit log's mask is its own (redaction_core.py): no import of it runs back up, none is ignored
    ("audit.py", "def _peek():\n    from .handoff import redaction  # noqa\n", "No circle of imports"),
    ("seams/compression.py", "def _peek():\n    from .legacy import search  # noqa\n",
     "Nothing but the seam table imports seams/legacy/"),
    ("maintenance/lineage.py", "def _peek():\n    from ..seams.legacy import in_place_compaction  # noqa\n",
     "Nothing but the seam table imports seams/legacy/"),
    ("seams/legacy/search.py", "def _peek():\n    import wrapt  # noqa\n", "seams/legacy/ imports neither"),
]


@pytest.mark.parametrize(("module", "code", "contract"), WRONG, ids=[w[0] for w in WRONG])
def test_a_wrong_import_breaks_its_contract(copy: Path, module: str, code: str, contract: str) -> None:
    assert lint(copy).returncode == 0  # the untouched copy passes
    target = copy / PACKAGE / module
    target.write_text(target.read_text(encoding="utf-8") + "\n\n" + code, encoding="utf-8")
    done = lint(copy)
    assert done.returncode != 0, done.stdout
    flat = " ".join(done.stdout.split())
    assert "0 broken" not in flat, done.stdout
    named = flat.split("Broken contracts", 1)[-1]
    assert contract in named, done.stdout


def test_the_plugin_entry_point_imports_no_command() -> None:
    """``register()`` reaches the commands through the dispatcher (``commands.cli``) only."""
    import ast

    tree = ast.parse((ROOT / PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            base = node.module or ""
            imported |= {f"{base}.{a.name}".strip(".") if not base else base for a in node.names}
    commands = {m for m in imported if m == "commands" or m.startswith("commands.")}
    assert commands == {"commands.cli"}
