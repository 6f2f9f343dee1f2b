"""sessions.json is rewritten through the shared atomic-write helper, as before: the
gateway's JSON layout, mode 0600, the old file intact when the write fails."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import files, host
from hermes_session_guard.host import statedb

ROUTING = {"agent:main:telegram:dm:1": {"session_id": "20260101_000000_abcdef", "origin": None}, "_meta": 1}
posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")


def _routing_path(tmp_path: Path) -> Path:
    path = tmp_path / host.ROUTING_FILE
    path.parent.mkdir(parents=True)
    return path


def test_routing_file_goes_through_the_shared_helper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Path, int]] = []
    real = files.atomic_write_text

    def spy(path: Path, text: str, *, mode: int | None = None, home: Path | None = None) -> None:
        calls.append((path, mode))
        real(path, text, mode=mode, home=home)

    monkeypatch.setattr(statedb, "atomic_write_text", spy)
    path = _routing_path(tmp_path)
    host.write_routing_file(path, ROUTING)
    assert calls == [(path, None)]  # the file's own mode kept
    assert path.read_text(encoding="utf-8") == json.dumps(ROUTING, indent=2)
    assert host.read_routing_file(tmp_path) == (path, ROUTING)


@posix_only
def test_routing_file_keeps_its_mode_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = _routing_path(tmp_path)
    path.write_text("{}", encoding="utf-8")
    path.chmod(0o644)  # the gateway's file: its mode is the gateway's business
    host.write_routing_file(path, ROUTING)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in path.parent.iterdir()) == ["sessions.json"]


def test_a_failed_rewrite_keeps_the_old_routing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _routing_path(tmp_path)
    path.write_text('{"old": {}}', encoding="utf-8")

    def refuse(*_args: Any, **_dir_fds: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        host.write_routing_file(path, ROUTING)
    assert path.read_text(encoding="utf-8") == '{"old": {}}'
    assert sorted(p.name for p in path.parent.iterdir()) == ["sessions.json"]


@posix_only
def test_atomic_write_fsyncs_the_file_and_its_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[bool] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    files.atomic_write_text(tmp_path / "f.json", "{}\n", mode=0o640)
    assert synced == [False, True]  # the file's data, then the rename in its directory
    assert (tmp_path / "f.json").read_text(encoding="utf-8") == "{}\n"
    assert stat.S_IMODE((tmp_path / "f.json").stat().st_mode) == 0o640
