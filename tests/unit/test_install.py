"""install()/uninstall() against a fake host: idempotent, reversible, and careful with
releases outside the seam table (patch only what verifies by signature, say so once)."""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

import hermes_session_guard
from hermes_session_guard.seam_behaviour import Effect, Strategy
from hermes_session_guard.seams import apply as instrumentation
from hermes_session_guard.seams import table as seams
from hermes_session_guard.seams.table import SeamRow

calls: list[str] = []


def recording_wrapper(runtime: Any, row: SeamRow) -> Any:
    """Stands in for the compression wrapper: records which row handled the call."""

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        calls.append(row.range_text)
        return wrapped(*args, **kwargs)

    return wrapper


def _row(since: tuple[int, ...], until: tuple[int, ...], module: str, attribute: str, params: tuple[str, ...],
         strategy: str, requires: tuple[str, ...] = (), effect: Effect = Effect.OBSERVE) -> SeamRow:
    """A fake row; ``observe`` by default, the only rows a release newer than the table may get."""
    return SeamRow(
        seam="compression", since=since, until=until, module=module, attribute=attribute, params=params,
        wrapper=recording_wrapper, failure_policy="open", behaviour={"strategy": strategy},
        note=f"fake row {since}", requires=requires, effect=effect,
    )


OLD = _row((0, 13, 0), (0, 15, 0), "fake_run_agent", "AIAgent._compress_context",
           ("self", "messages", "system_message"), Strategy.DETACH_DB)
MID = _row((0, 15, 0), (0, 18, 0), "fake_compression", "compress_context",
           ("agent", "messages", "system_message"), Strategy.DETACH_DB)
NEW = _row((0, 18, 2), (0, 20, 0), "fake_compression", "compress_context",
           ("agent", "messages", "system_message"), Strategy.HOST_IN_PLACE,
           requires=("fake_state:SessionDB.archive_and_compact",))


class FakeHost:
    def __init__(self) -> None:
        self.run_agent = types.ModuleType("fake_run_agent")
        self.compression = types.ModuleType("fake_compression")
        self.state = types.ModuleType("fake_state")

        class AIAgent:
            def _compress_context(self, messages: list, system_message: str, *, approx_tokens: int = 0) -> tuple:
                return messages[:1], system_message

        def compress_context(agent: Any, messages: list, system_message: str, *, force: bool = False) -> tuple:
            return messages[:1], system_message

        class SessionDB:
            def archive_and_compact(self, session_id: str, messages: list) -> int:
                return len(messages)

        self.run_agent.AIAgent = AIAgent
        self.compression.compress_context = compress_context
        self.state.SessionDB = SessionDB
        self.method = AIAgent.__dict__["_compress_context"]
        self.function = compress_context

    def modules(self) -> dict[str, types.ModuleType]:
        return {"fake_run_agent": self.run_agent, "fake_compression": self.compression, "fake_state": self.state}


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHost]:
    instrumentation.uninstall()
    fake = FakeHost()
    for name, module in fake.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(seams, "SEAMS", (OLD, MID, NEW))
    monkeypatch.setattr(instrumentation, "_reported", set())
    calls.clear()
    yield fake
    instrumentation.uninstall()


def _fake_version(monkeypatch: pytest.MonkeyPatch, version: str | None) -> None:
    monkeypatch.setattr(instrumentation, "installed_version", lambda: version)


def _status(runtime: Any) -> Any:
    (status,) = runtime.seams
    return status


def _untested_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "not a tested release" in r.getMessage()]


def test_install_patches_the_row_for_the_installed_release(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_version(monkeypatch, "0.19.0")
    runtime = hermes_session_guard.install()
    status = _status(runtime)
    assert (status.state, status.target, status.row) == ("patched", NEW.target, NEW.range_text)
    assert runtime.host_in_table and runtime.compat_note == ""
    assert host.compression.compress_context.__wrapped__ is host.function
    assert host.compression.compress_context(None, [1, 2, 3], "sp") == ([1], "sp")
    assert calls == [NEW.range_text]
    assert host.run_agent.AIAgent.__dict__["_compress_context"] is host.method  # other rows untouched


def test_install_is_idempotent(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_version(monkeypatch, "0.14.0")
    first = hermes_session_guard.install()
    patched = host.run_agent.AIAgent.__dict__["_compress_context"]
    second = hermes_session_guard.install({"lock": {"wait_seconds": 5}})
    assert second is first
    assert second.config.lock.wait_seconds == 5  # a second call only updates the configuration
    assert host.run_agent.AIAgent.__dict__["_compress_context"] is patched
    assert patched.__wrapped__ is host.method  # wrapped once, not twice
    host.run_agent.AIAgent()._compress_context([1, 2], "sp")
    assert calls == [OLD.range_text]


def test_uninstall_restores_every_original_object(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_version(monkeypatch, "0.14.0")
    hermes_session_guard.install()
    hermes_session_guard.uninstall()
    assert host.run_agent.AIAgent.__dict__["_compress_context"] is host.method
    assert not hermes_session_guard.is_installed() and hermes_session_guard.current_runtime() is None
    hermes_session_guard.uninstall()  # a second uninstall is a no-op
    assert host.run_agent.AIAgent.__dict__["_compress_context"] is host.method
    hermes_session_guard.install()  # and the pair can be repeated
    assert host.run_agent.AIAgent.__dict__["_compress_context"].__wrapped__ is host.method
    hermes_session_guard.uninstall()
    assert host.run_agent.AIAgent.__dict__["_compress_context"] is host.method


def test_install_with_the_guard_disabled_patches_nothing(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_version(monkeypatch, "0.19.0")
    hermes_session_guard.install()
    assert hermes_session_guard.install({"enabled": False}) is None
    assert host.compression.compress_context is host.function
    assert not hermes_session_guard.is_installed()


def test_invalid_enabled_raises_before_patching(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_version(monkeypatch, "0.19.0")
    with pytest.raises(hermes_session_guard.ConfigError) as err:
        hermes_session_guard.install({"enabled": "maybe", "lock": {"wait_seconds": -1}})
    assert err.value.key == "session_guard.enabled"
    assert host.compression.compress_context is host.function


def test_an_invalid_option_patches_with_its_default_and_warns(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _fake_version(monkeypatch, "0.19.0")
    monkeypatch.setattr(instrumentation, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="hermes_session_guard"):
        runtime = hermes_session_guard.install({"lock": {"wait_seconds": -1}})
    assert runtime is not None and runtime.config.lock.wait_seconds == 2.0
    assert host.compression.compress_context is not host.function
    warned = [r for r in caplog.records if "session_guard.lock.wait_seconds" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert "-1" in warned[0].getMessage() and "default 2.0" in warned[0].getMessage()


def test_unknown_newer_release_uses_the_newest_row_that_verifies(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _fake_version(monkeypatch, "0.20.0")
    with caplog.at_level(logging.WARNING, logger="hermes_session_guard"):
        runtime = hermes_session_guard.install()
    status = _status(runtime)
    assert (status.state, status.row) == ("patched", NEW.range_text)
    assert "0.20.0 is not in the seam table" in status.reason and "verified by signature" in status.reason
    assert not runtime.host_in_table
    assert "Hermes 0.20.0 is not a tested release" in runtime.compat_note
    assert f"compression -> {NEW.target}" in runtime.compat_note
    assert len(_untested_warnings(caplog)) == 1


def test_unknown_newer_release_never_patches_a_seam_that_changes_behaviour_on_a_signature_alone(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    changing = [_row(r.since, r.until, r.module, r.attribute, r.params, str(r.behaviour.strategy), r.requires,
                     effect=Effect.CHANGES) for r in (OLD, MID, NEW)]
    monkeypatch.setattr(seams, "SEAMS", tuple(changing))
    _fake_version(monkeypatch, "0.20.0")
    runtime = hermes_session_guard.install()
    status = _status(runtime)
    assert status.state == "skipped"
    assert "changes what Hermes does and is never patched on a signature match alone" in status.reason
    assert host.compression.compress_context is host.function  # every target verifies; none is wrapped
    assert "Skipped: compression" in runtime.compat_note
    _fake_version(monkeypatch, "0.19.0")
    hermes_session_guard.uninstall()
    assert _status(hermes_session_guard.install()).state == "patched"  # its own release: the row is the contract


def test_the_untested_release_is_logged_once_per_process(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _fake_version(monkeypatch, "0.20.0")
    with caplog.at_level(logging.WARNING, logger="hermes_session_guard"):
        for _ in range(3):
            hermes_session_guard.install()
            hermes_session_guard.uninstall()
    assert len(_untested_warnings(caplog)) == 1


def test_unknown_release_with_a_missing_requirement_falls_back(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_version(monkeypatch, "0.20.0")
    monkeypatch.delattr(host.state.SessionDB, "archive_and_compact")
    status = _status(hermes_session_guard.install())
    assert (status.state, status.row) == ("patched", MID.range_text)  # same target, the strategy without in-place
    host.compression.compress_context(None, [1, 2], "sp")
    assert calls == [MID.range_text]


def test_unknown_release_with_a_missing_target_falls_back_to_an_older_target(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_version(monkeypatch, "0.20.0")
    monkeypatch.delattr(host.compression, "compress_context")
    status = _status(hermes_session_guard.install())
    assert (status.state, status.target, status.row) == ("patched", OLD.target, OLD.range_text)


def test_unknown_release_with_no_verifiable_target_patches_nothing(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _fake_version(monkeypatch, "0.20.0")
    monkeypatch.delattr(host.compression, "compress_context")
    monkeypatch.delattr(host.run_agent.AIAgent, "_compress_context")
    with caplog.at_level(logging.WARNING, logger="hermes_session_guard"):
        runtime = hermes_session_guard.install()
    status = _status(runtime)
    assert status.state == "skipped" and status.row == ""
    for row in (NEW, MID, OLD):
        assert f"row {row.range_text}: target {row.target} not found" in status.reason
    assert "patched by signature: none. Skipped: compression (no row verifies: target" in runtime.compat_note
    assert len(runtime.compat_note) < 300
    (line,) = _untested_warnings(caplog)
    assert "Skipped: compression" in line and "not found" in line


def test_unknown_release_with_a_changed_signature_is_not_patched(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_version(monkeypatch, "0.20.0")

    def compress_context(agent: Any, transcript: list, prompt: str) -> tuple:  # renamed parameters
        return transcript, prompt

    monkeypatch.setattr(host.compression, "compress_context", compress_context)
    monkeypatch.delattr(host.run_agent.AIAgent, "_compress_context")
    status = _status(hermes_session_guard.install())
    assert status.state == "skipped"
    assert "signature differs from the declared (agent, messages, system_message, ...)" in status.reason
    assert host.compression.compress_context is compress_context


def test_release_in_a_gap_between_rows_is_verified_by_signature(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_version(monkeypatch, "0.18.1")
    monkeypatch.delattr(host.state.SessionDB, "archive_and_compact")  # a release before in-place compaction
    runtime = hermes_session_guard.install()
    assert not runtime.host_in_table
    assert _status(runtime).row == MID.range_text


def test_release_older_than_the_table_is_not_patched(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_version(monkeypatch, "0.12.0")
    runtime = hermes_session_guard.install()
    status = _status(runtime)
    assert status.state == "skipped"
    assert "older than the oldest supported release 0.13.0" in status.reason
    assert host.run_agent.AIAgent.__dict__["_compress_context"] is host.method


def test_known_release_whose_target_is_missing_is_skipped_not_guessed(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _fake_version(monkeypatch, "0.17.0")
    monkeypatch.delattr(host.compression, "compress_context")
    with caplog.at_level(logging.WARNING, logger="hermes_session_guard"):
        runtime = hermes_session_guard.install()
    status = _status(runtime)
    assert status.state == "skipped" and "target fake_compression:compress_context not found" in status.reason
    assert runtime.host_in_table  # a tested release: no signature search, the row is the contract
    assert any("seam compression skipped" in r.getMessage() for r in caplog.records)


def test_hermes_not_installed(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_version(monkeypatch, None)
    status = _status(hermes_session_guard.install())
    assert (status.state, status.reason) == ("skipped", "hermes-agent is not installed")


def test_a_release_newer_than_the_table_patches_what_selftest_verified_on_this_install(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    from hermes_session_guard.seams import verification

    changing = [_row(r.since, r.until, r.module, r.attribute, r.params, str(r.behaviour.strategy), r.requires,
                     effect=Effect.CHANGES) for r in (OLD, MID, NEW)]
    monkeypatch.setattr(seams, "SEAMS", tuple(changing))
    record = tmp_path / verification.RECORD_NAME
    monkeypatch.setattr(verification, "record_path", lambda: record)
    monkeypatch.setattr(verification, "fingerprint", lambda version: f"code of {version}")
    monkeypatch.delenv(verification.TRIAL_ENV, raising=False)
    _fake_version(monkeypatch, "0.23.5")

    with caplog.at_level(logging.WARNING, logger="hermes_session_guard"):
        runtime = hermes_session_guard.install()
    assert _status(runtime).state == "skipped"  # no record: as before, plus what to do
    (line,) = _untested_warnings(caplog)
    assert "until `hermes-session-guard selftest` verifies this install" in line and "no verification recorded" in line
    assert host.compression.compress_context is host.function
    hermes_session_guard.uninstall()

    verification.write_record({"hermes_version": "0.23.5", "fingerprint": "code of 0.23.5",
                               "verified_at": "2026-12-07T21:00:00Z", "rows": {"compression": NEW.range_text}})
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hermes_session_guard"):
        status = _status(hermes_session_guard.install())
    assert (status.state, status.row) == ("patched", NEW.range_text)
    assert "verified on this install by selftest at 2026-12-07T21:00:00Z" in status.reason
    assert not _untested_warnings(caplog)  # verified: an info line, no warning
    host.compression.compress_context(None, [1, 2], "sp")
    assert calls == [NEW.range_text]
    hermes_session_guard.uninstall()

    monkeypatch.setattr(verification, "fingerprint", lambda version: "code after hermes update")
    assert _status(hermes_session_guard.install()).state == "skipped"
    assert host.compression.compress_context is host.function
