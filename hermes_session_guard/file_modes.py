"""Private files and directories: everything the guard creates is ``0600``, every
directory it creates ``0700``, whatever the process umask.

The mode is given at creation (``os.open(..., 0o600)``, ``mkdir(0o700)``) and set
again with ``chmod`` afterwards (a umask can only remove bits, never add them, but
an unusual umask could remove the owner's own). On Windows ``chmod`` only toggles
the read-only flag; files there inherit the ACL of ``HERMES_HOME``, which is the
user's own.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700

# Create, never open what is there: O_EXCL fails on any existing name, a symlink included
# (dangling or not); O_NOFOLLOW says the same where it exists (not on Windows).
EXCL_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOFOLLOW", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # 0 on Windows: there an lstat check stands in for it


class LinkRefused(OSError):
    """A path the guard would write through is a symbolic link (or not what it should be)."""


def home_owner(home: Path) -> tuple[int, int] | None:
    """Whose a file or directory the guard creates in ``home`` is: the home's owner and
    group when root runs the command (a service user's home); ``None`` otherwise, where
    the creating process is the owner already. The home itself may be a link
    (``HERMES_HOME`` pointing at a data disk is a setup, not an attack)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    st = os.stat(home)
    return st.st_uid, st.st_gid


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






def write_private_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (replacing it) so that it ends up ``0600``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), PRIVATE_FILE)
    with os.fdopen(fd, "wb") as fh:
        fh.write(text.encode("utf-8"))
    chmod_quietly(path, PRIVATE_FILE)




def _dir_fds_supported() -> bool:
    return (os.open in os.supports_dir_fd and os.mkdir in os.supports_dir_fd and hasattr(os, "fchmod")
            and hasattr(os, "O_NOFOLLOW") and hasattr(os, "O_DIRECTORY"))


def _check_not_link(path: Path, *, directory: bool) -> None:
    """Where no directory descriptors exist (Windows): ``path`` just created must be what we made."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or (stat.S_ISDIR(st.st_mode) != directory):
        raise LinkRefused(f"{path} changed under the guard while it was being written (a link?)")


def chown_fd(fd: int, owner: tuple[int, int] | None) -> None:
    if owner is None or not hasattr(os, "fchown"):
        return
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) != owner:
        os.fchown(fd, *owner)


def create_private_file(path: Path | str, data: bytes, *, owner: tuple[int, int] | None = None,
                        dir_fd: int | None = None) -> None:
    """Create ``path`` (relative to ``dir_fd`` when given) holding ``data``: exclusively
    (:data:`EXCL_FLAGS`: whatever is at the name, a link included, makes it raise
    ``FileExistsError`` and is left alone), mode ``0600``, fsynced, owned by ``owner``
    (uid, gid) when given. A file left half-written by an error is removed again."""
    fd = os.open(path, EXCL_FLAGS, PRIVATE_FILE, dir_fd=dir_fd) if dir_fd is not None else \
        os.open(path, EXCL_FLAGS, PRIVATE_FILE)
    written = False
    try:
        if dir_fd is None and not hasattr(os, "O_NOFOLLOW"):
            _check_not_link(Path(path), directory=False)
        with os.fdopen(fd, "wb", closefd=False) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fd)
        if hasattr(os, "fchmod"):
            os.fchmod(fd, PRIVATE_FILE)
        chown_fd(fd, owner)
        written = True
    finally:
        os.close(fd)
        if not written:  # half-written: removed again
            with suppress(OSError):
                os.unlink(path, dir_fd=dir_fd) if dir_fd is not None else os.unlink(path)
    if not hasattr(os, "fchmod"):
        chmod_quietly(path, PRIVATE_FILE)


def write_private_tree(directory: Path, files: Mapping[str, bytes], *,
                       owner: tuple[int, int] | None = None) -> None:
    """Create ``directory`` (it must not exist; its parent must) holding ``files``
    (relative ``/``-separated paths to contents): every directory ``0700``, every file
    ``0600``, owned by ``owner`` (uid, gid) when given, and no symbolic link ever followed.

    On POSIX every name is created relative to a descriptor of the directory just
    made (opened ``O_NOFOLLOW | O_DIRECTORY``), so a link swapped in by another
    account anywhere in the tree is refused rather than written through; elsewhere
    each new name is checked with ``lstat`` after it is created. Files are created
    ``O_CREAT | O_EXCL`` (:data:`EXCL_FLAGS`). On any error whatever was created is
    left for the caller to remove (it lives under ``directory`` only)."""
    directory = Path(directory)
    os.mkdir(directory, PRIVATE_DIR)
    if not _dir_fds_supported():
        _check_not_link(directory, directory=True)
        chmod_quietly(directory, PRIVATE_DIR)
        for rel, data in sorted(files.items()):
            target = directory.joinpath(*rel.split("/"))
            for level in reversed(target.relative_to(directory).parents[:-1]):
                sub = directory / level
                if not sub.exists():
                    os.mkdir(sub, PRIVATE_DIR)
                _check_not_link(sub, directory=True)
            create_private_file(target, data, owner=owner)
        return
    top = os.open(directory, _DIR_FLAGS)
    opened: dict[str, int] = {"": top}
    try:
        st = os.fstat(top)
        if not stat.S_ISDIR(st.st_mode) or (hasattr(os, "geteuid") and st.st_uid != os.geteuid()):
            raise LinkRefused(f"{directory} is not the directory the guard just created")
        os.fchmod(top, PRIVATE_DIR)
        chown_fd(top, owner)
        for rel, data in sorted(files.items()):
            *dirs, name = rel.split("/")
            parent = ""
            for part in dirs:
                here = f"{parent}/{part}" if parent else part
                if here not in opened:
                    try:
                        os.mkdir(part, PRIVATE_DIR, dir_fd=opened[parent])
                    except FileExistsError:
                        pass
                    opened[here] = os.open(part, _DIR_FLAGS, dir_fd=opened[parent])  # a link: ELOOP/ENOTDIR
                    os.fchmod(opened[here], PRIVATE_DIR)
                    chown_fd(opened[here], owner)
                parent = here
            create_private_file(name, data, owner=owner, dir_fd=opened[parent])
    finally:
        for fd in opened.values():
            os.close(fd)


def links_under(root: Path) -> list[Path]:
    """``root`` itself when it is there but is no directory (a link included); else every
    symbolic link under it (none followed) and anything neither a directory nor a file."""
    found: list[Path] = []
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return found
    if not stat.S_ISDIR(st.st_mode):  # a link (to a directory or not) or a file where a directory belongs
        return [Path(root)]
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            mode = os.lstat(p).st_mode
            if stat.S_ISLNK(mode) or not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                found.append(p)
    return found


def _inside(home: Path, directory: Path) -> tuple[str, ...] | None:
    """The levels of ``directory`` below ``home`` (lexically; ``None`` when it is not under it)."""
    try:
        parts = Path(directory).relative_to(home).parts
    except ValueError:
        return None
    return None if ".." in parts else parts


def link_on_the_way(home: Path, path: Path) -> Path | None:
    """The first level from ``home`` down to ``path`` (itself included) that is a symbolic
    link, or ``None``: for refusing a command before it writes anything, where the writer
    itself (:func:`open_dir`) would refuse halfway."""
    parts = _inside(Path(home), Path(path))
    level = Path(home)
    for name in parts or ():
        level = level / name
        if os.path.islink(level):
            return level
    return None


class OpenDir:
    """A directory entered without following links, for creating and replacing names in it:
    relative to its descriptor on POSIX (a level swapped for a link meanwhile cannot
    redirect a write), by path with ``lstat`` checks where there are no directory
    descriptors (Windows). ``owner`` is whose the names created in it become."""

    def __init__(self, path: Path, fd: int | None, owner: tuple[int, int] | None) -> None:
        self.path, self.fd, self.owner = path, fd, owner

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.lstat(name, dir_fd=self.fd) if self.fd is not None else os.lstat(self.path / name)
        except FileNotFoundError:
            return None

    def open(self, name: str, flags: int, mode: int = PRIVATE_FILE) -> int:
        """``os.open`` of ``name`` in this directory, never through a link at ``name``
        (``O_NOFOLLOW``: ``ELOOP``; elsewhere :class:`LinkRefused` after an ``lstat``)."""
        if self.fd is not None:
            return os.open(name, flags | NOFOLLOW, mode, dir_fd=self.fd)
        path = self.path / name
        before = self.lstat(name)
        if before is not None and stat.S_ISLNK(before.st_mode):
            raise LinkRefused(f"{path} is a symbolic link; the guard does not write through links")
        fd = os.open(path, flags | NOFOLLOW, mode)
        after = os.lstat(path)
        if stat.S_ISLNK(after.st_mode) or (os.fstat(fd).st_ino, os.fstat(fd).st_dev) != (after.st_ino, after.st_dev):
            os.close(fd)
            raise LinkRefused(f"{path} changed while the guard opened it (a link?)")
        return fd

    def replace(self, src: str, dst: str) -> None:
        if self.fd is not None:
            os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        else:
            os.replace(self.path / src, self.path / dst)

    def unlink(self, name: str) -> None:
        if self.fd is not None:
            os.unlink(name, dir_fd=self.fd)
        else:
            os.unlink(self.path / name)

    def fsync(self) -> None:
        """Make a rename in this directory durable (POSIX; some file systems refuse it)."""
        if self.fd is not None:
            try:
                os.fsync(self.fd)
            except OSError:
                pass


def _enter(parent: OpenDir, name: str, *, create: bool) -> OpenDir:
    path = parent.path / name
    made = False
    if create and parent.lstat(name) is None:
        try:
            os.mkdir(name, PRIVATE_DIR, dir_fd=parent.fd) if parent.fd is not None else os.mkdir(path, PRIVATE_DIR)
            made = True
        except FileExistsError:
            pass  # made meanwhile: entered as it is, below
    if parent.fd is None:
        _check_not_link(path, directory=True)
        if made:
            chmod_quietly(path, PRIVATE_DIR)
            if parent.owner is not None and hasattr(os, "lchown"):
                os.lchown(path, *parent.owner)
        return OpenDir(path, None, parent.owner)
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent.fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise LinkRefused(f"{path} is a symbolic link or not a directory; the guard does not write "
                              "through links") from exc
        raise
    if made:
        os.fchmod(fd, PRIVATE_DIR)
        chown_fd(fd, parent.owner)
    return OpenDir(path, fd, parent.owner)


@contextmanager
def open_dir(directory: Path, *, home: Path | None = None, create: bool = False) -> Iterator[OpenDir]:
    """``directory``, entered for writing in it. Under ``home`` every level below the home
    is entered without following a link (:class:`LinkRefused` for a link or a
    non-directory), and with ``create`` a missing level is made ``0700`` and owned by
    the home's owner (:func:`home_owner`). Outside a home (``home`` None or ``directory``
    not under it: an absolute ``audit.path``, ``export -o``) the directory is opened as
    named, its missing levels made ``0700`` with ``create``."""
    directory = Path(directory)
    parts = _inside(Path(home), directory) if home is not None else None
    owner = home_owner(Path(home)) if home is not None and parts is not None else None
    if parts is None:
        if create:
            make_private_dirs(directory)
        root, parts = directory, ()
    else:
        root = Path(home)  # type: ignore[arg-type]
    dir_fds = os.open in os.supports_dir_fd and hasattr(os, "O_DIRECTORY") and hasattr(os, "fchmod")
    top = OpenDir(root, os.open(root, os.O_RDONLY | os.O_DIRECTORY) if dir_fds else None, owner)
    opened = [top]
    try:
        for name in parts:
            opened.append(_enter(opened[-1], name, create=create))
        yield opened[-1]
    finally:
        for level in opened:
            if level.fd is not None:
                os.close(level.fd)
