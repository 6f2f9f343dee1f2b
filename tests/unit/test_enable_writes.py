"""``enable`` / ``disable`` on homes another account can write, and on config files
written by hand: no link followed, owner/group/mode/line endings/indentation kept,
one ``plugins:`` key, no change of another writer lost, bounded backups, nothing
written when the command refuses."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes_session_guard import dashboard_plugin
from hermes_session_guard.commands import cli
from hermes_session_guard.maintenance import plugin_config
from hermes_session_guard.maintenance.plugin_config import edited_text, guard_enabled, set_enabled

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX links, owners and modes")
root_only = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")

CONFIG = "# mine\nmodel:\n  default: x\nplugins:\n  enabled:\n  - other\n"


@pytest.fixture(autouse=True)
def no_settling(monkeypatch: pytest.MonkeyPatch) -> None:
    """config.yaml is not watched after the replace here (tests of that set it themselves)."""
    monkeypatch.setattr(plugin_config, "SETTLE_SECONDS", 0.0)


def tree(root: Path) -> dict[str, tuple[int, bytes | str]]:
    """Every entry under ``root`` (links not followed): mode and bytes (or link target)."""
    out: dict[str, tuple[int, bytes | str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            body: bytes | str = (os.readlink(p) if stat.S_ISLNK(st.st_mode)
                                 else p.read_bytes() if stat.S_ISREG(st.st_mode) else b"")
            out[str(p.relative_to(root))] = (st.st_mode, body)
    return out


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(CONFIG, encoding="utf-8")
    monkeypatch.setenv("HERMES_HOME", str(home))
    yield home


def _enable(*argv: str) -> int:
    return cli.main(["enable", *argv])


# --- links inside the dashboard plugin directory -------------------------------------

@posix_only
@pytest.mark.parametrize("linked", ["dashboard/api.py", "dashboard/manifest.json", "dashboard/dist/index.js"])
def test_a_linked_file_in_the_dashboard_plugin_is_refused_and_its_target_untouched(
        home: Path, tmp_path: Path, linked: str, capsys: pytest.CaptureFixture[str]) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n", encoding="utf-8")
    victim.chmod(0o644)
    root = dashboard_plugin.plugin_dir(home)
    (root / "dashboard" / "dist").mkdir(parents=True)
    for name in ("dashboard/api.py", "dashboard/manifest.json", "dashboard/dist/index.js"):
        if name == linked:
            (root / name).symlink_to(victim)
        else:
            (root / name).write_text("old\n", encoding="utf-8")
    before = tree(home)
    assert _enable() == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "link" in err[0]
    assert victim.read_text(encoding="utf-8") == "precious\n" and stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert tree(home) == before  # config.yaml unchanged too: nothing written on refusal


@posix_only
def test_a_linked_directory_in_the_dashboard_plugin_receives_nothing(
        home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = dashboard_plugin.plugin_dir(home)
    (root / "dashboard").mkdir(parents=True)
    (root / "dashboard" / "dist").symlink_to(elsewhere)
    before = tree(home)
    assert _enable() == 2
    assert "link" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == [] and tree(home) == before


@posix_only
def test_a_linked_plugin_directory_itself_is_refused(home: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (home / "plugins").mkdir()
    dashboard_plugin.plugin_dir(home).symlink_to(elsewhere)
    before = tree(home)
    assert _enable() == 2
    assert "link" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == [] and tree(home) == before


@posix_only
def test_the_dashboard_plugin_is_private(home: Path) -> None:
    old = os.umask(0o022)
    try:
        assert _enable() == 0
    finally:
        os.umask(old)
    root = dashboard_plugin.plugin_dir(home)
    for dirpath, _dirnames, filenames in os.walk(root):
        assert stat.S_IMODE(os.lstat(dirpath).st_mode) == 0o700
        for name in filenames:
            assert stat.S_IMODE(os.lstat(Path(dirpath) / name).st_mode) == 0o600
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == [
        "dashboard", "dashboard/api.py", "dashboard/dist", "dashboard/dist/index.js", "dashboard/manifest.json"]
    assert sorted(p.name for p in (home / "plugins").iterdir()) == [dashboard_plugin.DIR_NAME]  # no leftovers


# --- owner, group, mode ------------------------------------------------------------------

@root_only
def test_config_and_plugin_keep_the_home_owner_when_root_runs_enable(home: Path) -> None:
    cfg = home / "config.yaml"
    os.chown(home, 12345, 23456)  # a service user's home: what the guard creates in it is that user's
    os.chown(cfg, 12345, 23456)
    cfg.chmod(0o600)
    (home / "plugins").mkdir()
    os.chown(home / "plugins", 12345, 23456)
    assert _enable() == 0
    st = cfg.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (12345, 23456, 0o600)
    assert guard_enabled(home)[0]
    for p in [dashboard_plugin.plugin_dir(home), *dashboard_plugin.plugin_dir(home).rglob("*")]:
        assert (p.lstat().st_uid, p.lstat().st_gid) == (12345, 23456), p
    for backup in home.glob("config.yaml.session-guard-backup-*"):
        bst = backup.lstat()
        assert (bst.st_uid, bst.st_gid, stat.S_IMODE(bst.st_mode)) == (12345, 23456, 0o600)
    assert cli.main(["disable"]) == 0
    st = cfg.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (12345, 23456, 0o600)


@posix_only
def test_a_group_readable_config_keeps_its_mode_and_the_backup_is_private(home: Path) -> None:
    cfg = home / "config.yaml"
    cfg.chmod(0o640)
    change = set_enabled(home, True)
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o640
    assert change.backup is not None and stat.S_IMODE(change.backup.stat().st_mode) == 0o600


# --- the text: one plugins key, BOM, spellings, CRLF, indentation ----------------------------

@pytest.mark.parametrize("original", [
    "\ufeffplugins:\n  enabled:\n  - other\nmodel: x\n",
    '"plugins":\n  enabled:\n  - other\nmodel: x\n',
    "'plugins':\n  enabled: [other]\nmodel: x\n",
    "? plugins\n: enabled:\n  - other\nmodel: x\n",
    "model: x\n\"plugins\": {enabled: [other]}\n",
])
def test_one_plugins_key_whatever_its_spelling(original: str) -> None:
    path = Path("config.yaml")
    on = edited_text(original, True, path)
    assert on is not None
    assert on.startswith("\ufeff") == original.startswith("\ufeff")
    from ruamel.yaml import YAML

    YAML(typ="rt").load(on)  # a duplicate key raises here
    data = yaml.safe_load(on)
    assert data == {"model": "x", "plugins": {"enabled": ["other", "session-guard"], "disabled": []}}
    off = edited_text(on, False, path)
    assert off is not None
    YAML(typ="rt").load(off)
    assert yaml.safe_load(off)["plugins"] == {"enabled": ["other"], "disabled": ["session-guard"]}
    assert "model: x" in off


def test_crlf_line_endings_are_kept() -> None:
    original = "# mine\r\nmodel:\r\n  default: x\r\nplugins:\r\n  enabled:\r\n  - other\r\nz: 1\r\n"
    for enable in (True, False):
        text = edited_text(original, enable, Path("config.yaml"))
        assert text is not None
        assert "\n" not in text.replace("\r\n", ""), repr(text)
        assert text.startswith("# mine\r\nmodel:\r\n  default: x\r\n") and text.endswith("z: 1\r\n")
    fresh = edited_text("model: x\r\n", True, Path("config.yaml"))
    assert fresh is not None and "\n" not in fresh.replace("\r\n", "")


@pytest.mark.parametrize("block, item", [
    ("plugins:\n    enabled:\n        - other\n", "        - session-guard\n"),
    ("plugins:\n    enabled:\n    - other\n", "    - session-guard\n"),
    ("plugins:\n  enabled:\n    - other\n", "    - session-guard\n"),
])
def test_the_plugins_block_keeps_its_indentation(block: str, item: str) -> None:
    original = "model:\n  default: x\n" + block + "z: 1\n"
    text = edited_text(original, True, Path("config.yaml"))
    assert text is not None and item in text, text
    assert text.replace(item, "") .startswith("model:\n  default: x\n" + block.rstrip("\n").rsplit("\n", 1)[0])


def test_a_duplicate_plugins_key_is_refused() -> None:
    with pytest.raises(plugin_config.PluginConfigError, match="duplicate|more than once"):
        edited_text("plugins:\n  enabled: []\nplugins:\n  enabled: [a]\n", True, Path("config.yaml"))


# --- another writer -------------------------------------------------------------------------

def test_a_change_written_after_enable_read_the_file_is_not_lost(home: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``hermes plugins enable X`` does when it writes between enable's read and its replace."""
    real = plugin_config.edited_text
    done: list[bool] = []

    def concurrent(text: str, enable: bool, path: Path) -> Any:
        out = real(text, enable, path)
        if not done:
            done.append(True)
            data = yaml.safe_load((home / "config.yaml").read_text(encoding="utf-8"))
            data["plugins"]["enabled"].append("another")
            (home / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return out

    monkeypatch.setattr(plugin_config, "edited_text", concurrent)
    change = set_enabled(home, True)
    assert change.changed and done
    enabled = yaml.safe_load((home / "config.yaml").read_text(encoding="utf-8"))["plugins"]["enabled"]
    assert "another" in enabled and "session-guard" in enabled


# --- backups --------------------------------------------------------------------------------

def test_backups_are_bounded_and_skipped_when_identical(home: Path) -> None:
    for _ in range(10):
        assert set_enabled(home, True).changed
        assert set_enabled(home, False).changed
    backups = sorted(home.glob("config.yaml.session-guard-backup-*"))
    assert 1 <= len(backups) <= plugin_config.MAX_BACKUPS
    assert len({b.read_bytes() for b in backups}) == len(backups)  # no two alike
    assert CONFIG.encode() in {b.read_bytes() for b in backups}  # the file as it was before the guard


# --- nothing written on refusal ---------------------------------------------------------------

def test_an_unwritable_plugins_directory_leaves_config_yaml_as_it_was(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (home / "plugins").write_text("not a directory\n", encoding="utf-8")
    before = tree(home)
    assert _enable() == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert tree(home) == before and not guard_enabled(home)[0]


def test_a_failing_dashboard_removal_leaves_config_yaml_as_it_was(
        home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert _enable() == 0
    capsys.readouterr()
    before = tree(home)

    def refuse(*_a: Any, **_k: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(dashboard_plugin.os, "rename", refuse)
    monkeypatch.setattr(dashboard_plugin.os, "replace", refuse)
    assert cli.main(["disable"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert tree(home) == before and guard_enabled(home)[0]


@posix_only
def test_disable_deletes_links_in_the_plugin_directory_as_links(home: Path, tmp_path: Path) -> None:
    assert _enable() == 0
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep\n", encoding="utf-8")
    api = dashboard_plugin.plugin_dir(home) / "dashboard" / "api.py"
    api.unlink()
    api.symlink_to(victim / "keep.txt")
    (dashboard_plugin.plugin_dir(home) / "dashboard" / "more").symlink_to(victim)
    assert cli.main(["disable"]) == 0
    assert not os.path.lexists(dashboard_plugin.plugin_dir(home))
    assert (victim / "keep.txt").read_text(encoding="utf-8") == "keep\n"
    assert sorted(p.name for p in (home / "plugins").iterdir()) == []


@root_only
def test_a_config_root_creates_in_a_service_home_belongs_to_the_home_owner(home: Path) -> None:
    (home / "config.yaml").unlink()
    os.chown(home, 12345, 23456)
    assert _enable() == 0
    st = (home / "config.yaml").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (12345, 23456, 0o600)
    plugins = (home / "plugins").stat()
    assert (plugins.st_uid, plugins.st_gid, stat.S_IMODE(plugins.st_mode)) == (12345, 23456, 0o700)


def test_a_writer_that_read_before_the_replace_and_lands_after_it_is_seen(home: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """As Hermes's ``save_config`` does with what it read before enable replaced the file."""
    monkeypatch.setattr(plugin_config, "SETTLE_SECONDS", 0.2)
    stale = yaml.safe_load(CONFIG)
    stale["plugins"]["enabled"].append("another")
    landed: list[bool] = []
    real_pause = plugin_config._pause

    def lands_while_watched(seconds: float) -> None:
        if not landed:
            landed.append(True)
            (home / "config.yaml").write_text(yaml.safe_dump(stale, sort_keys=False), encoding="utf-8")
        real_pause(seconds)

    monkeypatch.setattr(plugin_config, "_pause", lands_while_watched)
    change = set_enabled(home, True)
    enabled = yaml.safe_load((home / "config.yaml").read_text(encoding="utf-8"))["plugins"]["enabled"]
    assert landed and change.changed and "another" in enabled and "session-guard" in enabled


@posix_only
def test_a_killed_run_s_staging_directory_is_removed_and_a_running_one_s_kept(home: Path) -> None:
    plugins = home / "plugins"
    (plugins / f".{dashboard_plugin.DIR_NAME}.0a1b.new" / "dashboard").mkdir(parents=True)
    (plugins / f".{dashboard_plugin.DIR_NAME}.2c3d.old").mkdir()
    old = plugins / f".{dashboard_plugin.DIR_NAME}.0a1b.new"
    os.utime(old, (1_000_000_000, 1_000_000_000))
    assert _enable() == 0
    assert sorted(p.name for p in plugins.iterdir()) == [f".{dashboard_plugin.DIR_NAME}.2c3d.old",
                                                          dashboard_plugin.DIR_NAME]


@root_only
def test_a_config_link_planted_by_another_account_is_refused(home: Path, tmp_path: Path) -> None:
    target = tmp_path / "root-owned.yaml"
    target.write_text("model: x\n", encoding="utf-8")
    (home / "config.yaml").unlink()
    (home / "config.yaml").symlink_to(target)
    os.lchown(home / "config.yaml", 12345, 12345)
    with pytest.raises(plugin_config.PluginConfigError, match="another account owns"):
        set_enabled(home, True)
    assert target.read_text(encoding="utf-8") == "model: x\n"


def test_the_tree_is_written_without_directory_descriptors_too(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """As on Windows, where ``os.open`` takes no ``dir_fd``."""
    from hermes_session_guard import file_modes

    monkeypatch.setattr(file_modes, "_dir_fds_supported", lambda: False)
    file_modes.write_private_tree(tmp_path / "t", {"a/b/c.txt": b"c", "a/d.txt": b"d", "e.txt": b"e"})
    assert (tmp_path / "t" / "a" / "b" / "c.txt").read_bytes() == b"c"
    assert (tmp_path / "t" / "a" / "d.txt").read_bytes() == b"d" and (tmp_path / "t" / "e.txt").read_bytes() == b"e"
    if os.name == "posix":
        (tmp_path / "u").mkdir()
        (tmp_path / "elsewhere").mkdir()
        with pytest.raises(FileExistsError):
            file_modes.write_private_tree(tmp_path / "u", {"x": b"x"})
        (tmp_path / "v").symlink_to(tmp_path / "elsewhere")
        with pytest.raises(FileExistsError):
            file_modes.write_private_tree(tmp_path / "v", {"x": b"x"})
        assert list((tmp_path / "elsewhere").iterdir()) == []
