"""Every file the guard writes in a home goes through here: replaced whole
(:func:`atomic_write_bytes`), appended to (:func:`append_bytes`) or created new
(:func:`create_file`). What holds for each (see ``docs/adr`` "file safety"):

- no link is followed: the file's directory is entered level by level from the
  home without following a link (:func:`~hermes_session_guard.file_modes.open_dir`),
  and the file itself is opened ``O_NOFOLLOW`` (an ``lstat`` check on Windows);
- an existing file keeps its owner, group and mode;
- a file or directory created in a home is ``0600`` / ``0700`` and belongs to the
  home's owner when root runs the command (a service user's home).

A replace writes a temporary file in the same directory (so ``os.replace`` never
crosses a file system), flushes and fsyncs it, gives it its final mode and owner,
and renames it over the target; then the directory is fsynced where the OS allows
it (POSIX), so the rename itself survives a crash. On any error the temporary file
is removed and the target is left as it was.
"""

from __future__ import annotations

import os
import secrets
import stat
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from .file_modes import (
    EXCL_FLAGS,
    PRIVATE_FILE,
    LinkRefused,
    OpenDir,
    chown_fd,
    create_private_file,
    open_dir,
)

BACKUP_INFIX = ".session-guard-backup-"  # a copy the guard keeps of a file before it changes it
_APPEND = os.O_WRONLY | os.O_APPEND | getattr(os, "O_BINARY", 0)


def _existing(d: OpenDir, name: str) -> os.stat_result | None:
    st = d.lstat(name)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise LinkRefused(f"{d.path / name} is a symbolic link or not a regular file; the guard does not "
                          "write through links")
    return st


def atomic_write_text(path: Path, text: str, *, mode: int | None = None, home: Path | None = None) -> None:
    """Replace ``path`` with ``text`` (UTF-8, newlines as given) so that readers see the
    old file or the new one, never a mix (:func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode, home=home)


def atomic_write_bytes(path: Path, data: bytes, *, mode: int | None = None, home: Path | None = None,
                       before_replace: Callable[[], None] | None = None) -> None:
    """Replace ``path`` with ``data``. The file keeps its owner, group and mode (``mode``,
    when given, is set instead); a new one is ``0600`` and, in ``home`` as root, the
    home's owner's. Under ``home`` no directory level below it is entered through a
    link; a link (or anything not a regular file) at ``path`` is refused
    (:class:`~hermes_session_guard.file_modes.LinkRefused`), never replaced or
    followed. The temporary file is created exclusively and gets mode and owner
    through its descriptor; a failing ``chown`` raises (the file would otherwise
    change hands). ``before_replace`` runs last before the rename: raising there
    leaves ``path`` untouched."""
    path = Path(path)
    with open_dir(path.parent, home=home, create=True) as d:
        old = _existing(d, path.name)
        final_mode = mode if mode is not None else stat.S_IMODE(old.st_mode) if old is not None else PRIVATE_FILE
        owner = (old.st_uid, old.st_gid) if old is not None and os.name == "posix" else d.owner
        tmp = f".{path.name}.{secrets.token_hex(4)}.tmp"
        fd = d.open(tmp, EXCL_FLAGS, PRIVATE_FILE)
        replaced = False
        try:
            try:
                with os.fdopen(fd, "wb", closefd=False) as fh:
                    fh.write(data)
                    fh.flush()
                os.fsync(fd)
                if hasattr(os, "fchmod"):
                    os.fchmod(fd, final_mode)
                chown_fd(fd, owner)
            finally:
                os.close(fd)
            if not hasattr(os, "fchmod"):
                os.chmod(d.path / tmp, final_mode)
            if before_replace is not None:
                before_replace()
            d.replace(tmp, path.name)
            replaced = True
        finally:
            if not replaced:  # the temporary file, never ``path``
                with suppress(OSError):
                    d.unlink(tmp)
        d.fsync()


def append_bytes(path: Path, data: bytes, *, home: Path | None = None, private: bool = False) -> None:
    """Append ``data`` to ``path`` in one ``write`` (``O_APPEND``: lines of several
    processes interleave whole), creating it ``0600`` (the home's owner's as root, its
    missing directories ``0700``) without following a link at any level under ``home``.
    An existing file keeps its owner and group and its mode, except that with
    ``private`` (the guard's own audit log) a log an older version left readable by
    others is made ``0600`` through its descriptor."""
    path = Path(path)
    with open_dir(path.parent, home=home, create=True) as d:
        try:
            fd = d.open(path.name, EXCL_FLAGS | os.O_APPEND, PRIVATE_FILE)
            created = True
        except FileExistsError:
            fd = d.open(path.name, _APPEND)
            created = False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise LinkRefused(f"{path} is not a regular file; the guard appends only to regular files")
            if hasattr(os, "fchmod") and (created or (private and st.st_mode & 0o077)):
                os.fchmod(fd, PRIVATE_FILE)
            if created:
                chown_fd(fd, d.owner)
            while data:  # one write(2) of the whole line (O_APPEND), unless the disk fills
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)


def create_file(path: Path, data: bytes, *, home: Path | None = None) -> Path:
    """Create ``path`` holding ``data``, exclusively (``FileExistsError`` when anything, a
    link included, is at the name: it is left alone), ``0600``, fsynced, the home's
    owner's as root; its directory entered as :func:`atomic_write_bytes` does."""
    path = Path(path)
    with open_dir(path.parent, home=home, create=True) as d:
        if d.fd is not None:
            create_private_file(path.name, data, owner=d.owner, dir_fd=d.fd)
        else:
            create_private_file(path, data, owner=d.owner)
    return path


def backup_path_for(path: Path) -> Path:
    """A name next to ``path`` that nothing holds yet, for a copy of it:
    ``<name>.session-guard-backup-<UTC time>`` (``-2``, ``-3``... when taken)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    candidate = path.with_name(f"{path.name}{BACKUP_INFIX}{stamp}")
    n = 1
    while os.path.lexists(candidate):
        n += 1
        candidate = path.with_name(f"{path.name}{BACKUP_INFIX}{stamp}-{n}")
    return candidate
