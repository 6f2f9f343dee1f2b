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
from pathlib import Path


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
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)
