"""conftest for Hermes's own tests (unpacked from a release's sdist by scripts/hermes_suite.py).

With ``HERMES_SUITE_GUARD=1`` the session guard is switched on through its public
``hermes_session_guard.install()`` before any test runs. Every seam must report
"patched" or "not-needed", or "pending" for a display module the guard never
imports itself (it is patched when a test imports it). Before each test the patches
are checked to still be in place (a test that reloads a Hermes module would
silently drop one: it is then put back and counted). With ``HERMES_SUITE_GUARD=0``
nothing is installed: the baseline run.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

# Hermes resolves its home at import time; never let a test touch ~/.hermes.
os.environ["HERMES_HOME"] = tempfile.mkdtemp(prefix="hermes-suite-home-")
os.environ.pop("HERMES_SESSION_ID", None)

GUARDED = os.environ.get("HERMES_SUITE_GUARD", "1") == "1"
_reinstalled: list[str] = []


class _CompressionCounter:
    """Counts compressions that went through the guard's contract (its own hook)."""

    def __init__(self) -> None:
        self.sessions: list[str] = []

    def session_guard_before_compression(self, session_id: str, op_id: str, messages: list[Any]) -> None:
        self.sessions.append(session_id)


_counter = _CompressionCounter()


def _patched_targets() -> dict[str, bool]:
    from hermes_session_guard import current_runtime
    from hermes_session_guard.seam_behaviour import SeamKind
    from hermes_session_guard.seams import apply as instrumentation
    from hermes_session_guard.seams.table import rows_for

    runtime = current_runtime()
    out: dict[str, bool] = {}
    for status in runtime.seams if runtime else []:
        if status.state != "patched":
            continue
        if any(row.kind is SeamKind.INSTANCE_SHIM for row in rows_for(status.name)):
            continue  # shims host objects as they are made; nothing at class level carries __wrapped__
        module, _, attribute = status.target.partition(":")
        try:
            _, _, obj = instrumentation._resolve(module, attribute)
        except (ImportError, AttributeError):
            out[status.target] = False
            continue
        out[status.target] = hasattr(obj, "__wrapped__")
    return out


def _lazy(seam: str) -> bool:
    from hermes_session_guard import current_runtime
    from hermes_session_guard.hostinfo import parse_version
    from hermes_session_guard.seams.table import select_row

    runtime = current_runtime()
    row = select_row(seam, parse_version(runtime.host_version)) if runtime and runtime.host_version else None
    return bool(row and row.lazy)


def pytest_configure(config: pytest.Config) -> None:
    for marker in ("integration", "real_concurrent_gate", "real_agent_prewarm"):
        config.addinivalue_line("markers", f"{marker}: declared by Hermes's own pyproject")
    if not GUARDED:
        return
    import hermes_session_guard
    from hermes_session_guard.hooks.manager import get_plugin_manager
    from hermes_session_guard.hooks.specs import hookimpl

    hookimpl(_CompressionCounter.session_guard_before_compression)
    get_plugin_manager().register(_counter, name="hermes-suite-counter")
    runtime = hermes_session_guard.install()
    bad = [f"{s.name}: {s.state} ({s.reason})" for s in runtime.seams
           if s.state not in ("patched", "not-needed") and not (s.state == "pending" and _lazy(s.name))]
    if bad or not runtime.seams:
        raise pytest.UsageError(f"session guard not fully installed on Hermes {runtime.host_version}: {bad}")
    if not all(_patched_targets().values()):
        raise pytest.UsageError(f"session guard reports patched seams that are not wrapped: {_patched_targets()}")


def _guard_line() -> str:
    if not GUARDED:
        return "session guard: NOT installed (baseline run)"
    from hermes_session_guard import current_runtime

    runtime = current_runtime()
    if runtime is None:
        return "session guard: NOT installed although requested"
    states: dict[str, list[str]] = {}
    for status in runtime.seams:
        states.setdefault(status.state, []).append(status.name)
    seams = "; ".join(f"{state}: {', '.join(names)}" for state, names in sorted(states.items()))
    return f"session guard: installed on Hermes {runtime.host_version}: {seams}"


def pytest_report_header(config: pytest.Config) -> str:
    return _guard_line()


@pytest.fixture(autouse=True)
def _session_guard_stays_installed(request: pytest.FixtureRequest) -> Iterator[None]:
    if GUARDED:
        import hermes_session_guard

        if not hermes_session_guard.is_installed() or not all(_patched_targets().values()):
            _reinstalled.append(request.node.nodeid)
            hermes_session_guard.uninstall()
            hermes_session_guard.install()
    yield


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(_guard_line())
    if GUARDED:
        terminalreporter.write_line(f"session guard: compressions through the guard: {len(_counter.sessions)}")
        terminalreporter.write_line(
            f"session guard: patch found missing and re-applied before {len(_reinstalled)} test(s)"
            + (f": {', '.join(_reinstalled)}" if _reinstalled else "")
        )
