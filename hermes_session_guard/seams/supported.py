"""The Hermes releases this package declares support for, and how the installed one compares.

``SUPPORTED_LOW`` and ``SUPPORTED_HIGH`` bound what ``pyproject.toml`` declares as
the optional extra ``hermes-session-guard[hermes]`` (a unit test keeps the two equal,
and both equal to the span the seam table covers). It is an extra, not a dependency,
so that installing the guard never up- or downgrades the Hermes a user already runs;
``selftest`` prints :func:`describe` instead. On a repackaged Hermes (found by its
``hermes_cli`` module, installed under another distribution name) the extra is not
advised: it would install ``hermes-agent`` over the repackaging; the guard alone is.
"""

from __future__ import annotations

from ..hostinfo import parse_version

SUPPORTED_LOW = "0.13"
SUPPORTED_HIGH = "0.23"
EXTRA = "hermes-session-guard[hermes]"
ALONE = "hermes-session-guard"


def in_supported_range(version: str) -> bool:
    return parse_version(SUPPORTED_LOW) <= parse_version(version) < parse_version(SUPPORTED_HIGH)


def describe(version: str | None, *, repackaged: str | None = None) -> str:
    """One line for ``selftest``: the installed Hermes against the declared range.
    ``repackaged`` names the distribution a Hermes found by module came in (or is
    ``""`` when none is known): then the line says to install the guard alone."""
    how = EXTRA if repackaged is None else (
        f"install {ALONE} alone, not {EXTRA}, which would install hermes-agent over "
        f"{repackaged or 'this Hermes'}")
    declared = f"Supported Hermes >={SUPPORTED_LOW},<{SUPPORTED_HIGH} ({how})"
    if version is None:
        return f"{declared}: none installed in this environment"
    if in_supported_range(version):
        return f"{declared}: installed {version} is inside it"
    if parse_version(version) < parse_version(SUPPORTED_LOW):
        return f"{declared}: installed {version} is OUTSIDE it (older than the table; nothing is patched)"
    return (f"{declared}: installed {version} is OUTSIDE it (newer than the table; the seams that change what Hermes "
            "does are patched only where this selftest verifies them on this install, per promise below, and again "
            "after every `hermes update`; until then only read-only and display seams are)")
