"""Private files and directories: everything the guard creates is ``0600``, every
directory it creates ``0700``, whatever the process umask.

The mode is given at creation (``os.open(..., 0o600)``, ``mkdir(0o700)``) and set
again with ``chmod`` afterwards (a umask can only remove bits, never add them, but
an unusual umask could remove the owner's own). On Windows ``chmod`` only toggles
the read-only flag; files there inherit the ACL of ``HERMES_HOME``, which is the
user's own.
"""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700

_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0)
_EXCL_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOFOLLOW", 0)


def chmod_quietly(path: Path | str, mode: int) -> bool:
    try:
        os.chmod(path, mode)
    except OSError:
        return False
    return True


def make_private_dirs(path: Path) -> Path:
    """``mkdir -p`` where every level created here is ``0700``; existing levels are
    left as they are (``HERMES_HOME`` and its ``logs/`` may be Hermes's own)."""
    path = Path(path)
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for level in reversed(missing):
        try:
            level.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:
            continue  # created concurrently: not ours to change
        chmod_quietly(level, PRIVATE_DIR)
    return path


def open_private_append(path: Path) -> int:
    """A file descriptor appending to ``path``, creating it ``0600`` (and its missing
    directories ``0700``)."""
    try:
        return os.open(path, _APPEND_FLAGS, PRIVATE_FILE)
    except FileNotFoundError:
        make_private_dirs(Path(path).parent)
        return os.open(path, _APPEND_FLAGS, PRIVATE_FILE)


def create_private(path: Path) -> None:
    """Create ``path`` empty with mode ``0600``; ``FileExistsError`` when anything (a
    symlink included, which is never followed) is already there."""
    fd = os.open(path, _EXCL_FLAGS, PRIVATE_FILE)
    os.close(fd)
    chmod_quietly(path, PRIVATE_FILE)


def write_private_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (replacing it) so that it ends up ``0600``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), PRIVATE_FILE)
    with os.fdopen(fd, "wb") as fh:
        fh.write(text.encode("utf-8"))
    chmod_quietly(path, PRIVATE_FILE)


def file_mode(path: Path) -> int | None:
    """The permission bits of ``path`` (``None`` when it cannot be read)."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        return None
