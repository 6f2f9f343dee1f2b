"""``enable`` / ``disable`` edit only ``plugins`` in config.yaml: every other line (comments
included) stays byte for byte, invalid YAML is refused, the old file is kept with its mode."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import yaml

from hermes_session_guard.commands import cli
from hermes_session_guard.maintenance import plugin_config
from hermes_session_guard.maintenance.plugin_config import PluginConfigError, edited_text, guard_enabled, set_enabled

COMMENTED = """\
# Hermes configuration (hand-edited)
model:
  default: anthropic/claude-sonnet   # the main model
  provider: openrouter

# tools the agent may use
toolsets:
- hermes-cli
- web

plugins:
  # plugins I trust
  enabled:
    - memory-extra   # keeps notes
  disabled: []

session_guard:
  lock:
    wait_seconds: 2.0   # seconds
display:
  tool_progress: "all"
  quote: 'single'
"""

NO_PLUGINS = """\
# minimal
model:
  default: x   # keep me
terminal:
  backend: local
"""


@pytest.fixture(autouse=True)
def no_settling(monkeypatch: pytest.MonkeyPatch) -> None:
    """config.yaml is not watched after the replace here (tests of that set it themselves)."""
    monkeypatch.setattr(plugin_config, "SETTLE_SECONDS", 0.0)


def _outside_plugins(text: str) -> list[str]:
    lines, out, inside = text.splitlines(), [], False
    for line in lines:
        if line.startswith("plugins:"):
            inside = True
            continue
        if inside and line and not line[0].isspace() and not line.startswith("#"):
            inside = False
        if not inside:
            out.append(line)
    return out


@pytest.mark.parametrize("original", [COMMENTED, NO_PLUGINS, "", "# only a comment\n",
                                      "plugins:\n  enabled: [a, b]  # flow\nother: 1\n",
                                      "plugins: {enabled: [a]}\nx: 1  # c\n", "model: x"])
def test_enable_then_disable_keeps_every_other_line(original: str) -> None:
    path = Path("config.yaml")
    enabled_text = edited_text(original, True, path)
    assert enabled_text is not None
    data = yaml.safe_load(enabled_text)
    before = yaml.safe_load(original) or {}
    assert "session-guard" in data["plugins"]["enabled"]
    assert {k: v for k, v in data.items() if k != "plugins"} == {k: v for k, v in before.items() if k != "plugins"}
    old_plugins = before.get("plugins") or {}
    assert [p for p in data["plugins"]["enabled"] if p != "session-guard"] == (old_plugins.get("enabled") or [])
    assert _outside_plugins(enabled_text) == _outside_plugins(original)
    assert edited_text(enabled_text, True, path) is None  # already enabled: nothing to do
    disabled_text = edited_text(enabled_text, False, path)
    assert disabled_text is not None
    data = yaml.safe_load(disabled_text)
    assert "session-guard" not in data["plugins"]["enabled"] and "session-guard" in data["plugins"]["disabled"]
    assert _outside_plugins(disabled_text) == _outside_plugins(original)


def test_comments_inside_the_plugins_block_are_kept() -> None:
    text = edited_text(COMMENTED, True, Path("config.yaml"))
    assert text is not None
    assert "# plugins I trust" in text and "memory-extra" in text and "# keeps notes" in text
    assert text.startswith("# Hermes configuration (hand-edited)\nmodel:\n  default: anthropic/claude-sonnet   #")


@pytest.mark.parametrize("bad, why", [
    ("plugins: [unclosed\n", "is not valid YAML"),
    ("- a\n- b\n", "does not hold a mapping"),
    ("plugins: [a, b]\n", "`plugins` in"),
    ("plugins:\n  enabled: session-guard\n", "`plugins.enabled` in"),
    ("key: 'x\n", "is not valid YAML"),
])
def test_refuses_what_it_cannot_edit_safely(tmp_path: Path, bad: str, why: str) -> None:
    (tmp_path / "config.yaml").write_text(bad, encoding="utf-8")
    with pytest.raises(PluginConfigError, match=why):
        set_enabled(tmp_path, True)
    assert (tmp_path / "config.yaml").read_text(encoding="utf-8") == bad
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_backs_up_the_old_file_privately_and_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(COMMENTED, encoding="utf-8")
    path.chmod(0o640)
    change = set_enabled(tmp_path, True)
    assert change.changed and change.backup is not None
    assert change.backup.name.startswith("config.yaml.session-guard-backup-")
    assert change.backup.read_text(encoding="utf-8") == COMMENTED
    assert stat.S_IMODE(change.backup.stat().st_mode) == 0o600  # a copy of a file that may hold secrets
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert guard_enabled(tmp_path)[0]
    again = set_enabled(tmp_path, True)
    assert not again.changed and again.backup is None
    assert len(list(tmp_path.glob("config.yaml.session-guard-backup-*"))) == 1
    off = set_enabled(tmp_path, False)
    assert off.changed and off.backup is not None and off.backup != change.backup
    assert not guard_enabled(tmp_path)[0]


def test_creates_a_private_config_in_an_empty_home(tmp_path: Path) -> None:
    change = set_enabled(tmp_path, True)
    assert change.changed and change.backup is None
    assert stat.S_IMODE((tmp_path / "config.yaml").stat().st_mode) == 0o600
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == {
        "plugins": {"enabled": ["session-guard"], "disabled": []}}


def test_the_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.yaml").write_text(COMMENTED, encoding="utf-8")
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    assert cli.main(["enable"]) == 0
    out = capsys.readouterr().out
    assert "session-guard enabled in" in out and "previous file kept as" in out
    assert cli.main(["enable", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["changed"] is False
    assert cli.main(["disable"]) == 0
    assert "session-guard disabled in" in capsys.readouterr().out
    (tmp_path / "config.yaml").write_text("plugins: [unclosed\n", encoding="utf-8")
    assert cli.main(["enable"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "not valid YAML" in err[0]


def test_a_symlinked_config_is_edited_where_it_lives(tmp_path: Path) -> None:
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    (dotfiles / "hermes.yaml").write_text(COMMENTED, encoding="utf-8")
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").symlink_to(dotfiles / "hermes.yaml")
    change = set_enabled(home, True)
    assert change.changed and (home / "config.yaml").is_symlink()
    assert guard_enabled(home)[0] and "# plugins I trust" in (dotfiles / "hermes.yaml").read_text(encoding="utf-8")
    assert change.backup is not None and change.backup.parent == dotfiles
