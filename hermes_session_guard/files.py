"""Replacing a file atomically: the one helper every whole-file rewrite of the guard uses.

A temporary file in the same directory (so ``os.replace`` never crosses a file
system) is written, flushed and fsynced, given its final mode, and renamed over
the target; then the directory is fsynced where the OS allows it (POSIX), so the
rename itself survives a crash. On any error the temporary file is removed and
the target is left as it was.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

BACKUP_INFIX = ".session-guard-backup-"  # a copy the guard keeps of a file before it changes it


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable; a no-op where directories cannot be opened (Windows)."""
    if os.name == "nt":
        return
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a directory; the rename itself already happened
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``text`` (UTF-8, newlines as given) so that readers see the
    old file or the new one, never a mix; the new file gets ``mode``."""
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_bytes(path: Path, data: bytes, *, mode: int = 0o600, owner: tuple[int, int] | None = None,
                       before_replace: Callable[[], None] | None = None) -> None:
    """:func:`atomic_write_text` for bytes. The temporary file is created exclusively
    (``mkstemp``: a name nobody had, never a link followed) and gets ``mode`` and, when
    given, ``owner`` (uid, gid) through its descriptor before it replaces ``path``; a
    failing ``chown`` raises (the file would otherwise change hands). ``before_replace``
    runs last before the rename: raising there leaves ``path`` untouched."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
            if hasattr(os, "fchmod"):
                os.fchmod(fh.fileno(), mode)
            if owner is not None and hasattr(os, "fchown"):
                st = os.fstat(fh.fileno())
                if (st.st_uid, st.st_gid) != owner:
                    os.fchown(fh.fileno(), *owner)
        if not hasattr(os, "fchmod"):
            os.chmod(tmp, mode)
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


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
