"""Facts about the install: the guard's own version; the installed Hermes's version, its
home, its state.db."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import os
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType

from .fail_open import failing_open

# The guard's version (pyproject.toml's): the package's ``__version__``, the telemetry scope's
# and the verification fingerprint's, kept here at the bottom so none of them imports the package.
GUARD_VERSION = "0.1.0"
HOST_DISTRIBUTION = "hermes-agent"

Version = tuple[int, ...]


def parse_version(text: str) -> Version:
    """``"0.18.2"`` -> ``(0, 18, 2)``; pre-release suffixes are ignored."""
    parts: list[int] = []
    for piece in text.split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)


@dataclass(frozen=True)
class HostRelease:
    """The Hermes release in this environment and how it was found.

    ``found_by`` is ``distribution`` (the ``hermes-agent`` distribution's metadata:
    a wheel from the package index or an installer checkout) or ``hermes_cli``
    (``hermes_cli.__version__``: forks and repackagings installed under another
    distribution name, source trees on ``sys.path``). ``distribution`` names the
    distribution that owns ``hermes_cli`` when that is not ``hermes-agent``."""

    version: str
    found_by: str
    path: str | None
    distribution: str | None = None

    def describe(self) -> str:
        if self.found_by == FOUND_BY_DISTRIBUTION:
            return f"distribution {HOST_DISTRIBUTION} {self.version}"
        owner = f", installed as distribution {self.distribution}" if self.distribution else ""
        return f"hermes_cli.__version__ {self.version}{owner} (no {HOST_DISTRIBUTION} distribution)"


FOUND_BY_DISTRIBUTION = "distribution"
FOUND_BY_MODULE = "hermes_cli"


def find_host() -> HostRelease | None:
    """Hermes in this Python environment: by the ``hermes-agent`` distribution, else
    by importing ``hermes_cli`` and reading its ``__version__`` (a light package: its
    ``__init__`` only repairs stdio encodings); ``None`` when neither is there."""
    try:
        dist = metadata.distribution(HOST_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        return HostRelease(dist.version, FOUND_BY_DISTRIBUTION, str(dist.locate_file("")))
    return _host_by_module()


def owner_of(package_dir: Path) -> str | None:
    """The distribution that installed the top-level package ``package_dir``: the one
    ``*.dist-info`` beside it whose ``top_level.txt`` (else ``RECORD``) names it, those
    with "hermes" in their name tried first. Only that directory is read:
    ``importlib.metadata.packages_distributions()`` parses every distribution of the
    environment (about 3 s of a plugin load on a loaded machine, where Hermes 0.22 gives
    a plugin 10 s)."""
    name = package_dir.name
    infos = sorted(package_dir.parent.glob("*.dist-info"), key=lambda info: "hermes" not in info.name.lower())
    for info in infos:
        try:
            listed = name in (info / "top_level.txt").read_text(encoding="utf-8").split()
        except OSError:
            try:
                with (info / "RECORD").open(encoding="utf-8") as record:
                    listed = any(line.startswith(f"{name}/") for line in record)
            except OSError:
                continue
        if listed:
            return str(metadata.PathDistribution(info).metadata["Name"] or "") or None
    return None


@functools.lru_cache(maxsize=1)
def _host_by_module() -> HostRelease | None:
    try:
        spec = importlib.util.find_spec("hermes_cli")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    origin = Path(spec.origin).resolve().parent if spec.origin else None
    owner = owner_of(origin) if origin is not None else None
    module: ModuleType | None
    # a fork's lazy __version__ may raise; its distribution still says
    with failing_open("reading hermes_cli.__version__", "the version is read off its distribution",
                      level=logging.WARNING, advice=None) as failed:
        module = importlib.import_module("hermes_cli")
        version = str(module.__version__)
    if failed:
        if owner is None:
            return None
        version = metadata.version(owner)
        module = sys.modules.get("hermes_cli")  # None: no location below
    location = getattr(module, "__file__", None)
    path = str(Path(location).resolve().parents[1]) if location else None
    return HostRelease(version, FOUND_BY_MODULE, path, owner)


def installed_version() -> str | None:
    host = find_host()
    return host.version if host else None


def hermes_home() -> Path:
    """``HERMES_HOME`` as Hermes resolves it (env var, else ``~/.hermes``)."""
    val = os.environ.get("HERMES_HOME", "").strip()
    return Path(val) if val else Path.home() / ".hermes"


def state_db_path(home: Path | None = None) -> Path:
    return (home or hermes_home()) / "state.db"
