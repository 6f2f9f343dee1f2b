"""The operator commands on a real Hermes home run as root on a service user's home:
what they create belongs to the home's owner, the service user's next command works,
an audit log it cannot write is said once, and a damaged page of state.db is one
line, exit 2 (as doctor, repair and export say it)."""

from __future__ import annotations

import os
import shutil
import site
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .test_home_check_commands import ROOT, listing, run_cli
from .test_operator_commands import HOST_FIXTURES, _manifest, materialize

requires_fixture = pytest.mark.skipif(not HOST_FIXTURES, reason="no fixture made by this Hermes release")
root_only = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
NOBODY = 65534


@pytest.fixture
def service_home() -> Iterator[Path]:
    """A real home owned by nobody, where nobody can reach it (not under root's 0700 pytest directory)."""
    top = Path(tempfile.mkdtemp(prefix="guard-service-home-"))
    top.chmod(0o755)
    home = materialize(HOST_FIXTURES[0], top / "home")
    for dirpath, dirnames, filenames in os.walk(home):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.lchown(name, NOBODY, NOBODY)
    try:
        yield home
    finally:
        shutil.rmtree(top)


def _session(home: Path) -> str:
    return str(next(iter(_manifest(HOST_FIXTURES[0])["lineages"])))


# The venv's interpreter lives under root's home; the service user runs the system's Python of
# the same minor version over the venv's site-packages (skipped where there is none).
SYSTEM_PYTHON = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin:/usr/local/bin")
needs_system_python = pytest.mark.skipif(SYSTEM_PYTHON is None, reason="no system Python the service user can run")


def _as_nobody(argv: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(ROOT), *site.getsitepackages()])
    env = dict(os.environ, PYTHONPATH=path, PYTHONDONTWRITEBYTECODE="1", HERMES_HOME=str(home), HOME=str(home))
    env.pop("HERMES_SESSION_ID", None)
    assert SYSTEM_PYTHON is not None
    return subprocess.run([SYSTEM_PYTHON, "-m", "hermes_session_guard.commands.cli", *argv], env=env,
                          capture_output=True, text=True, timeout=60, cwd="/", user=NOBODY, group=NOBODY,
                          extra_groups=[])


def _not_nobodys(home: Path) -> list[str]:
    """The guard's files and directories in ``home`` that are not the home owner's (Hermes 0.20+
    seeds its own, SOUL.md, cron/, skills/ ..., when its modules are imported: not the guard's)."""
    guards = [home / "handoffs", home / "logs" / "session_guard.jsonl", home / "sessions",
              *home.glob("state.db*"), *(home / "handoffs").rglob("*"), *(home / "sessions").rglob("*")]
    return [str(p) for p in guards if os.path.lexists(p) and (p.lstat().st_uid, p.lstat().st_gid) != (NOBODY, NOBODY)]


@requires_fixture
@root_only
@needs_system_python
def test_root_run_handoff_leaves_the_home_to_its_owner_and_the_owner_can_hand_off_next(
        service_home: Path) -> None:
    sid = _session(service_home)
    proc = run_cli(["handoff", sid], service_home)
    assert proc.returncode == 0, proc.stderr[-2000:]
    packet = Path(proc.stdout.strip())
    assert _not_nobodys(service_home) == []  # handoffs/, the packet, logs/, the audit log, -wal/-shm
    for path, mode in [(packet, 0o600), (packet.parent, 0o700), (service_home / "logs" / "session_guard.jsonl", 0o600)]:
        assert stat.S_IMODE(path.lstat().st_mode) == mode, path
    later = _as_nobody(["handoff", sid], service_home)
    assert later.returncode == 0 and "Traceback" not in later.stderr, later.stderr[-2000:]
    assert Path(later.stdout.strip()).parent == packet.parent


@requires_fixture
@root_only
@needs_system_python
def test_an_audit_log_the_owner_cannot_write_is_said_once(service_home: Path) -> None:
    logs = service_home / "logs"
    logs.mkdir(mode=0o700, exist_ok=True)
    os.chown(logs, 0, 0)  # left root's by an older version
    logs.chmod(0o700)
    proc = _as_nobody(["handoff", _session(service_home)], service_home)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if "audit write failed" in line]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr


@requires_fixture
@root_only
def test_root_run_repair_apply_keeps_sessions_json_and_makes_a_private_backup(service_home: Path) -> None:
    routing = service_home / "sessions" / "sessions.json"
    if routing.exists():
        routing.chmod(0o640)
    (service_home / "state.db").chmod(0o644)
    proc = run_cli(["repair", "--apply"], service_home)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert _not_nobodys(service_home) == []
    if routing.exists():
        assert stat.S_IMODE(routing.lstat().st_mode) == 0o640
    backups = list(service_home.glob("state.db.session-guard-backup-*"))
    assert backups and all(stat.S_IMODE(b.lstat().st_mode) == 0o600 for b in backups)


@requires_fixture
@root_only
def test_repair_apply_refuses_a_linked_sessions_directory(service_home: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(service_home / "sessions", elsewhere)
    shutil.rmtree(service_home / "sessions")
    (service_home / "sessions").symlink_to(elsewhere, target_is_directory=True)
    def files(home: Path) -> dict[str, str]:  # state.db itself holds the repair's own lock row meanwhile
        return {k: v for k, v in listing(home).items()  # the guard's (Hermes 0.20 makes logs/curator/ itself)
                if k.startswith(("handoffs", "logs/session_guard", "sessions", "state.db.session-guard-backup"))}

    before, home_before = listing(elsewhere), files(service_home)
    proc = run_cli(["repair", "--apply"], service_home)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "symbolic link" in lines[0], proc.stderr[-2000:]
    assert listing(elsewhere) == before and files(service_home) == home_before  # no backup, no log, no rewrite


def _damage_messages_page(db: Path) -> None:
    conn = sqlite3.connect(db)
    (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages'").fetchone()
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    with open(db, "r+b") as fh:
        fh.seek((root - 1) * page_size)
        fh.write(b"\x55" * page_size)


@requires_fixture
def test_handoff_on_a_damaged_page_is_one_line_exit_2(tmp_path: Path) -> None:
    home = materialize(HOST_FIXTURES[0], tmp_path / "home")
    _damage_messages_page(home / "state.db")
    sid = _session(home)
    proc = run_cli(["handoff", sid], home)
    # Hermes 0.20 warns about its SQLite build on stderr too: the guard's is the one error line
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "malformed" in lines[0] or "damaged" in lines[0]
    assert not (home / "handoffs").exists() or not any((home / "handoffs").iterdir())
