"""Facts about the installed Hermes: its version, its home, its state.db."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

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


def installed_version() -> str | None:
    try:
        return metadata.version(HOST_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def install_path() -> str | None:
    try:
        dist = metadata.distribution(HOST_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    return str(dist.locate_file(""))


def hermes_home() -> Path:
    """``HERMES_HOME`` as Hermes resolves it (env var, else ``~/.hermes``)."""
    val = os.environ.get("HERMES_HOME", "").strip()
    return Path(val) if val else Path.home() / ".hermes"


def state_db_path(home: Path | None = None) -> Path:
    return (home or hermes_home()) / "state.db"
