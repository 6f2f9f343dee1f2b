"""Files the guard creates are 0600 and directories 0700 under a 022 umask; a file it
replaces keeps the replaced file's mode."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_session_guard.file_modes import make_private_dirs
from hermes_session_guard.files import append_bytes, create_file
from hermes_session_guard.seams.legacy.gateway_transcript import rewrite_jsonl
from hermes_session_guard.selftest.probe import write_config
from hermes_session_guard.store import GuardStore

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_created_directories_are_0700_and_existing_ones_untouched(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    make_private_dirs(tmp_path / "a" / "b" / "c")
    assert [_mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o700] * 3
    assert _mode(tmp_path) == 0o755


def test_append_creates_0600_with_its_directory(tmp_path: Path) -> None:
    append_bytes(tmp_path / "logs" / "x.jsonl", b"{}\n", home=tmp_path)
    assert _mode(tmp_path / "logs" / "x.jsonl") == 0o600 and _mode(tmp_path / "logs") == 0o700


def test_exclusive_create_refuses_anything_there_and_never_follows_a_link(tmp_path: Path) -> None:
    create_file(tmp_path / "f", b"", home=tmp_path)
    assert _mode(tmp_path / "f") == 0o600
    with pytest.raises(FileExistsError):
        create_file(tmp_path / "f", b"", home=tmp_path)
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError):
        create_file(tmp_path / "link", b"", home=tmp_path)
    assert not (tmp_path / "nowhere").exists()


def test_a_rewritten_transcript_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text("{}\n", encoding="utf-8")
    os.chmod(path, 0o640)
    rewrite_jsonl(path, ({"role": "user", "content": "hi"},))
    assert _mode(path) == 0o640 and "hi" in path.read_text(encoding="utf-8")
    fresh = tmp_path / "new.jsonl"
    rewrite_jsonl(fresh, ())
    assert _mode(fresh) == 0o600


def test_probe_config_and_a_home_the_store_creates_are_private(tmp_path: Path) -> None:
    write_config(tmp_path / "probe_home", "http://127.0.0.1:1/v1")
    assert _mode(tmp_path / "probe_home") == 0o700 and _mode(tmp_path / "probe_home" / "config.yaml") == 0o600
    store = GuardStore(tmp_path / "new_home" / "state.db")
    try:
        store.list_snapshots("x")
    finally:
        store.close()
    assert _mode(tmp_path / "new_home") == 0o700 and _mode(tmp_path / "new_home" / "state.db") == 0o600
