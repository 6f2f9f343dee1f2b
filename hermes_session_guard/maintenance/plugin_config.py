"""Whether a home's config.yaml enables the guard, and switching it on or off.

Hermes loads an entry-point plugin only when its name is in ``plugins.enabled``
and not in ``plugins.disabled`` of ``$HERMES_HOME/config.yaml`` (0.13 onwards).
``hermes plugins enable`` finds only bundled and directory plugins on 0.13-0.14
and rewrites the whole file through PyYAML (comments lost), so the guard edits
the two lists itself: the file is parsed with ruamel.yaml's round-trip loader,
only the top-level ``plugins:`` block is replaced in the original text (every
other line, comments included, is kept byte for byte), the result must load
with PyYAML (as Hermes reads it) to exactly the old data plus the change, the
old file is copied aside first (mode kept) and the new one replaces it
atomically with the same mode.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import atomic_write_text

PLUGIN_NAME = "session-guard"
BACKUP_INFIX = ".session-guard-backup-"
_TOP_LEVEL_KEY = re.compile(r"^[^\s#]")
_PLUGINS_KEY = re.compile(r"^plugins\s*:")


class PluginConfigError(Exception):
    """config.yaml cannot be read or changed safely; the message says why."""


@dataclass(frozen=True)
class Change:
    path: Path
    changed: bool
    backup: Path | None
    enabled: bool


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PluginConfigError(f"{path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                                f"{exc.start}); nothing changed") from exc
    except OSError as exc:
        raise PluginConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _safe_load(text: str, path: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise PluginConfigError(f"{path} is not valid YAML ({problem}{where}); nothing changed") from exc


def _lists(data: Any, path: Path) -> tuple[list[Any], list[Any]]:
    """``plugins.enabled`` and ``plugins.disabled`` of plain (PyYAML) data."""
    if data is None:
        return [], []
    if not isinstance(data, dict):
        raise PluginConfigError(f"{path} does not hold a mapping at the top level; nothing changed")
    plugins = data.get("plugins")
    if plugins is None:
        return [], []
    if not isinstance(plugins, dict):
        raise PluginConfigError(f"`plugins` in {path} is a {type(plugins).__name__}, not a mapping; nothing changed")
    out = []
    for key in ("enabled", "disabled"):
        value = plugins.get(key)
        if value is None:
            out.append([])
        elif isinstance(value, list):
            out.append(value)
        else:
            raise PluginConfigError(f"`plugins.{key}` in {path} is a {type(value).__name__}, not a list; "
                                    "nothing changed")
    return out[0], out[1]


def guard_enabled(home: Path) -> tuple[bool, str]:
    """Whether Hermes would load the guard in ``home`` (``plugins.disabled`` wins), and where that is said."""
    path = Path(home) / "config.yaml"
    if not path.exists():
        return False, f"there is no {path}; run `hermes-session-guard enable`"
    enabled, disabled = _lists(_safe_load(_read_text(path), path), path)
    if PLUGIN_NAME in disabled:
        return False, f"{PLUGIN_NAME} is in plugins.disabled of {path}; run `hermes-session-guard enable`"
    if PLUGIN_NAME not in enabled:
        return False, f"{PLUGIN_NAME} is not in plugins.enabled of {path}; run `hermes-session-guard enable`"
    return True, f"{PLUGIN_NAME} is in plugins.enabled of {path}"


def _dump(data: Any, indent: int, block_seq_indent: int) -> str:
    from ruamel.yaml import YAML

    y = YAML()
    y.preserve_quotes = True
    y.width = 4096
    y.indent(mapping=indent, sequence=indent + block_seq_indent, offset=block_seq_indent)
    buf = io.StringIO()
    y.dump(data, buf)
    return buf.getvalue()


def _block(lines: list[str]) -> tuple[int, int] | None:
    """Line range of the top-level ``plugins:`` block (the key line up to the next top-level line)."""
    starts = [i for i, line in enumerate(lines) if _PLUGINS_KEY.match(line)]
    if len(starts) != 1:
        return None
    start = starts[0]
    end = next((i for i in range(start + 1, len(lines)) if _TOP_LEVEL_KEY.match(lines[i])), len(lines))
    return start, end


def edited_text(text: str, enable: bool, path: Path) -> str | None:
    """``text`` with the guard enabled/disabled, every line outside ``plugins:`` unchanged;
    None when nothing needs to change. Raises :class:`PluginConfigError`."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.error import YAMLError
    from ruamel.yaml.util import load_yaml_guess_indent

    plain = _safe_load(text, path)
    enabled, disabled = _lists(plain, path)
    if enable and PLUGIN_NAME in enabled and PLUGIN_NAME not in disabled:
        return None
    if not enable and PLUGIN_NAME not in enabled and PLUGIN_NAME in disabled:
        return None
    try:
        _, indent, block_seq_indent = load_yaml_guess_indent(text) if text.strip() else (None, 2, 0)
        doc = YAML().load(text) if text.strip() else None
    except YAMLError as exc:
        raise PluginConfigError(f"{path} is not valid YAML ({exc}); nothing changed") from exc
    indent = indent or 2
    block_seq_indent = block_seq_indent or 0
    doc = doc if doc is not None else CommentedMap()
    plugins = doc.get("plugins")
    if plugins is None:
        plugins = doc["plugins"] = CommentedMap()
    for key in ("enabled", "disabled"):
        if plugins.get(key) is None:
            plugins[key] = CommentedSeq()
    add, remove = ("enabled", "disabled") if enable else ("disabled", "enabled")
    while PLUGIN_NAME in plugins[remove]:
        plugins[remove].remove(PLUGIN_NAME)
    if PLUGIN_NAME not in plugins[add]:
        plugins[add].append(PLUGIN_NAME)

    expected = dict(plain or {})
    expected["plugins"] = {**(expected.get("plugins") or {}),
                           "enabled": list(plugins["enabled"]), "disabled": list(plugins["disabled"])}
    dumped = _dump(doc, indent, block_seq_indent)
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    new_lines = dumped.splitlines(keepends=True)
    old_block, new_block = _block(lines), _block(new_lines)
    candidates = []
    if new_block is not None:
        start, end = old_block if old_block is not None else (len(lines), len(lines))
        candidates.append("".join(lines[:start] + new_lines[new_block[0]:new_block[1]] + lines[end:]))
    candidates.append(dumped)
    for candidate in candidates:
        try:
            if _safe_load(candidate, path) == expected:
                return candidate
        except PluginConfigError:
            continue
    raise PluginConfigError(f"cannot change plugins in {path} without changing anything else; edit it by hand: "
                            f"{'add' if enable else 'remove'} {PLUGIN_NAME} under plugins.enabled")


def backup_path_for(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    candidate = path.with_name(f"{path.name}{BACKUP_INFIX}{stamp}")
    n = 1
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = path.with_name(f"{path.name}{BACKUP_INFIX}{stamp}-{n}")
    return candidate


def set_enabled(home: Path, enable: bool) -> Change:
    """Enable (or disable) the guard in ``home``'s config.yaml; a backup of the old file first."""
    path = Path(home) / "config.yaml"
    if path.is_symlink():  # a config kept elsewhere (dotfiles): edit the file it points to, keep the link
        if not path.exists():
            raise PluginConfigError(f"{path} is a symbolic link to {os.readlink(path)}, which does not exist")
        path = path.resolve()
    if path.exists() and not path.is_file():
        raise PluginConfigError(f"{path} is not a regular file; edit it by hand")
    exists = path.exists()
    text = _read_text(path) if exists else ""
    new_text = edited_text(text, enable, path)
    if new_text is None:
        return Change(path, changed=False, backup=None, enabled=enable)
    if not os.access(path.parent, os.W_OK) or (exists and not os.access(path, os.W_OK)):
        raise PluginConfigError(f"{path} is read-only; nothing changed")
    backup = None
    try:
        if exists:
            backup = backup_path_for(path)
            shutil.copy2(path, backup)
            mode = path.stat().st_mode & 0o7777
        else:
            mode = 0o600
        atomic_write_text(path, new_text, mode=mode)
    except OSError as exc:
        raise PluginConfigError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return Change(path, changed=True, backup=backup, enabled=enable)
