"""files.atomic_write_text: same-directory temp file, fsync, os.replace, directory fsync."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hermes_session_guard import files
from hermes_session_guard.files import atomic_write_text


def test_writes_the_text_with_the_mode_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "config.yaml"
    target.write_text("old\n")
    atomic_write_text(target, "new\r\nline ü\n", mode=0o640)
    assert target.read_bytes() == "new\r\nline ü\n".encode()
    if os.name != "nt":
        assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_a_new_file_is_private_by_default(tmp_path: Path) -> None:
    target = tmp_path / "fresh.json"
    atomic_write_text(target, "{}")
    assert target.read_text() == "{}"
    if os.name != "nt":
        assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_the_file_and_its_directory_are_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(files.os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    atomic_write_text(tmp_path / "a.txt", "x")
    assert len(synced) == (1 if os.name == "nt" else 2)


def test_a_failed_replace_keeps_the_old_file_and_removes_the_temp(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "config.yaml"
    target.write_text("old\n")

    def refuse(src: str, dst: Path, **_dir_fds: int) -> None:
        raise OSError(13, "refused")

    monkeypatch.setattr(files.os, "replace", refuse)
    with pytest.raises(OSError):
        atomic_write_text(target, "new\n")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
