"""The public install()/uninstall() pair on the real host, in every import ordering, and a Hermes release the
seam table does not know (a faked version string, with and without host attributes)."""

from __future__ import annotations

import inspect
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import hermes_session_guard
from hermes_session_guard.seam_behaviour import SeamKind
from hermes_session_guard.seams import apply as instrumentation
from hermes_session_guard.seams import table as seams
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from .conftest import HERMES_VERSION, HOST, HOST_ROW, new_agent

SID = "20260601_120000_abcdef12"
SYSTEM = "You are a test agent."


def _host_targets(inherited: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every seam-table target that exists on this host, as the object stored on its owner.
    A class attribute it inherits (0.19's HermesCLI gets one from a mixin another row wraps;
    0.20+'s SessionDB its export methods from a mixin) goes to ``inherited`` instead."""
    found = {}
    for row in seams.SEAMS:
        try:
            parent, name, current = instrumentation._resolve(row.module, row.attribute)
        except (ImportError, AttributeError, NameError):  # NameError: 0.22.2's tui_gateway.server on Python 3.11
            continue
        if isinstance(parent, type) and name not in parent.__dict__:
            if inherited is not None:
                inherited[row.target] = inspect.getattr_static(parent, name)
            continue
        found[row.target] = parent.__dict__[name] if isinstance(parent, type) else current
    return found


def _compress_keeps_the_id(db: Any, llm: FakeLLMServer, home: Path) -> list[Any]:
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, "rotate")  # the host would rotate: only the guard keeps the id
    probe.mark_flushed(agent, messages)
    with probe.capture_host_compression_logs() as lines:
        compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    assert len(compressed) < len(messages)
    assert agent.session_id == SID
    assert set(probe.session_ids_in(lines)) == {SID}
    rows = probe.sessions_table(home / "state.db")
    assert [r["id"] for r in rows] == [SID] and rows[0]["ended_at"] is None
    live = [m["content"] for m in probe.live_messages(home / "state.db", SID)]
    assert live == [m["content"] for m in compressed]
    runtime = hermes_session_guard.current_runtime()
    assert len(runtime.store_for(home / "state.db").list_snapshots(SID)) == 1
    return compressed


def test_install_uninstall_round_trip_restores_every_original(no_guard: None) -> None:
    inherited: dict[str, Any] = {}
    originals = _host_targets(inherited)
    assert HOST_ROW is not None and HOST_ROW.target in originals

    first = hermes_session_guard.install()
    again = hermes_session_guard.install()
    assert again is first
    (status,) = [s for s in first.seams if s.name == "compression"]
    assert (status.state, status.target, status.row) == ("patched", HOST_ROW.target, HOST_ROW.range_text)
    # instance shims patch host objects, not their row's target: that must stay the host's own
    shims = {row.seam for row in seams.SEAMS if row.kind is SeamKind.INSTANCE_SHIM and row.covers(HOST) and row.patches}
    lazy = {row.seam for row in seams.SEAMS if row.lazy and row.covers(HOST)}
    # a lazy shim waits until Hermes imports its module (the dashboard's, where fastapi is installed)
    assert shims and all(s.state == "patched" or (s.name in lazy and s.state == "pending")
                         for s in first.seams if s.name in shims)
    wrapped = Counter(s.target for s in first.seams if s.state == "patched" and s.name not in shims)
    assert HOST_ROW.target in wrapped
    patched = _host_targets()
    for target, obj in patched.items():
        original = originals[target] if target in originals else inherited[target]  # a row wraps it on its owner
        if target in wrapped:
            assert obj is not original
            for _ in range(wrapped[target]):  # one wrapper per seam on it (two seams may share one)
                obj = obj.__wrapped__
            assert obj is original, target
        else:
            assert obj is original, f"{target} patched but not by a row for Hermes {HERMES_VERSION}"

    hermes_session_guard.uninstall()
    inherited_again: dict[str, Any] = {}
    restored = _host_targets(inherited_again)
    assert restored.keys() == originals.keys() and inherited_again.keys() == inherited.keys()
    for target, original in originals.items():
        assert restored[target] is original, target
    assert not hermes_session_guard.is_installed()


def test_unguarded_host_rotates_after_uninstall(no_guard: None, db: Any, llm: FakeLLMServer, home: Path) -> None:
    """uninstall() really hands compression back to Hermes: its own rotation happens again."""
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, "rotate")
    probe.mark_flushed(agent, messages)
    agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    assert agent.session_id != SID


def test_a_newer_release_gets_only_observe_seams_and_compaction_stays_hermes_s(
    no_guard: None, db: Any, llm: FakeLLMServer, home: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A release newer than the table (this host, its version faked as 0.23.0): every target
    still verifies by signature, yet nothing that changes what Hermes does is patched; the
    read-only and display seams are, and a compression is Hermes's own."""
    with monkeypatch.context() as mp:  # undone before no_guard installs the real guard again
        mp.setattr(instrumentation, "installed_version", lambda: "0.23.0")
        mp.setattr(instrumentation, "_reported", set())
        with caplog.at_level(logging.WARNING, logger="hermes_session_guard"):
            runtime = hermes_session_guard.install()
        try:
            states = {s.name: s for s in runtime.seams}
            assert states["compression"].state == "skipped"
            assert "never patched on a signature match alone" in states["compression"].reason
            for status in runtime.seams:
                if status.state in ("patched", "not-needed"):
                    assert all(r.effect == "observe" for r in seams.rows_for(status.name)
                               if r.range_text == status.row), status.name
            assert any(s.state == "patched" for s in runtime.seams)  # the display and search rows
            assert not runtime.host_in_table and "Hermes 0.23.0 is not a tested release" in runtime.compat_note
            assert len([r for r in caplog.records if "not a tested release" in r.getMessage()]) == 1
            parent, name, target = instrumentation._resolve(HOST_ROW.module, HOST_ROW.attribute)
            assert not hasattr(target, "__wrapped__")  # Hermes's own compression, unwrapped
        finally:
            hermes_session_guard.uninstall()


# -- import orderings, each in a fresh interpreter --------------------------------------
_ORDERING = r'''
import json, sys

import wrapt

ordering = sys.argv[1]


def install():
    import hermes_session_guard
    return hermes_session_guard.install()


def uninstall():
    import hermes_session_guard
    hermes_session_guard.uninstall()


class _MidImport:
    """Installs the guard while ``run_agent`` is half imported (in sys.modules, no AIAgent yet)."""
    fired = False

    def find_spec(self, name, path=None, target=None):
        module = sys.modules.get("run_agent")
        if not self.fired and module is not None and not hasattr(module, "AIAgent"):
            self.fired = True
            install()
        return None


if ordering == "install, import":
    install()
    import run_agent
elif ordering == "import, install":
    import run_agent
    install()
elif ordering == "half-imported run_agent":
    hook = _MidImport()
    sys.meta_path.insert(0, hook)
    import run_agent
    assert hook.fired, "run_agent imported nothing while half imported"

elif ordering == "install, uninstall, install":
    import run_agent
    install()
    uninstall()
    install()
elif ordering == "install, uninstall":
    import run_agent
    install()
    uninstall()

import importlib
import time

import hermes_session_guard
from hermes_session_guard.hostinfo import installed_version, parse_version
from hermes_session_guard.seams import apply, table

host = parse_version(installed_version())
# the rows the guard patches on install (a lazy row waits for Hermes to import a display module)
rows = [row for row in table.SEAMS if row.wrapper is not None and row.covers(host) and not row.lazy]
for row in rows:  # every target's module imported now (Hermes's threads import some at their own pace)
    try:
        importlib.import_module(row.module)
    except Exception:
        pass
# rows whose module was half imported at install wait until it is done: patched at the next
# import or by the guard's watcher within milliseconds (seams/apply.py); wait for that, not a time
deadline = time.monotonic() + 30
runtime = hermes_session_guard.current_runtime()
while runtime is not None and time.monotonic() < deadline and any(
        s.state == "pending" and apply.module_state(s.target.partition(":")[0]) == "ready" for s in runtime.seams):
    time.sleep(0.005)
depths = {}
for row in rows:
    try:
        parent, name, obj = apply._resolve(row.module, row.attribute)
    except (ImportError, AttributeError, NameError):
        continue
    if isinstance(parent, type):
        if name not in parent.__dict__:  # inherited: wrapped on its owner, another row's target
            continue
        obj = parent.__dict__[name]
    depth = 0
    while isinstance(obj, wrapt.FunctionWrapper):
        depth, obj = depth + 1, obj.__wrapped__
    depths[row.target] = depth
states = {s.name: s.state for s in runtime.seams} if runtime is not None else {}
with open(sys.argv[2], "w", encoding="utf-8") as out:  # not stdout: a TUI module may take it over
    json.dump({"depths": depths, "compression": states.get("compression")}, out)
'''


def _ordering(ordering: str, home: Path) -> dict[str, Any]:
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "HERMES_HOME": str(home)}
    env.pop("HERMES_SESSION_ID", None)
    result = home / "ordering.json"
    done = subprocess.run([sys.executable, "-c", _ORDERING, ordering, str(result)], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return dict(json.loads(result.read_text(encoding="utf-8")))


def test_every_import_ordering_patches_the_same_targets_once(home: Path) -> None:
    """ddtrace-style orderings in fresh interpreters: the guard installed before Hermes is
    imported, while ``run_agent`` is half imported, or again after an uninstall wraps the
    same targets as installing after the import, each exactly once; uninstall leaves none."""
    baseline = _ordering("import, install", home)
    assert baseline["compression"] == "patched" and HOST_ROW is not None
    assert baseline["depths"].get(HOST_ROW.target) == 1
    assert all(depth >= 1 for depth in baseline["depths"].values()), baseline
    for ordering in ("install, import", "half-imported run_agent", "install, uninstall, install"):
        got = _ordering(ordering, home)
        differing = {t: (baseline["depths"].get(t), got["depths"].get(t))
                     for t in baseline["depths"].keys() | got["depths"].keys()
                     if baseline["depths"].get(t) != got["depths"].get(t)}
        assert differing == {} and got["compression"] == "patched", ordering
    removed = _ordering("install, uninstall", home)
    # an inherited method a row wrapped on the class is gone from it again (inherited once more)
    assert removed["depths"][HOST_ROW.target] == 0 and set(removed["depths"].values()) == {0}
    assert removed["depths"].keys() <= baseline["depths"].keys()
