"""Whether a home's config.yaml enables the guard, and switching it on or off.

Hermes loads an entry-point plugin only when its name is in ``plugins.enabled``
and not in ``plugins.disabled`` of ``$HERMES_HOME/config.yaml`` (0.13 onwards).
``hermes plugins enable`` finds only bundled and directory plugins on 0.13-0.14
and rewrites the whole file through PyYAML (comments lost), so the guard edits
the two lists itself. Editing uses ruamel.yaml only (round trip: positions and
comments); PyYAML only checks the result the way Hermes will read it:

- the top-level ``plugins`` entry is found by the parser, however its key is
  written (plain, quoted, ``? plugins``, after a byte-order mark), and only its
  lines are replaced; every other line, comments included, is kept byte for
  byte, a duplicate key is refused, and the new block has the block's own
  indentation and the file's line breaks (``\r\n`` stays ``\r\n``);
- the result must load (PyYAML) to exactly the old data plus the change and
  hold one ``plugins`` key (ruamel.yaml refuses a duplicate);
- a symbolic link ``config.yaml`` is edited where it points only when link and
  file have the same owner;
- the old file is copied aside first, ``0600`` and with its owner, unless a
  kept copy holds the same bytes; at most :data:`MAX_BACKUPS` copies are kept;
- the new file is written next to it under a fresh name with the old file's
  owner, group and mode, and replaces it atomically only if the old file is
  still the one that was edited (bytes and inode): Hermes's own writers
  (``hermes plugins enable``, ``hermes config set``) take no lock another
  process could share, so a file that changed meanwhile is edited again from
  what is there now; after the replace the file is watched for a second, and a
  Hermes write based on what it read before (which drops the guard's change)
  makes the edit start over.
"""

from __future__ import annotations

import errno
import glob
import io
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ConfigError, load_yaml, read_config_bytes
from ..file_modes import create_private_file, home_owner
from ..files import BACKUP_INFIX, atomic_write_bytes, backup_path_for

PLUGIN_NAME = "session-guard"
MAX_BACKUPS = 3  # copies of config.yaml kept (it may hold secrets); a copy equal to a kept one is not made
MAX_ATTEMPTS = 20  # edits started over because another writer changed config.yaml meanwhile
SETTLE_SECONDS = 2.0  # how long config.yaml is watched after the replace for a writer that read it before
SETTLE_POLL_SECONDS = 0.02


class PluginConfigError(Exception):
    """config.yaml cannot be read or changed safely; the message says why."""


@dataclass(frozen=True)
class Change:
    path: Path
    changed: bool
    backup: Path | None
    enabled: bool
    old: bytes | None = field(default=None, repr=False)
    new: bytes | None = field(default=None, repr=False)


def _read_text(path: Path) -> str:
    try:
        found = read_config_bytes(path)
    except ConfigError as exc:
        raise PluginConfigError(f"{str(exc).split(': ', 1)[-1]}; nothing changed") from exc
    return _decode(found[0] if found is not None else b"", path)


def _safe_load(text: str, path: Path) -> Any:
    """PyYAML's reading of ``text`` (as Hermes reads it), within the alias bound of :func:`load_yaml`."""
    try:
        return load_yaml(text, path)
    except ConfigError as exc:
        raise PluginConfigError(f"{str(exc).split(': ', 1)[-1]}; nothing changed") from exc


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
    out: list[list[Any]] = []
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
    if not os.path.lexists(path):
        return False, f"there is no {path}; run `hermes-session-guard enable`"
    enabled, disabled = _lists(_safe_load(_read_text(path).removeprefix(_BOM), path), path)
    if PLUGIN_NAME in disabled:
        return False, f"{PLUGIN_NAME} is in plugins.disabled of {path}; run `hermes-session-guard enable`"
    if PLUGIN_NAME not in enabled:
        return False, f"{PLUGIN_NAME} is not in plugins.enabled of {path}; run `hermes-session-guard enable`"
    return True, f"{PLUGIN_NAME} is in plugins.enabled of {path}"


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")
_BOM = "\ufeff"


def _lines(text: str) -> list[str]:
    """``text`` split after each YAML line break (``\r\n``, ``\r``, ``\n``), breaks kept."""
    return _LINE.findall(text)


def _newline(text: str) -> str:
    """The line break most lines of ``text`` end with (``\n`` when there are none)."""
    crlf = text.count("\r\n")
    lf = text.count("\n") - crlf
    cr = text.count("\r") - crlf
    return max((lf, "\n"), (crlf, "\r\n"), (cr, "\r"))[1] if crlf or cr else "\n"


_SEQ_ITEM = re.compile(r"^( *)- ")
_MAP_KEY = re.compile(r"^( *)[^\s#-][^#]*:\s*(#.*)?$")


def _guess_indent(lines: list[str]) -> tuple[int | None, int | None]:
    """Mapping indent and the offset of a block sequence's dash from its key, as ``lines``
    write them (``None`` where they show none)."""
    mapping = offset = None
    keys: list[int] = []  # columns of the keys that open a block, innermost last
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        col = len(line) - len(line.lstrip(" "))
        while keys and keys[-1] >= col and not (_SEQ_ITEM.match(line) and keys[-1] == col):
            keys.pop()
        item = _SEQ_ITEM.match(line)
        if item and keys and offset is None:
            offset = col - keys[-1]
        elif not item and keys and mapping is None and col > keys[-1]:
            mapping = col - keys[-1]
        if _MAP_KEY.match(line):
            keys.append(col)
    return mapping, offset


def _dump(data: Any, indent: int, offset: int) -> str:
    from ruamel.yaml import YAML

    y = YAML()
    y.preserve_quotes = True
    y.width = 4096
    y.indent(mapping=indent, sequence=offset + 2, offset=offset)
    buf = io.StringIO()
    y.dump(data, buf)
    return buf.getvalue()


def _rt_load(text: str, path: Path) -> Any:
    """ruamel.yaml's round-trip document (positions, comments); a key given twice is refused."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        return YAML(typ="rt").load(text)
    except YAMLError as exc:
        if type(exc).__name__ == "DuplicateKeyError":
            raise PluginConfigError(f"{path} has a duplicate key ({str(exc).splitlines()[-1].strip() or exc}); "
                                    "edit it by hand; nothing changed") from exc
        raise PluginConfigError(f"{path} is not valid YAML ({exc}); nothing changed") from exc


def _top_level_keys(doc: Any) -> list[tuple[int, Any]]:
    return sorted((doc.lc.key(key)[0], key) for key in doc)


def _block(doc: Any, n_lines: int) -> tuple[int, int] | None:
    """Line range of the top-level ``plugins`` entry of a round-trip document, however the
    key is written (plain, quoted, ``? plugins``): its key line up to the next key's line."""
    if not hasattr(doc, "lc"):
        return None
    keys = _top_level_keys(doc)
    for i, (line, key) in enumerate(keys):
        if key == "plugins":
            return line, keys[i + 1][0] if i + 1 < len(keys) else n_lines
    return None


def edited_text(text: str, enable: bool, path: Path) -> str | None:
    """``text`` with the guard enabled/disabled, every line outside ``plugins`` unchanged
    (a byte-order mark and the file's line breaks kept, the block written with its own
    indentation); None when nothing needs to change. Raises :class:`PluginConfigError`."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    bom = _BOM if text.startswith(_BOM) else ""
    body = text[len(bom):]
    plain = _safe_load(body, path)
    enabled, disabled = _lists(plain, path)
    if enable and PLUGIN_NAME in enabled and PLUGIN_NAME not in disabled:
        return None
    if not enable and PLUGIN_NAME not in enabled and PLUGIN_NAME in disabled:
        return None
    doc = _rt_load(body, path) if body.strip() else None
    if doc is not None and not isinstance(doc, CommentedMap):
        raise PluginConfigError(f"{path} does not hold a mapping at the top level; nothing changed")
    lines = _lines(body)
    old_block = _block(doc, len(lines)) if doc is not None else None
    doc = doc if doc is not None else CommentedMap()
    mapping, offset = _guess_indent(lines[old_block[0]:old_block[1]]) if old_block else (None, None)
    whole_mapping, whole_offset = _guess_indent(lines)
    mapping = mapping or whole_mapping or 2
    offset = offset if offset is not None else whole_offset if whole_offset is not None else 2
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
    dumped = _dump(doc, mapping, offset)
    new_lines = _lines(dumped)
    new_block = _block(_rt_load(dumped, path), len(new_lines))
    refused = PluginConfigError(f"cannot change plugins in {path} without changing anything else; edit it by "
                                f"hand: {'add' if enable else 'remove'} {PLUGIN_NAME} under plugins.enabled")
    if new_block is None:
        raise refused
    nl = _newline(body)
    block = [line.rstrip("\r\n") + nl for line in new_lines[new_block[0]:new_block[1]]]
    if old_block is None:
        start = end = len(lines)
        if lines and not lines[-1].endswith(("\n", "\r")):
            lines[-1] += nl
    else:
        start, end = old_block
        if end == len(lines) and lines and not lines[-1].endswith(("\n", "\r")):
            block[-1] = block[-1].rstrip("\r\n")  # the file ended without a line break: so does it now
    candidate = "".join(lines[:start] + block + lines[end:])
    try:
        _rt_load(candidate, path)  # one plugins key: a duplicate is refused here
        if _safe_load(candidate, path) != expected:
            raise refused
    except PluginConfigError as exc:
        raise refused from exc
    return bom + candidate


def backups(path: Path) -> list[Path]:
    """The guard's copies of ``path`` (regular files only), oldest first."""
    found = []
    for entry in path.parent.glob(f"{glob.escape(path.name)}{BACKUP_INFIX}*"):
        try:
            if stat.S_ISREG(entry.lstat().st_mode):
                found.append(entry)
        except OSError:
            continue
    return sorted(found, key=lambda p: (p.lstat().st_mtime_ns, p.name))


@dataclass(frozen=True)
class _Seen:
    """config.yaml as read: its bytes and what must not change before it is replaced."""
    data: bytes
    identity: tuple[int, int, int, int] | None  # device, inode, size, mtime_ns; None: no file
    owner: tuple[int, int] | None
    mode: int


def _read(path: Path) -> _Seen:
    try:
        found = read_config_bytes(path, follow=False)
    except ConfigError as exc:
        raise PluginConfigError(f"{str(exc).split(': ', 1)[-1]}; nothing changed") from exc
    if found is None:  # a new file: the home's owner's when root writes it (a service's home)
        return _Seen(b"", None, home_owner(path.parent), 0o600)
    data, st = found
    owner = (st.st_uid, st.st_gid) if os.name == "posix" else None
    return _Seen(data, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), owner, stat.S_IMODE(st.st_mode))


def _decode(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PluginConfigError(f"{path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                                f"{exc.start}); nothing changed") from exc


def _config_path(home: Path) -> Path:
    """``home``'s config.yaml, or the file it links to when the link and that file have
    the same owner (a dotfiles checkout); a link another account planted is refused."""
    path = Path(home) / "config.yaml"
    if not path.is_symlink():
        return path
    if not path.exists():
        raise PluginConfigError(f"{path} is a symbolic link to {os.readlink(path)}, which does not exist")
    target = path.resolve()
    if os.name == "posix" and path.lstat().st_uid != target.stat().st_uid:
        raise PluginConfigError(f"{path} is a symbolic link to {target}, which another account owns; "
                                "edit it by hand; nothing changed")
    return target


class _ChangedMeanwhile(Exception):
    pass


def _write_backup(path: Path, seen: _Seen) -> tuple[Path, bool]:
    """A private copy (0600, the file's owner) of the file as read, unless a kept copy
    already holds the same bytes; the copy and whether it was made now."""
    for old in reversed(backups(path)):
        try:
            if old.read_bytes() == seen.data:
                return old, False
        except OSError:
            continue
    backup = backup_path_for(path)
    create_private_file(backup, seen.data, owner=seen.owner)
    return backup, True


def _prune_backups(path: Path, keep: Path | None) -> None:
    kept = backups(path)
    for old in kept[:max(0, len(kept) - MAX_BACKUPS)]:
        if old != keep:
            try:
                os.unlink(old)
            except OSError:
                pass


def _replace(path: Path, data: bytes, seen: _Seen) -> None:
    """Replace ``path`` with ``data`` (owner, group and mode kept; a new file the home
    owner's, 0600) only if it
    is still the file ``seen`` describes; else :class:`_ChangedMeanwhile`."""
    def unchanged() -> None:
        now = _read(path)
        if now.identity != seen.identity or now.data != seen.data:
            raise _ChangedMeanwhile

    atomic_write_bytes(path, data, home=path.parent, before_replace=unchanged)  # owner, group and mode kept


def _state(data: bytes, path: Path) -> bool | None:
    """Whether ``data`` enables the guard (None: it cannot be read)."""
    try:
        text = _decode(data, path)
        enabled, disabled = _lists(_safe_load(text.removeprefix(_BOM), path), path)
    except PluginConfigError:
        return None
    return PLUGIN_NAME in enabled and PLUGIN_NAME not in disabled


def _pause(seconds: float) -> None:
    time.sleep(seconds)


def _kept(path: Path, enable: bool) -> bool:
    """Whether config.yaml still says what was written once :data:`SETTLE_SECONDS` have
    passed: Hermes's writers read the file, then replace it with what they read plus
    their change, so one that read before the guard's replace removes the guard's change
    when it lands; it is looked for until the file has been left alone that long."""
    settled_at = time.monotonic() + SETTLE_SECONDS
    while True:
        if _state(_read(path).data, path) is not enable:
            return False
        if time.monotonic() >= settled_at:
            return True
        _pause(SETTLE_POLL_SECONDS)


def set_enabled(home: Path, enable: bool) -> Change:
    """Enable (or disable) the guard in ``home``'s config.yaml; a backup of the old file first.

    Another writer (``hermes plugins enable``, an editor) is never overwritten: just
    before the new file replaces the old one, the old one is read again and, when it
    changed since it was edited, the edit starts over from what is there now. After the
    replace the file is read back until :data:`SETTLE_SECONDS` have passed (:func:`_kept`);
    a writer that replaced it meanwhile without the guard's change makes the edit start
    over too."""
    path = _config_path(home)
    if os.path.lexists(path) and not path.is_file():
        raise PluginConfigError(f"{path} is not a regular file; edit it by hand")
    backup = None
    for _ in range(MAX_ATTEMPTS):
        seen = _read(path)
        new_text = edited_text(_decode(seen.data, path), enable, path)
        if new_text is None:
            if backup is None:
                return Change(path, changed=False, backup=None, enabled=enable)
            return Change(path, changed=True, backup=backup, enabled=enable)
        data = new_text.encode("utf-8")
        copy, made = None, False
        try:
            if seen.identity is not None:
                copy, made = _write_backup(path, seen)
            _replace(path, data, seen)
        except (_ChangedMeanwhile, OSError) as exc:
            if made and copy is not None:
                os.unlink(copy)
            if isinstance(exc, _ChangedMeanwhile):
                continue
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and exc.filename:  # not a chown
                raise PluginConfigError(f"{path} is read-only ({exc.strerror}); nothing changed") from exc
            raise PluginConfigError(f"cannot write {path}: {exc.strerror or exc}; nothing changed") from exc
        backup = copy or backup
        _prune_backups(path, backup)
        if _kept(path, enable):
            return Change(path, changed=True, backup=backup, enabled=enable, old=seen.data, new=data)
    raise PluginConfigError(f"{path} kept changing while the guard edited it ({MAX_ATTEMPTS} attempts); "
                            "run the command again")


def undo(change: Change) -> bool:
    """Put back the file :func:`set_enabled` replaced, if nobody changed it since; ``True`` when done."""
    if not change.changed or change.new is None or change.old is None:
        return False
    seen = _read(change.path)
    if seen.data != change.new:
        return False
    try:
        _replace(change.path, change.old, seen)
    except (OSError, _ChangedMeanwhile):
        return False
    if change.backup is not None:
        try:
            os.unlink(change.backup)
        except OSError:
            pass
    return True
