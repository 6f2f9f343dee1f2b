"""Every command goes through the one home check: a bad home gives one ``error:`` line,
exit status 2 and leaves every file as it was; a fresh home (config.yaml, no state.db) is
not an error; reading a WAL database creates no file next to it."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.commands import cli, selftest
from hermes_session_guard.maintenance import state_inspection
from hermes_session_guard.maintenance.state_inspection import HomeError, check

from .hermes_like_db import HermesLikeHome, rotated_home

ALL_COMMANDS = [["doctor"], ["status"], ["repair"], ["repair", "--apply"], ["snapshots", "r"],
                ["snapshots", "r", "--show", "r.snapshot.1"], ["handoff", "r"], ["selftest"], ["enable"],
                ["disable"]]


def listing(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links not followed) with the hash of its bytes."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


@pytest.fixture(autouse=True)
def no_live_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(timeout: float) -> dict[str, Any]:
        raise AssertionError("selftest ran the live probe on a home that failed the home check")

    monkeypatch.setattr(selftest, "run_probe", refuse)
    monkeypatch.setattr(state_inspection, "BUSY_TIMEOUT_SECONDS", 0.2)


@pytest.fixture
def good_home(tmp_path: Path) -> Path:
    h, _ = rotated_home(tmp_path / "home")
    h.close()
    return h.home


def refused_by_every_command(home: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> list[str]:
    monkeypatch.setenv("HERMES_HOME", str(home))
    before = listing(home)
    messages = []
    for argv in ALL_COMMANDS:
        assert cli.main(argv) == 2, argv
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert out == "" and len(lines) == 1 and lines[0].startswith("error: "), (argv, out, err)
        assert listing(home) == before, f"{argv} changed {home}"
        messages.append(lines[0])
    assert len(set(messages)) == 1, messages  # one check, one sentence, whichever command
    return messages


def test_zero_byte_state_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("plugins:\n  enabled: [session-guard]\n", encoding="utf-8")
    (home / "state.db").write_bytes(b"")
    (msg, *_) = refused_by_every_command(home, monkeypatch, capsys)
    assert "not an SQLite database" in msg
    assert (home / "state.db").stat().st_size == 0


def test_random_bytes(good_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (good_home / "state.db").write_bytes(os.urandom(8192))
    (msg, *_) = refused_by_every_command(good_home, monkeypatch, capsys)
    assert "not an SQLite database" in msg


def test_truncated(good_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    data = (good_home / "state.db").read_bytes()
    (good_home / "state.db").write_bytes(data[: len(data) // 2])
    (msg, *_) = refused_by_every_command(good_home, monkeypatch, capsys)
    assert "truncated" in msg


def test_state_db_is_a_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    (home / "state.db").mkdir(parents=True)
    (home / "config.yaml").write_text("model: x\n", encoding="utf-8")
    (msg, *_) = refused_by_every_command(home, monkeypatch, capsys)
    assert "is not a file" in msg


@pytest.mark.parametrize("target", ["valid", "dangling"])
def test_state_db_is_a_symlink(good_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str], target: str) -> None:
    real = tmp_path / "elsewhere.db"
    (good_home / "state.db").rename(real)
    if target == "dangling":
        real.unlink()
    (good_home / "state.db").symlink_to(real)
    (msg, *_) = refused_by_every_command(good_home, monkeypatch, capsys)
    assert "is a symbolic link" in msg


def test_foreign_sqlite_file_gets_no_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    conn = sqlite3.connect(str(home / "state.db"))
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.commit()
    conn.close()
    (msg, *_) = refused_by_every_command(home, monkeypatch, capsys)
    assert "not a Hermes state.db" in msg
    conn = sqlite3.connect(str(home / "state.db"))
    assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["notes"]
    conn.close()


def test_config_that_is_not_utf8(good_home: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    (good_home / "config.yaml").write_bytes(b"model:\n  default: caf\xe9\nplugins:\n  enabled: [session-guard]\n")
    (msg, *_) = refused_by_every_command(good_home, monkeypatch, capsys)
    assert "is not UTF-8 text (byte 0xe9 at offset 21)" in msg


def test_a_writer_holding_a_rollback_journal_database(good_home: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    holder = sqlite3.connect(str(good_home / "state.db"), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        (msg, *_) = refused_by_every_command(good_home, monkeypatch, capsys)
        assert "locked" in msg
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def _wal_home(tmp_path: Path) -> Path:
    h, _ = rotated_home(tmp_path / "home")
    h.conn.execute("PRAGMA journal_mode=WAL")
    h.close()
    assert not (h.home / "state.db-wal").exists()
    return h.home


def test_a_writer_in_a_wal_database_blocks_only_the_writing_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = _wal_home(tmp_path)
    monkeypatch.setenv("HERMES_HOME", str(home))
    holder = sqlite3.connect(str(home / "state.db"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO sessions(id, source, started_at) VALUES ('w', 'cli', 1.0)")
    try:
        for argv in (["doctor"], ["status"], ["snapshots", "r"]):
            assert cli.main(argv) in (0, 1), argv
            capsys.readouterr()
        before = listing(home)
        assert cli.main(["handoff", "r"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "locked by another process that is writing" in err[0]
        assert listing(home) == before
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_reading_a_wal_database_creates_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    home = _wal_home(tmp_path)
    monkeypatch.setenv("HERMES_HOME", str(home))
    before = listing(home)
    assert state_inspection.readonly_uri(home / "state.db").endswith("?immutable=1")
    assert cli.main(["doctor"]) == 1  # the rotated home has findings
    assert cli.main(["status"]) == 0
    assert cli.main(["snapshots", "r"]) == 0
    capsys.readouterr()
    assert listing(home) == before


def test_a_fresh_home_is_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("plugins:\n  enabled: [session-guard]\n", encoding="utf-8")
    monkeypatch.setenv("HERMES_HOME", str(home))
    before = listing(home)
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "doctor: no sessions to check yet" in out and "configuration:" in out  # the config is checked already
    assert cli.main(["status"]) == 0
    assert "status: nothing yet" in capsys.readouterr().out
    assert cli.main(["repair"]) == 0
    assert "nothing to repair" in capsys.readouterr().out
    assert cli.main(["snapshots", "x"]) == 2  # no such session (a fresh home has none)
    assert "no session x" in capsys.readouterr().err
    assert cli.main(["handoff", "x"]) == 1
    assert "no Hermes sessions yet" in capsys.readouterr().err
    assert listing(home) == before


def test_check_accepts_an_empty_home_only_when_asked(tmp_path: Path) -> None:
    with pytest.raises(HomeError, match="no state.db"):
        check(tmp_path)
    assert check(tmp_path, empty_ok=True).has_db is False


def test_check_refuses_a_read_only_home_for_writing(good_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_inspection.os, "access", lambda path, mode: Path(path) != good_home)
    assert check(good_home).has_db
    with pytest.raises(HomeError, match="is read-only; this command writes to it"):
        check(good_home, writes=True)


def test_a_hermes_like_home_passes(tmp_path: Path) -> None:
    h = HermesLikeHome(tmp_path / "h")
    h.close()
    checked = check(tmp_path / "h", writes=True)
    assert checked.has_db and checked.db_path == tmp_path / "h" / "state.db"


def test_a_state_db_with_only_the_guards_tables_is_a_fresh_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Hermes's plugin discovery loads the guard (which creates its tables) before Hermes writes its schema."""
    from hermes_session_guard.store import GuardStore

    (tmp_path / "config.yaml").write_text("plugins:\n  enabled: [session-guard]\n", encoding="utf-8")
    GuardStore(tmp_path / "state.db").close()
    conn = sqlite3.connect(str(tmp_path / "state.db"))
    conn.execute("CREATE TABLE async_delegations (id TEXT PRIMARY KEY)")  # 0.19 makes it when plugins load
    conn.commit()
    conn.close()
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    assert check(tmp_path).has_db is False
    assert cli.main(["doctor"]) == 0 and "no sessions to check yet" in capsys.readouterr().out
    assert cli.main(["status"]) == 0 and "nothing yet" in capsys.readouterr().out
    assert cli.main(["disable"]) == 0
