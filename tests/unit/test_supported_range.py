"""The supported Hermes range is declared once as a pyproject extra and matches the seam table."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.commands import selftest
from hermes_session_guard.hostinfo import FOUND_BY_MODULE, HostRelease, parse_version
from hermes_session_guard.seams import supported
from hermes_session_guard.seams import table as seams

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_declares_the_range_as_an_optional_extra_not_a_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = f"hermes-agent>={supported.SUPPORTED_LOW},<{supported.SUPPORTED_HIGH}"
    assert project["optional-dependencies"]["hermes"] == [declared]
    assert not any(dep.startswith("hermes-agent") for dep in project.get("dependencies", []))


def test_the_declared_range_is_what_the_seam_table_covers() -> None:
    assert parse_version(supported.SUPPORTED_LOW) == parse_version(seams.COVERED[0][0])
    assert parse_version(supported.SUPPORTED_HIGH) == parse_version(seams.COVERED[-1][1])
    assert all(supported.in_supported_range(release) for release in seams.TESTED_RELEASES)


@pytest.mark.parametrize(("version", "expected"), [
    ("0.19.0", "installed 0.19.0 is inside it"),
    ("0.13.0", "installed 0.13.0 is inside it"),
    ("0.22.2.post1", "installed 0.22.2.post1 is inside it"),
    ("0.23.0", "installed 0.23.0 is OUTSIDE it (newer than the table"),
    ("0.12.9", "installed 0.12.9 is OUTSIDE it (older than the table"),
    (None, "none installed"),
])
def test_describe_compares_the_installed_release(version: str | None, expected: str) -> None:
    line = supported.describe(version)
    assert line.startswith("Supported Hermes >=0.13,<0.23 (hermes-session-guard[hermes]): ")
    assert expected in line


def test_selftest_prints_the_comparison(mocker: Any, capsys: pytest.CaptureFixture[str]) -> None:
    mocker.patch.object(selftest, "find_host", return_value=HostRelease("0.23.0", FOUND_BY_MODULE, "/site-packages",
                                                                         "hermes-agent-fork"))
    mocker.patch.object(selftest, "run_probe", return_value={
        "ok": False, "host_in_table": False, "compat_note": "n", "seams": [], "checks": []})
    selftest.run(argparse.Namespace(json=False, timeout=5.0))
    out = capsys.readouterr().out
    # a repackaged Hermes (found by module): the extra would install hermes-agent over it
    assert ("Supported Hermes >=0.13,<0.23 (install hermes-session-guard alone, not hermes-session-guard[hermes], "
            "which would install hermes-agent over hermes-agent-fork): installed 0.23.0 is OUTSIDE it") in out
    assert ("found by hermes_cli.__version__ 0.23.0, installed as distribution hermes-agent-fork "
            "(no hermes-agent distribution)") in out
    selftest.run(argparse.Namespace(json=True, timeout=5.0))
    assert '"supported_hermes": ">=0.13,<0.23"' in capsys.readouterr().out
