"""The package imports nothing that Python 3.12, 3.13 or 3.14 removed from the standard
library (upstream Hermes 0.21.3+ declares Python >=3.14, which these machines do not
have), and its classifiers list exactly the Pythons its unit suite runs on
(scripts/matrix.py runs tests/unit on each of them)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hermes_session_guard"

# Modules removed by PEP 594 (3.13), PEP 632 and the 3.12 removals, and 3.14's.
REMOVED_MODULES = {
    "distutils", "imp", "asynchat", "asyncore", "smtpd",  # 3.12
    "aifc", "audioop", "cgi", "cgitb", "chunk", "crypt", "imghdr", "mailcap", "msilib", "nis", "nntplib",
    "ossaudiodev", "pipes", "sndhdr", "spwd", "sunau", "telnetlib", "uu", "xdrlib", "lib2to3",  # 3.13
}
# Names removed from modules that remain (module -> names), 3.12-3.14.
REMOVED_NAMES = {
    "ast": {"Num", "Str", "Bytes", "NameConstant", "Ellipsis"},
    "asyncio": {"get_child_watcher", "set_child_watcher", "AbstractChildWatcher", "SafeChildWatcher",
                "FastChildWatcher", "MultiLoopChildWatcher", "ThreadedChildWatcher", "PidfdChildWatcher"},
    "pkgutil": {"find_loader", "get_loader"},
    "typing": {"io", "re", "ByteString"},
    "unittest": {"makeSuite", "findTestCases", "getTestCaseNames"},
    "urllib.request": {"URLopener", "FancyURLopener"},
    "configparser": {"SafeConfigParser", "readfp"},
    "locale": {"resetlocale"},
    "sqlite3": {"OptimizedUnicode", "enable_shared_cache"},
    "importlib.abc": {"ResourceReader", "Traversable", "TraversableResources"},
    "importlib.resources": {"contents", "is_resource", "open_binary", "open_text", "path", "read_binary",
                            "read_text"},
}


def _imports(tree: ast.AST) -> list[tuple[str, str | None, int]]:
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, None, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.extend((node.module, alias.name, node.lineno) for alias in node.names)
    return found


def _attribute_uses(tree: ast.AST) -> list[tuple[str, str, int]]:
    """``module.name`` written out (``asyncio.get_child_watcher``)."""
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts = [node.attr]
            value = node.value
            while isinstance(value, ast.Attribute):
                parts.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name):
                parts.append(value.id)
                dotted = ".".join(reversed(parts))
                module, _, name = dotted.rpartition(".")
                uses.append((module, name, node.lineno))
    return uses


def test_no_module_or_name_removed_by_python_3_14_is_used() -> None:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        where = path.relative_to(ROOT)
        for module, name, line in _imports(tree):
            if module.split(".")[0] in REMOVED_MODULES:
                problems.append(f"{where}:{line}: import {module}")
            if name is not None and name in REMOVED_NAMES.get(module, set()):
                problems.append(f"{where}:{line}: from {module} import {name}")
        for module, name, line in _attribute_uses(tree):
            if name in REMOVED_NAMES.get(module, set()):
                problems.append(f"{where}:{line}: {module}.{name}")
    assert problems == []


def test_the_check_finds_a_removed_api() -> None:
    tree = ast.parse("import imp\nfrom asyncio import get_child_watcher\nimport ast\nast.Num\n")
    assert [m for m, _, _ in _imports(tree) if m in REMOVED_MODULES] == ["imp"]
    assert ("asyncio", "get_child_watcher") in [(m, n) for m, n, _ in _imports(tree)]
    assert ("ast", "Num") in [(m, n) for m, n, _ in _attribute_uses(tree)]


def test_classifiers_list_the_pythons_the_unit_suite_runs_on() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    versions = sorted(c.rsplit(" :: ", 1)[1] for c in project["classifiers"]
                      if c.startswith("Programming Language :: Python :: 3.") and c.count("::") == 2)
    assert versions == ["3.11", "3.12", "3.13"]
    assert project["requires-python"] == ">=3.11"
