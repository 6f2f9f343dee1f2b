"""The guard as Hermes loads it: config.yaml, plugin discovery, `hermes session-guard`,
the console script's selftest, and a bad `session_guard:` option."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hermes_session_guard.seam_behaviour import SeamKind
from hermes_session_guard.seams.table import seam_names
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from .conftest import host_row

BIN = Path(sys.executable).parent


def _run(args: list[str], home: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HERMES_HOME=str(home))
    env.pop("HERMES_SESSION_ID", None)
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)


def _hermes_cli() -> list[str]:
    """Hermes's own CLI here: the console script running ``hermes_cli.main:main`` (``hermes``;
    the 0.20.1 repackaging installs it as ``hermesx``)."""
    from importlib import metadata

    for ep in metadata.entry_points(group="console_scripts"):
        if ep.value.replace(" ", "") == "hermes_cli.main:main" and (BIN / ep.name).exists():
            return [str(BIN / ep.name)]
    return [str(BIN / "hermes")]


def _discover_script() -> str:
    return (
        "import json, logging\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from hermes_cli import plugins\n"
        "plugins.discover_plugins()\n"
        "import hermes_session_guard as g\n"
        "rt = g.current_runtime()\n"
        "print('SEAMS', json.dumps(None if rt is None else {s.name: s.state for s in rt.seams}))\n"
    )


def test_discovery_loads_the_guard_from_config_yaml(home: Path, llm: FakeLLMServer) -> None:
    proc = _run([sys.executable, "-c", _discover_script()], home)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("SEAMS "))
    seams = json.loads(line[6:])
    assert seams is not None and seams["compression"] == "patched", proc.stderr[-2000:]


def test_not_listed_in_plugins_enabled_means_not_loaded(home: Path, llm: FakeLLMServer) -> None:
    probe.write_config(home, llm.base_url, plugin_enabled=False)
    proc = _run([sys.executable, "-c", _discover_script()], home)
    assert "SEAMS null" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_bad_option_keeps_its_default_and_the_guard_on_with_one_clear_line(home: Path, llm: FakeLLMServer) -> None:
    probe.write_config(home, llm.base_url, extra={"session_guard": {"lock": {"wait_seconds": "soon"}}})
    proc = _run([sys.executable, "-c", _discover_script()], home)
    assert proc.returncode == 0  # Hermes keeps running
    line = next(x for x in proc.stdout.splitlines() if x.startswith("SEAMS "))
    seams = json.loads(line[6:])
    assert seams is not None and seams["compression"] == "patched", proc.stderr[-2000:]
    assert "session guard DISABLED" not in proc.stderr
    warned = [x for x in proc.stderr.splitlines() if "session_guard.lock.wait_seconds" in x]
    assert len(warned) == 1 and "'soon'" in warned[0] and "default 2.0" in warned[0], proc.stderr[-2000:]


def test_a_bad_enabled_value_disables_the_guard_with_one_clear_line(home: Path, llm: FakeLLMServer) -> None:
    probe.write_config(home, llm.base_url, extra={"session_guard": {"enabled": "maybe"}})
    proc = _run([sys.executable, "-c", _discover_script()], home)
    assert proc.returncode == 0  # Hermes keeps running
    assert "SEAMS null" in proc.stdout
    disabled = [x for x in proc.stderr.splitlines() if "session guard DISABLED" in x]
    assert len(disabled) == 1 and "session_guard.enabled" in disabled[0]


def test_hermes_session_guard_subcommand_lists_snapshots(home: Path, llm: FakeLLMServer, guard: object,
                                                        db: object) -> None:
    from .conftest import new_agent

    messages = probe.seed_messages()
    probe.seed_session(db, "S9", messages)
    agent = new_agent(db, llm, "S9", "rotate")
    probe.mark_flushed(agent, messages)
    agent._compress_context(messages, "sys", approx_tokens=150_000)

    proc = _run([*_hermes_cli(), "session-guard", "snapshots", "S9", "--json"], home)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (snap,) = json.loads(proc.stdout[proc.stdout.index("["):])
    assert snap["snapshot_id"].startswith("S9.snapshot.") and snap["message_count"] == len(messages)


def test_selftest_passes_against_this_hermes(home: Path) -> None:
    proc = _run([str(BIN / "hermes-session-guard"), "selftest", "--json"], home)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["ok"] is True, proc.stdout[-3000:]
    assert {c["name"] for c in report["checks"]} >= {"agent.session_id unchanged", "no child session created"}
    assert any(s["name"] == "compression" and s["state"] == "patched" for s in report["seams"])
    shims = {s["name"]: s for s in report["seams"] if s["reason"].startswith("instance shim")}
    # the release's instance-shim rows (0.20+ adds the relay adapter's send_for_platform)
    # a lazy row stays pending where Hermes itself cannot import its module in this environment
    # (the dashboard's without fastapi, 0.22's TUI on Python 3.11)
    waiting = {s["name"] for s in report["seams"] if s["state"] == "pending"}
    assert all((row := host_row(name)) is not None and row.lazy for name in waiting), waiting
    expected = {name for name in seam_names()
                if (row := host_row(name)) is not None and row.kind == SeamKind.INSTANCE_SHIM} - waiting
    assert set(shims) == expected >= {"engine_compress_shim", "delivery_send_shim", "delivery_edit_shim",
                                      "delivery_draft_shim"}
    assert all(s["state"] == "patched" for s in shims.values()), shims
