"""Bad input to doctor, repair and status: one clear message, exit status 2, nothing written."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_session_guard.commands import cli
from hermes_session_guard.maintenance import state_inspection
from hermes_session_guard.maintenance.state_inspection import HomeError, load_home_state

from .hermes_like_db import HermesLikeHome, rotated_home

COMMANDS = [["doctor"], ["status"], ["repair"], ["repair", "--apply"]]


def _files(root: Path) -> dict[str, str]:
    if not root.exists():
        return {}
    if root.is_file():
        return {root.name: hashlib.sha256(root.read_bytes()).hexdigest()}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def good_home(tmp_path: Path) -> Path:
    h, _ = rotated_home(tmp_path / "home")
    h.close()
    return h.home


def _run_all(home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Iterator[str]:
    monkeypatch.setenv("HERMES_HOME", str(home))
    for argv in COMMANDS:
        before = _files(home)
        assert cli.main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        assert _files(home) == before, f"{argv} wrote to {home}"
        assert cli.main([*argv, "--json"]) == 2
        payload = json.loads(capsys.readouterr().out)
        assert payload["ok"] is False and payload["error"] == lines[0][len("error: "):]
        assert _files(home) == before
        yield lines[0]


def test_hermes_home_that_does_not_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    for message in _run_all(tmp_path / "nope", monkeypatch, capsys):
        assert "does not exist" in message and str(tmp_path / "nope") in message
    assert not (tmp_path / "nope").exists()


def test_hermes_home_that_is_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    for message in _run_all(path, monkeypatch, capsys):
        assert "is not a directory" in message


@pytest.mark.parametrize("section, key", [
    ("session_guard:\n  enabled: 'yes'\n", "session_guard.enabled"),
    ("session_guard: [1, 2]\n", "session_guard.(section)"),
])
def test_config_with_wrong_types(good_home: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str], section: str, key: str) -> None:
    (good_home / "config.yaml").write_text(section, encoding="utf-8")
    for message in _run_all(good_home, monkeypatch, capsys):
        assert key in message and "config.yaml" in message


@pytest.mark.parametrize("section, key", [
    ("session_guard:\n  lock:\n    wait_seconds: soon\n", "session_guard.lock.wait_seconds"),
    ("session_guard:\n  buffer:\n    max_messages: 2.5\n", "session_guard.buffer.max_messages"),
    ("session_guard:\n  nope: 1\n", "session_guard.nope"),
])
def test_a_bad_option_passes_the_home_check_on_its_default(good_home: Path, section: str, key: str) -> None:
    """Any option but ``enabled``: the commands run, with the option's default (doctor reports it)."""
    (good_home / "config.yaml").write_text(section, encoding="utf-8")
    checked = state_inspection.check(good_home)
    assert [f.key for f in checked.config.fallbacks] == [key]


def test_config_that_is_not_yaml(good_home: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    (good_home / "config.yaml").write_text("session_guard: [unclosed\n", encoding="utf-8")
    for message in _run_all(good_home, monkeypatch, capsys):
        assert "not valid YAML" in message


def test_missing_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "home").mkdir()
    for message in _run_all(tmp_path / "home", monkeypatch, capsys):
        assert "no state.db" in message
    assert not (tmp_path / "home" / "state.db").exists()


@pytest.mark.parametrize("content", [b"", b"hello, not a database" * 10, b"\x00" * 4096])
def test_a_file_that_is_not_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str], content: bytes) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "state.db").write_bytes(content)
    for message in _run_all(tmp_path / "home", monkeypatch, capsys):
        assert "not an SQLite database" in message


def test_truncated_database(good_home: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    db = good_home / "state.db"
    data = db.read_bytes()
    assert len(data) >= 8192
    db.write_bytes(data[: len(data) // 2])
    for message in _run_all(good_home, monkeypatch, capsys):
        assert "truncated" in message


def test_sqlite_database_that_is_not_hermes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "home").mkdir()
    conn = sqlite3.connect(str(tmp_path / "home" / "state.db"))
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.commit()
    conn.close()
    for message in _run_all(tmp_path / "home", monkeypatch, capsys):
        assert "not a Hermes state.db" in message and "`sessions`" in message


def test_sessions_table_without_the_hermes_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "home").mkdir()
    conn = sqlite3.connect(str(tmp_path / "home" / "state.db"))
    conn.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY)")
    conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    for message in _run_all(tmp_path / "home", monkeypatch, capsys):
        assert "not a Hermes state.db" in message and "parent_session_id" in message


def test_locked_database(good_home: Path, monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(state_inspection, "BUSY_TIMEOUT_SECONDS", 0.1)
    holder = sqlite3.connect(str(good_home / "state.db"), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        for message in _run_all(good_home, monkeypatch, capsys):
            assert "locked" in message
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_routing_file_that_is_not_json(good_home: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    (good_home / "sessions" / "sessions.json").write_text("{not json", encoding="utf-8")
    for message in _run_all(good_home, monkeypatch, capsys):
        assert "routing file" in message


def test_load_home_state_names_the_problem(tmp_path: Path) -> None:
    with pytest.raises(HomeError, match="does not exist"):
        load_home_state(tmp_path / "missing")
    h = HermesLikeHome(tmp_path / "ok")
    h.close()
    assert load_home_state(h.home).sessions == {}
