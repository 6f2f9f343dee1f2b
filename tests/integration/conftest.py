"""Fixtures that drive the real Hermes installed in this environment."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.hostinfo import installed_version, parse_version
from hermes_session_guard.seam_behaviour import Effect, Strategy
from hermes_session_guard.seams import verification
from hermes_session_guard.seams.row import SeamRow
from hermes_session_guard.seams.table import fallback_rows, host_in_table, select_row
from hermes_session_guard.selftest import probe

from ..fake_llm import ScriptedLLMServer

# The matrix script always installs one: hermes-agent, or a repackaging found by hermes_cli.
HERMES_VERSION = installed_version()

pytestmark = pytest.mark.host

requires_host = pytest.mark.skipif(HERMES_VERSION is None, reason="hermes-agent is not installed here")
HOST = parse_version(HERMES_VERSION) if HERMES_VERSION else (0, 0, 0)
# Hermes 0.21+ compacts a stored history only once a provider reported its real usage
# (docs/compatibility.md, anchor_on_real_usage).
DEFERS_TO_USAGE = HOST >= (0, 21, 0)

# -- what the guard patches here --------------------------------------------------------------
# On a release of the seam table, the table's rows (tested there). On any other release (a
# changed install: scripts/matrix.py's pseudo-releases such as ``0.22.2+relabelled``, made by
# drift_host.py), what ``selftest`` verified on this install (its record, seams/verification.py)
# with the rows the Hermes's capabilities chose; tests of a promise it did not verify skip,
# naming it. Tests follow these rows, never a version number.
IN_TABLE = HERMES_VERSION is not None and host_in_table(HOST)
PLAN = None if IN_TABLE or HERMES_VERSION is None else verification.plan_for(HERMES_VERSION)
UNCHECKED_PROMISE = verification.unchecked_result().name
ALL_PROMISES = (*(p.name for p in verification.PROMISES), UNCHECKED_PROMISE)


def _verified_promises() -> dict[str, str]:
    """Promise -> "" where it holds (every promise on a release of the table), else why not."""
    if IN_TABLE or HERMES_VERSION is None:
        return dict.fromkeys(ALL_PROMISES, "")
    assert PLAN is not None
    if PLAN.mode != verification.VERIFIED:
        return dict.fromkeys(ALL_PROMISES, f"not verified on this install: {PLAN.problem or PLAN.mode}")
    record = verification.read_record() or {}
    verified = set(record.get("promises") or [])
    why = {name: "" if name in verified else f"selftest at {PLAN.verified_at} did not verify it on this install"
           for name in ALL_PROMISES}
    why[UNCHECKED_PROMISE] = f"{verification.UNCHECKED_REASON}; left off outside the seam table"
    return why


PROMISE_PROBLEMS = _verified_promises()


def host_row(seam: str) -> SeamRow | None:
    """The row the guard applies to ``seam`` on this install (``None``: left alone): the
    table's on a tested release, else the row selftest verified, else a read-only row."""
    if PLAN is None:
        return select_row(seam, HOST)
    chosen = PLAN.candidates(seam)
    if chosen is not None:
        return chosen[0][0] if chosen[0] else None
    observe = [row for row in fallback_rows(seam) if row.effect is Effect.OBSERVE]
    return observe[0] if observe else None


HOST_ROW = host_row("compression")
HOST_HAS_IN_PLACE = (HOST_ROW is not None
                     and HOST_ROW.behaviour.strategy in (Strategy.HOST_IN_PLACE, Strategy.HOST_NATIVE))
# 0.20+: Hermes compacts in place under its own lock; the guard takes none (seams/native_compaction.py)
HOST_NATIVE_MODE = HOST_ROW is not None and HOST_ROW.behaviour.strategy == Strategy.HOST_NATIVE

# Host modes worth running: 0.18+ keeps the id by default (in_place) and rotates
# with ``compression.in_place: false``; older hosts always rotate.
MODES = ["in_place", "rotate"] if HOST_HAS_IN_PLACE else ["rotate"]
# On 0.18+ the guarded compression runs in Hermes's in-place path whatever the mode (the guard
# forces it on 0.18-0.19, native mode keeps it on 0.20+), so a guarded test's rotate variant
# repeats its in_place one but for the flag: it is marked ``mode_repeat``. CI's default run leaves
# those out (scripts/matrix.py); the full matrix runs them on 0.18-0.19. Tests of the id contract
# itself and every unguarded reproduction take ``MODES``: both modes, always.
MODE_PARAMS = [pytest.param(m, marks=[pytest.mark.mode_repeat] if m != MODES[0] else []) for m in MODES]


# The promises a host file's tests (``file::test-name prefix``: those tests) rest on beyond the
# compaction contract (every file rests on that), by selftest's names (seams/verification.py):
# on an install outside the seam table a test whose promise selftest did not verify skips, naming it.
FILE_PROMISES: dict[str, tuple[str, ...]] = {
    "test_buffering.py": ("buffered delivery",),
    "test_arrival_during_summary.py": ("buffered delivery",),
    "test_gateway_contract.py": ("buffered delivery",),
    "test_summary_tags.py": ("summary tags",),
    "test_summary_visibility.py": ("summary tags",),
    "test_summary_faults.py": ("summary tags",),
    "test_summary_marker_in_text.py": ("summary tags",),
    "test_turn_order_api.py": (UNCHECKED_PROMISE,),
    "test_turn_order_entry_points.py": (UNCHECKED_PROMISE,),
    "test_turn_order_processes.py": (UNCHECKED_PROMISE,),
    "test_api_responses_runs_turns.py": (UNCHECKED_PROMISE,),
    "test_prompt_during_compaction.py": (UNCHECKED_PROMISE,),
    "test_cli_input_during_compaction.py": (UNCHECKED_PROMISE,),
    # selftest's report there must list every seam patched or not needed
    "test_operator_commands.py::test_selftest_passes_and_reports_each_check": (UNCHECKED_PROMISE,),
    # a gateway killed mid-turn and started again: its turns wait on the dead turn's lease
    "test_buffering.py::test_crash_mid_compression_replays_buffered_messages_once": (UNCHECKED_PROMISE,),
    "test_crash_recovery.py::test_gateway_killed_with_messages_buffered_replays_them_once_on_restart":
        (UNCHECKED_PROMISE,),
    # a hand-off inside a Hermes 0.20+ turn carries the child's turn lease; the turn_history seam gives it back
    "test_handoff.py::test_gateway_fresh_session_moves_routing": (UNCHECKED_PROMISE,),
    "test_handoff.py::test_gateway_message_sent_during_the_fork_turn": (UNCHECKED_PROMISE,),
    "test_handoff.py::test_gateway_failed_routing_save_rolls_the_fork_back": (UNCHECKED_PROMISE,),
    "test_handoff.py::test_a_turn_that_forks_holds_the_childs_turn_lease": (UNCHECKED_PROMISE,),
}
# Files that check the seam table's row for the installed version itself, or make changed
# installs from a release's own: they mean nothing on an install outside the table.
TABLE_FILES: dict[str, str] = {
    "test_install_and_releases.py": "checks the seam table's rows for the installed release by version",
    "test_capabilities_match_table.py": "checks the capabilities against the seam table's row for the installed "
                                        "release by version",
    "test_install_drift.py": "makes its changed installs from a release's own install; this is one already",
    "test_demo.py": "runs the demo, which picks its mode (rotate or in place) by the seam table's row for the "
                    "installed release",
}


def promise_skip(item: Any) -> str | None:
    """Why ``item`` skips on this install (None: it runs)."""
    name = Path(str(item.fspath)).name
    if not IN_TABLE and name in TABLE_FILES:
        return f"Hermes {HERMES_VERSION} is outside the seam table; this file {TABLE_FILES[name]}"
    needed = [p for key, promises in FILE_PROMISES.items() for p in promises
              if key == name or key.startswith(f"{name}::") and item.name.startswith(key.partition("::")[2])]
    for promise in ("compaction", *needed):
        if PROMISE_PROBLEMS.get(promise):
            return (f"the promise '{promise}' is not verified on Hermes {HERMES_VERSION} "
                    f"(outside the seam table): {PROMISE_PROBLEMS[promise]}")
    return None


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if HERMES_VERSION is None:
        skip = pytest.mark.skip(reason="hermes-agent is not installed in this environment")
        for item in items:
            if "integration" in str(item.fspath):
                item.add_marker(skip)
        return
    for item in items:
        if "integration" in str(item.fspath) and (why := promise_skip(item)) is not None:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def llm() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as srv:
        yield srv


@pytest.fixture(scope="session")
def discovered(llm: ScriptedLLMServer) -> Any:
    """Hermes's own plugin discovery loads the guard once per process, from the
    config.yaml of the session-wide HERMES_HOME (plugins.enabled: [session-guard])."""
    probe.write_config(Path(os.environ["HERMES_HOME"]), llm.base_url)
    return probe.discover_guard()


@pytest.fixture(autouse=True)
def _no_transient_retry_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hermes 0.19+ retries a summary call that hit a transport error or a 5xx after 1 s, then
    2 s (``agent.auxiliary_client._TRANSIENT_RETRY_BACKOFF_BASE``). The retries still run here,
    at once: the fake LLM answers immediately, and the wait alone was 18 of test_summary_faults'
    62 s on 0.19.0 (as test_buffering cuts the empty-reply backoff)."""
    if HERMES_VERSION is None:
        return
    try:
        import agent.auxiliary_client as aux
    except ImportError:
        return
    if hasattr(aux, "_TRANSIENT_RETRY_BACKOFF_BASE"):
        monkeypatch.setattr(aux, "_TRANSIENT_RETRY_BACKOFF_BASE", 0.0)


@pytest.fixture
def home(tmp_path: Path, llm: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "hermes_home"
    probe.write_config(h, llm.base_url)
    monkeypatch.setenv("HERMES_HOME", str(h))
    monkeypatch.delenv("HERMES_SESSION_ID", raising=False)
    llm.reset()
    return h


@pytest.fixture
def guard(discovered: Any, home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The guard as Hermes loaded it (patched seams, default config). Hermes 0.20+ loads
    plugins again when a gateway starts on a new home, and ``register`` then applies that
    home's config.yaml; a test that set the guard's options itself keeps them."""
    import hermes_session_guard

    runtime = hermes_session_guard.current_runtime() or hermes_session_guard.install()
    monkeypatch.setattr(hermes_session_guard, "load_config", lambda _home: runtime.config)
    yield runtime


def _register_nothing(ctx: Any) -> None:
    """The plugin's entry point while a test runs Hermes unguarded: Hermes 0.20+ loads
    plugins again for each new HERMES_HOME, and the real ``register`` would patch it again."""


@contextmanager
def unguarded() -> Iterator[None]:
    """Hermes exactly as shipped inside the block: the guard's patches removed, and a plugin
    load on a new home does not put them back. Afterwards the normal guard is back."""
    import hermes_session_guard

    real = hermes_session_guard.register
    hermes_session_guard.uninstall()
    hermes_session_guard.register = _register_nothing
    try:
        yield
    finally:
        hermes_session_guard.register = real
        hermes_session_guard.uninstall()
        hermes_session_guard.install()


@pytest.fixture
def no_guard(discovered: Any, home: Path) -> Iterator[None]:
    """Hermes exactly as shipped: the guard's patches removed for this test. Afterwards
    whatever the test installed itself is removed and the normal guard is back."""
    with unguarded():
        yield


@pytest.fixture
def tui(home: Path) -> Iterator[Any]:
    """Hermes's TUI gateway bound to a transport that keeps its frames (``tui_import``),
    its SessionDB on this home: ``(server module, frames)``."""
    from .tui_import import tui_gateway

    db = probe.open_db(home / "state.db")
    try:
        yield from tui_gateway(db)
    finally:
        db.close()


@pytest.fixture
def db(home: Path) -> Iterator[Any]:
    database = probe.open_db(home / "state.db")
    yield database
    try:
        database.close()
    except Exception:
        pass


def new_agent(db: Any, llm: ScriptedLLMServer, sid: str, mode: str, **kwargs: Any) -> Any:
    agent = probe.make_agent(db, llm.base_url, sid, **kwargs)
    if HOST_HAS_IN_PLACE:
        agent.compression_in_place = mode == "in_place"
    anchor_on_real_usage(agent)
    return agent


def anchor_on_real_usage(agent: Any, history: list[dict[str, Any]] | None = None) -> None:
    """The agent resumes a conversation whose last provider response priced it, as a
    long-lived gateway agent's does: at the rough size of ``history`` when given, else at its
    compression threshold. Hermes 0.21+ otherwise defers the preflight compaction of a
    reloaded history by one response ("not anchored on real usage"); earlier releases trust
    their estimate and have no such reading."""
    compressor = getattr(agent, "context_compressor", None)
    if not (DEFERS_TO_USAGE and hasattr(compressor, "last_real_prompt_tokens")):
        return
    if history is None:
        compressor.last_real_prompt_tokens = compressor.threshold_tokens
        return
    from agent.model_metadata import estimate_messages_tokens_rough

    compressor.last_real_prompt_tokens = estimate_messages_tokens_rough(history)


def log_tags_in(lines: list[str]) -> list[str]:
    """The ``[session]`` tags at the start of captured log lines ("" where a line had none)."""
    return [line[1:line.index("]")] if line.startswith("[") else "" for line in lines]


@functools.cache
def dashboard_unavailable() -> str | None:
    """Why Hermes's dashboard app (``hermes_cli.web_server``) cannot be driven here; None
    when it can. Besides fastapi and httpx, the app must import: 0.15.2's imports a
    ``hermes_cli.dashboard_auth`` package its own wheel lacks (Hermes's dashboard is broken
    as shipped there). Checked once, in a process of its own on an empty home."""
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("httpx") is None:
        return "this Hermes environment has no dashboard (fastapi)"
    with tempfile.TemporaryDirectory(prefix="hsg-dashboard-import-") as home:
        env = {k: v for k, v in os.environ.items() if k != "HERMES_SESSION_ID"}
        done = subprocess.run([sys.executable, "-c", "import hermes_cli.web_server"], capture_output=True,
                              text=True, timeout=180, cwd=home, env={**env, "HERMES_HOME": home})
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no error output"])[-1]
        return f"Hermes's own dashboard does not import on this release ({last})"
    return None
