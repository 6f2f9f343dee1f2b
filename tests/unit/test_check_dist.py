"""scripts/check_dist.py's inspection of a built wheel: what it accepts and what it flags."""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scripts_check_dist", ROOT / "scripts" / "check_dist.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


dist = _load()
DIST_INFO = "hermes_session_guard-0.1.0.dist-info"
METADATA = """Metadata-Version: 2.4
Name: hermes-session-guard
Version: 0.1.0
License-Expression: MIT
License-File: LICENSE
Classifier: Typing :: Typed
Project-URL: Hermes Agent, https://pypi.org/project/hermes-agent/
Provides-Extra: hermes
Requires-Dist: hermes-agent<0.20,>=0.13; extra == "hermes"
Description-Content-Type: text/markdown

# hermes-session-guard
"""


def _wheel(path: Path, extra: dict[str, str] | None = None, metadata: str = METADATA, drop: str = "") -> Path:
    files = {name: "" for name in dist.expected_modules() | dist.PACKAGE_DATA}
    files |= {f"{DIST_INFO}/{n}": "" for n in dist.DIST_INFO_FILES}
    files[f"{DIST_INFO}/METADATA"] = metadata
    files |= extra or {}
    files.pop(drop, None)
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def _failed(wheel: Path) -> list[str]:
    checks = dist.Checks()
    dist.check_wheel(checks, wheel)
    return checks.failed


def test_a_wheel_with_the_package_and_its_data_passes(tmp_path: Path) -> None:
    assert _failed(_wheel(tmp_path / "w.whl")) == []


def test_the_recall_fixture_and_py_typed_are_required_package_data() -> None:
    assert {"hermes_session_guard/py.typed",
            "hermes_session_guard/selftest/data/recall_conversation.json"} <= dist.PACKAGE_DATA
    assert (ROOT / "hermes_session_guard" / "selftest" / "data" / "recall_conversation.json").is_file()


@pytest.mark.parametrize("extra", ["tests/__init__.py", "fixtures/recall_conversation.json", "scripts/matrix.py"])
def test_anything_outside_the_package_is_flagged(tmp_path: Path, extra: str) -> None:
    assert _failed(_wheel(tmp_path / "w.whl", {extra: ""})) == [
        "wheel holds only the package, py.typed, package data, LICENSE and metadata"]


def test_missing_package_data_is_flagged(tmp_path: Path) -> None:
    failed = _failed(_wheel(tmp_path / "w.whl", drop="hermes_session_guard/selftest/data/recall_conversation.json"))
    assert failed == ["wheel holds every module of the package, py.typed, the recall fixture and LICENSE"]


def test_the_legacy_license_field_and_a_plain_hermes_dependency_are_flagged(tmp_path: Path) -> None:
    legacy = METADATA.replace("License-Expression: MIT", "License: MIT").replace('; extra == "hermes"', "")
    assert set(_failed(_wheel(tmp_path / "w.whl", metadata=legacy))) == {
        "license metadata is an SPDX expression with its file",
        "Hermes is an optional extra, never a plain dependency"}


@pytest.mark.parametrize("line", [
    "SetuptoolsDeprecationWarning: `project.license` as a TOML table is deprecated",
    "!! ********** License classifiers are deprecated. **********",
])
def test_deprecation_lines_in_the_build_output_are_caught(line: str) -> None:
    assert dist.BAD_BUILD_OUTPUT.search(line)
    assert not dist.BAD_BUILD_OUTPUT.search("Successfully built hermes_session_guard-0.1.0.tar.gz")
