"""Hand-off as an extension: it reaches a compaction only through the guard's own pluggy
hooks, registered by the composition root when ``handoff.enabled`` is true; without it the
core compacts and says so as before, and no packet is written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hermes_session_guard
from hermes_session_guard import audit, redaction_core
from hermes_session_guard.config import parse_config
from hermes_session_guard.handoff import extension, writer
from hermes_session_guard.handoff.redaction import redact_guard_patterns
from hermes_session_guard.hooks import manager
from hermes_session_guard.hooks.manager import get_plugin_manager
from hermes_session_guard.hooks.specs import CompactionEvent, hookimpl
from hermes_session_guard.runtime import Runtime, current_runtime, set_current_runtime
from hermes_session_guard.seam_behaviour import Strategy
from hermes_session_guard.seams.compression import guarded_compression

from .test_compression_contract import Agent, Engine


@pytest.fixture
def handoff_runtime(tmp_path: Path) -> Iterator[Runtime]:
    """The process's runtime, with hand-off enabled and due after every compaction: were
    the extension registered, each compaction would hand off."""
    rt = Runtime(config=parse_config({"handoff": {"enabled": True, "after_compressions": 1}}),
                 host_version="0.19.0", fixed_home=tmp_path)
    before = current_runtime()
    set_current_runtime(rt)
    yield rt
    set_current_runtime(before)
    rt.close()


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The calls the extension makes to the hand-off writer."""
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(writer, "after_compression", lambda *args: calls.append(args))
    return calls


@pytest.fixture
def switched() -> Iterator[None]:
    """Leaves the extension registered as it found it."""
    was_on = get_plugin_manager().get_plugin(extension.NAME) is extension
    yield
    manager.switch_extension(extension.NAME, extension, was_on)


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []

    @hookimpl
    def session_guard_compaction_event(self, event: CompactionEvent, agent: Any) -> None:
        self.events.append(event.name)


def _compact(runtime: Runtime, db: Any) -> tuple[Agent, list[dict[str, Any]], list[str]]:
    recorder = Recorder()
    pm = get_plugin_manager()
    pm.register(recorder, name="test-handoff-extension-recorder")
    try:
        agent = Agent(db, Engine())
        messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(10)]
        out, _ = guarded_compression(runtime, Strategy.DETACH_DB, agent, messages,
                                     lambda: agent._compress_context(messages, "s"))
    finally:
        pm.unregister(name="test-handoff-extension-recorder")
    return agent, out, recorder.events


def test_the_core_compacts_with_the_extension_unregistered_and_writes_no_packet(
        handoff_runtime: Runtime, db: Any, handed: list, switched: None, tmp_path: Path) -> None:
    manager.switch_extension(extension.NAME, extension, False)
    assert get_plugin_manager().get_plugin(extension.NAME) is None
    _, out, events = _compact(handoff_runtime, db)
    assert len(out) == 3 and events == ["compaction.started", "compaction.completed"]
    assert handed == []
    assert not (tmp_path / "handoffs").exists()
    names = [e["event"] for e in audit.read_events(handoff_runtime.audit_path)]
    assert "compression.done" in names and not any(n.startswith("handoff.") for n in names)


def test_the_extension_hears_of_the_compaction_through_pluggy(
        handoff_runtime: Runtime, db: Any, handed: list, switched: None) -> None:
    manager.switch_extension(extension.NAME, extension, True)
    assert get_plugin_manager().get_plugin(extension.NAME) is extension
    agent, out, events = _compact(handoff_runtime, db)
    assert events == ["compaction.started", "compaction.completed"]
    ((runtime, got_agent, session_id, op_id, compressed),) = handed
    assert runtime is handoff_runtime and got_agent is agent and session_id == "S1" and op_id
    assert compressed is out  # the list the conversation continues with: hand-off may replace it in place


@pytest.mark.parametrize("enabled", [True, False])
def test_install_registers_the_extension_as_handoff_enabled_says(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, switched: None, enabled: bool) -> None:
    rt = Runtime(config=parse_config({"handoff": {"enabled": enabled}}), host_version="0.19.0", fixed_home=tmp_path)
    monkeypatch.setattr(hermes_session_guard, "_switch_on", lambda config: rt)
    manager.switch_extension(extension.NAME, extension, not enabled)
    try:
        assert hermes_session_guard.install(rt.config) is rt
        assert (get_plugin_manager().get_plugin(extension.NAME) is extension) is enabled
        monkeypatch.setattr(hermes_session_guard, "_switch_on", lambda config: None)  # session_guard.enabled: false
        hermes_session_guard.install({"enabled": False})
        assert get_plugin_manager().get_plugin(extension.NAME) is None
    finally:
        rt.close()


def test_a_manager_built_later_registers_a_switched_on_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manager, "_manager", None)
    monkeypatch.setattr(manager, "_switched_on", {})
    monkeypatch.setattr(manager, "_entry_points", lambda: [])
    manager.switch_extension(extension.NAME, extension, True)
    pm = manager.get_plugin_manager()
    assert pm.get_plugin(extension.NAME) is extension and pm.get_plugin("builtin") is not None
    pm.check_pending()
    manager.switch_extension(extension.NAME, extension, False)
    assert pm.get_plugin(extension.NAME) is None and manager._switched_on == {}


def test_the_audit_mask_runs_the_bound_pass_and_its_own_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The composition root binds the hand-off extension's full pattern pass; unbound, the
    bottom layer's own pass still masks private keys and token shapes."""
    assert redaction_core._pattern_pass is redact_guard_patterns
    pgpass = "db.example.com:5432:app:alice:Xq7-pLm2vR9t"  # a form only the full pass knows
    assert "Xq7-pLm2vR9t" not in redaction_core.mask_secrets(pgpass)
    monkeypatch.setattr(redaction_core, "_pattern_pass", redaction_core.own_pass)
    key = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2"
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\n-----END OPENSSH PRIVATE KEY-----"
    out = redaction_core.mask_secrets(f"token {key} and\n{pem}\nrest")
    assert key not in out and "b3BlbnNzaC1" not in out and out.count(redaction_core.MASK) == 2 and "rest" in out
    assert redaction_core.mask_secrets("op 4f2a session S1 ended: 3 messages") == "op 4f2a session S1 ended: 3 messages"
