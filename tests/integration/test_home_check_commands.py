"""Every command, run as its own process with the real Hermes installed, against bad homes
made from a real Hermes state.db (the corrupted fixture the installed release made):
one ``error:`` line, exit status 2, every byte and directory entry unchanged, no Hermes
malformed-database recovery (``state.db.malformed-backup-*``); a read-only home serves the
read-only commands; ``export`` and ``handoff`` given bad arguments (an output path that
cannot be written, an empty or non-UTF-8 id or note) the same way; ``selftest`` with no
Hermes home and with the guard not enabled; ``enable``/``disable`` as Hermes's own plugin
discovery sees them."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import HERMES_VERSION, HOST_NATIVE_MODE
from .test_operator_commands import HOST_FIXTURES, _manifest, materialize

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = [["doctor"], ["status"], ["repair"], ["repair", "--apply"], ["snapshots", "S"], ["handoff", "S"],
            ["export", "S"], ["selftest"], ["enable"], ["disable"]]
READ_ONLY_COMMANDS = [["doctor"], ["status"], ["snapshots", "S"], ["repair"]]
WRITING_COMMANDS = [["repair", "--apply"], ["handoff", "S"], ["export", "S"], ["enable"], ["disable"]]

requires_fixture = pytest.mark.skipif(not HOST_FIXTURES, reason=f"no fixture made by Hermes {HERMES_VERSION}")


def run_cli(argv: list[str], home: Path | None, *, read_only_mount: bool = False,
            extra_env: dict[str, str] | None = None, timeout: float = 25) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    env.pop("HERMES_SESSION_ID", None)
    if home is None:
        env.pop("HERMES_HOME", None)
    else:
        env["HERMES_HOME"] = str(home)
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "hermes_session_guard.commands.cli", *argv]
    if read_only_mount:
        # root writes through file modes: the home is bind-mounted read-only in a private mount namespace
        assert home is not None
        script = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"'
        cmd = ["unshare", "--mount", "sh", "-c", script, str(home), *cmd]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))


def listing(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links not followed) with the hash of its bytes and its mode."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            if p.is_symlink():
                out[str(p.relative_to(root))] = "link:" + os.readlink(p)
            elif p.is_file():
                out[str(p.relative_to(root))] = f"{st.st_mode:o}:" + hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[str(p.relative_to(root))] = f"{st.st_mode:o}:dir"
    return out


def _real_home(tmp_path: Path) -> Path:
    return materialize(HOST_FIXTURES[0], tmp_path / "home")


def _random(home: Path) -> None:
    (home / "state.db").write_bytes(random.Random(17).randbytes(32768))


def _truncated(home: Path) -> None:
    data = (home / "state.db").read_bytes()
    (home / "state.db").write_bytes(data[: len(data) // 2])


def _zero_byte(home: Path) -> None:
    (home / "state.db").write_bytes(b"")


def _directory(home: Path) -> None:
    (home / "state.db").unlink()
    (home / "state.db").mkdir()


def _symlinked(home: Path) -> None:
    target = home / "sessions" / "real.db"
    (home / "state.db").rename(target)
    (home / "state.db").symlink_to(target)


def _foreign(home: Path) -> None:
    (home / "state.db").unlink()
    conn = sqlite3.connect(str(home / "state.db"))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.execute("INSERT INTO notes(body) VALUES ('mine')")
    conn.commit()
    conn.close()


def _config_not_utf8(home: Path) -> None:
    (home / "config.yaml").write_bytes((home / "config.yaml").read_bytes() + b"# caf\xe9 latin-1\n")


BAD_HOMES: dict[str, tuple[Callable[[Path], None], str]] = {
    "random": (_random, "not an SQLite database"),
    "truncated": (_truncated, "truncated"),
    "zero-byte": (_zero_byte, "not an SQLite database"),
    "directory": (_directory, "is not a file"),
    "symlinked": (_symlinked, "is a symbolic link"),
    "foreign-sqlite": (_foreign, "not a Hermes state.db"),
    "config-not-utf8": (_config_not_utf8, "is not UTF-8 text"),
}


def _no_malformed_backup(home: Path) -> None:
    assert not [p for p in home.rglob("*") if "malformed" in p.name], sorted(os.listdir(home))


@requires_fixture
@pytest.mark.parametrize("bad", list(BAD_HOMES))
def test_every_command_refuses_a_bad_home_the_same_way(bad: str, tmp_path: Path) -> None:
    home = _real_home(tmp_path)
    make, reason = BAD_HOMES[bad]
    make(home)
    before = listing(home)
    messages = set()
    for argv in COMMANDS:
        proc = run_cli(argv, home)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr[-2000:])
        assert proc.stdout == "" and len(lines) == 1 and lines[0].startswith("error: "), (argv, proc.stderr)
        assert reason in lines[0], (argv, lines[0])
        assert listing(home) == before, f"{argv} changed the home"
        _no_malformed_backup(home)
        messages.add(lines[0])
    assert len(messages) == 1, messages
    if bad == "foreign-sqlite":
        conn = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True)
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["notes"]
        conn.close()


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[Path]:
    """A real Hermes home while another process holds a write transaction on its state.db."""
    home = _real_home(tmp_path)
    code = ("import sqlite3, sys\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN IMMEDIATE')\n"
            "c.execute(\"UPDATE sessions SET title = 'held' WHERE id = (SELECT id FROM sessions LIMIT 1)\")\n"
            "print('HELD', flush=True)\n"
            "sys.stdin.readline()\n"
            "c.execute('ROLLBACK')\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(home / "state.db")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "HELD"
        yield home
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=30)


@requires_fixture
def test_a_writer_holding_a_transaction_blocks_only_the_writing_commands(writer: Path) -> None:
    home = writer
    sid = next(iter(_manifest(HOST_FIXTURES[0])["lineages"]))
    for argv in READ_ONLY_COMMANDS:
        proc = run_cli([str(sid) if a == "S" else a for a in argv], home)  # snapshots of a session it has
        assert proc.returncode in (0, 1) and "error" not in proc.stderr, (argv, proc.stderr[-2000:])
    before = listing(home)
    for argv in (["handoff", str(sid)], ["repair", "--apply"]):
        proc = run_cli(argv, home)  # the subprocess timeout (25 s) is below SQLite's 30 s busy wait
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (argv, proc.stderr)
        assert "locked" in lines[0] or "busy" in lines[0], lines[0]
        assert listing(home) == before
    _no_malformed_backup(home)


def _can_mount_read_only() -> bool:
    if shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        script = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && ! touch "$0/x" 2>/dev/null'
        proc = subprocess.run(["unshare", "--mount", "sh", "-c", script, tmp], capture_output=True, timeout=30)
        return proc.returncode == 0


@pytest.fixture
def read_only_home(tmp_path: Path) -> Iterator[tuple[Path, bool]]:
    """A real Hermes home (WAL database, no -wal file) in a directory the commands may not write:
    file modes for a normal user; for root (who writes through modes) a read-only bind mount."""
    mount = os.geteuid() == 0
    if mount and not _can_mount_read_only():
        pytest.skip("running as root without a way to mount the home read-only")
    home = materialize(HOST_FIXTURES[0], tmp_path / "home")
    header = (home / "state.db").read_bytes()[:20]
    # WAL as Hermes writes it; Hermes 0.20+ keeps journal_mode=DELETE on SQLite builds with the
    # WAL-reset bug (hermes_state: before 3.51.3 / 3.50.7 / 3.44.6), so its fixture may be a rollback journal
    assert header[18] == 2 or header[18] == 1 and HOST_NATIVE_MODE, "the fixture database is not in WAL mode"
    for p in [home, *home.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        yield home, mount
    finally:
        for p in [home, *home.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)


@requires_fixture
def test_read_only_home_serves_the_read_only_commands(read_only_home: tuple[Path, bool]) -> None:
    home, mount = read_only_home
    before = listing(home)
    env = {"HOME": str(home.parent)}
    proc = run_cli(["doctor"], home, read_only_mount=mount, extra_env=env)
    planted = _manifest(HOST_FIXTURES[0])["planted"]
    assert proc.returncode == (1 if planted else 0), proc.stderr[-2000:]
    assert "doctor:" in proc.stdout and proc.stderr == ""
    sid = str(next(iter(_manifest(HOST_FIXTURES[0])["lineages"])))
    for argv in (["status"], ["snapshots", sid], ["repair"]):
        proc = run_cli(argv, home, read_only_mount=mount, extra_env=env)
        assert proc.returncode == 0 and proc.stderr == "", (argv, proc.stderr[-2000:])
    for argv in WRITING_COMMANDS:
        proc = run_cli(argv, home, read_only_mount=mount, extra_env=env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "read-only" in lines[0], (argv, proc.stderr)
    assert listing(home) == before


@requires_fixture
def test_a_good_home_still_works_for_every_command(tmp_path: Path) -> None:
    """The check lets a real home through: handoff writes its packet through Hermes's SessionDB."""
    home = _real_home(tmp_path)
    manifest = _manifest(HOST_FIXTURES[0])
    sid = next(iter(manifest["lineages"]))
    assert run_cli(["doctor"], home).returncode == (1 if manifest["planted"] else 0)
    assert run_cli(["status"], home).returncode == 0
    proc = run_cli(["handoff", sid], home)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert Path(proc.stdout.strip()).is_file()
    _no_malformed_backup(home)


def test_selftest_on_a_machine_where_hermes_never_ran(tmp_path: Path) -> None:
    user_home = tmp_path / "user"
    user_home.mkdir()
    proc = run_cli(["selftest"], None, extra_env={"HOME": str(user_home)}, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"Your Hermes home: none (no Hermes home at {user_home / '.hermes'}" in proc.stdout
    assert "selftest: PASSED (live probe only" in proc.stdout
    assert not (user_home / ".hermes").exists()


def test_selftest_on_a_home_where_the_guard_is_not_enabled(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("# my Hermes\nmodel:\n  default: x\n", encoding="utf-8")
    proc = run_cli(["selftest"], home, timeout=240)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert f"HERMES_HOME {home}: NOT PROTECTED" in proc.stdout
    assert "[PASS] agent.session_id unchanged" in proc.stdout  # the live probe still ran
    assert "selftest: FAILED: the live probe passed, but" in proc.stdout and "NOT protected" in proc.stdout


COMMENTED_CONFIG = """\
# my Hermes home
model:
  default: fake-model   # a comment that must survive
  provider: custom
plugins:
  # what I trust
  enabled: []
"""


def _guard_loaded(home: Path) -> bool:
    script = ("from hermes_cli import plugins\n"
              "plugins.discover_plugins()\n"
              "import hermes_session_guard as g\n"
              "print('LOADED', g.current_runtime() is not None)\n")
    env = dict(os.environ, HERMES_HOME=str(home), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("LOADED "))
    return line == "LOADED True"


def test_enable_and_disable_as_hermes_sees_them(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(COMMENTED_CONFIG, encoding="utf-8")
    (home / "config.yaml").chmod(0o640)
    assert not _guard_loaded(home)
    proc = run_cli(["enable"], home)
    assert proc.returncode == 0 and "session-guard enabled in" in proc.stdout, proc.stderr
    text = (home / "config.yaml").read_text(encoding="utf-8")
    assert "# a comment that must survive" in text and "# what I trust" in text and "# my Hermes home" in text
    assert (home / "config.yaml").stat().st_mode & 0o777 == 0o640
    backups = list(home.glob("config.yaml.session-guard-backup-*"))
    assert len(backups) == 1 and backups[0].read_text(encoding="utf-8") == COMMENTED_CONFIG
    assert _guard_loaded(home)
    proc = run_cli(["disable"], home)
    assert proc.returncode == 0 and "session-guard disabled in" in proc.stdout, proc.stderr
    assert "# a comment that must survive" in (home / "config.yaml").read_text(encoding="utf-8")
    assert not _guard_loaded(home)
    (home / "config.yaml").write_text("plugins: [unclosed\n", encoding="utf-8")
    before = listing(home)
    proc = run_cli(["enable"], home)
    assert proc.returncode == 2 and "not valid YAML" in proc.stderr and listing(home) == before


def _export_bad_input(tmp: Path, sid: str) -> dict[str, tuple[list[str], str]]:
    (tmp / "a-directory").mkdir()
    (tmp / "elsewhere.json").write_text("mine\n", encoding="utf-8")
    (tmp / "link.json").symlink_to(tmp / "elsewhere.json")
    return {
        "missing-directory": (["export", sid, "-o", str(tmp / "nope" / "out.json")], "does not exist"),
        "directory": (["export", sid, "-o", str(tmp / "a-directory")], "is a directory"),
        "dev-full": (["export", sid, "-o", "/dev/full"], "not a regular file"),
        "symlink": (["export", sid, "-o", str(tmp / "link.json")], "symbolic link"),
        "empty-id": (["export", ""], "empty"),
        "blank-id": (["export", "  "], "empty"),
        "non-utf8-id": (["export", sid[:4] + "\udcff"], "UTF-8"),
        "handoff-non-utf8-note": (["handoff", sid, "--note", "caf\udce9 note"], "UTF-8"),
        "handoff-non-utf8-id": (["handoff", sid[:4] + "\udcff"], "UTF-8"),
        "handoff-empty-id": (["handoff", ""], "empty"),
    }


@requires_fixture
@pytest.mark.parametrize("case", [
    "missing-directory", "directory", "dev-full", "symlink", "empty-id", "blank-id", "non-utf8-id",
    "handoff-non-utf8-note", "handoff-non-utf8-id", "handoff-empty-id"])
def test_export_and_handoff_refuse_bad_arguments_with_one_line(case: str, tmp_path: Path) -> None:
    home = _real_home(tmp_path)
    sid = next(iter(_manifest(HOST_FIXTURES[0])["lineages"]))
    outside = tmp_path / "outside"
    outside.mkdir()
    argv, reason = _export_bad_input(outside, sid)[case]
    before, before_outside = listing(home), listing(outside)
    proc = run_cli(argv, home)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (argv, proc.stdout, proc.stderr[-2000:])
    assert proc.stdout == "" and len(lines) == 1 and lines[0].startswith("error: "), (argv, proc.stderr)
    assert reason in lines[0], lines[0]
    assert listing(home) == before and listing(outside) == before_outside
    _no_malformed_backup(home)


@requires_fixture
def test_export_refuses_an_existing_file_and_writes_a_new_one_private(tmp_path: Path) -> None:
    home = _real_home(tmp_path)
    sid = next(iter(_manifest(HOST_FIXTURES[0])["lineages"]))
    out = tmp_path / "export.json"
    out.write_text("old\n", encoding="utf-8")
    out.chmod(0o644)
    proc = run_cli(["export", sid, "-o", str(out)], home)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "exists" in proc.stderr, proc.stderr
    assert out.read_text(encoding="utf-8") == "old\n" and (out.stat().st_mode & 0o777) == 0o644
    out.unlink()
    proc = run_cli(["export", sid, "-o", str(out)], home)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out.stat().st_mode & 0o777) == 0o600
    import json

    assert json.loads(out.read_text(encoding="utf-8"))["id"] == sid
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".export")) == []  # no temporary left
    proc = run_cli(["export", sid], home)  # standard output
    assert proc.returncode == 0 and json.loads(proc.stdout)["id"] == sid
