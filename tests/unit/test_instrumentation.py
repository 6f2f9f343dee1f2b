"""install()/uninstall() against a stand-in host module: idempotent, reversible,
refuses unknown versions and targets whose signature changed."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from hermes_session_guard.seam_behaviour import Strategy
from hermes_session_guard.seams import apply as instrumentation
from hermes_session_guard.seams import compression_entry
from hermes_session_guard.seams import table as seams


def _host_module() -> types.ModuleType:
    mod = types.ModuleType("fake_host_run_agent")

    class AIAgent:
        def _compress_context(self, messages: list, system_message: str, **kw: Any) -> tuple[list, str]:
            return messages[:1], system_message

    mod.AIAgent = AIAgent  # type: ignore[attr-defined]
    return mod


@pytest.fixture
def fake_table(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    mod = _host_module()
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    row = seams.SeamRow(
        seam="compression", since=(1, 0, 0), until=(2, 0, 0), module=mod.__name__,
        attribute="AIAgent._compress_context", params=("self", "messages", "system_message"),
        wrapper=seams.compression_wrapper, failure_policy="open", behaviour={"strategy": Strategy.DETACH_DB},
    )
    monkeypatch.setattr(seams, "SEAMS", (row,))
    monkeypatch.setattr(instrumentation, "_reported", set())
    instrumentation.uninstall()
    yield mod
    instrumentation.uninstall()


def test_install_wraps_once_and_uninstall_restores_the_original(fake_table: types.ModuleType) -> None:
    original = fake_table.AIAgent.__dict__["_compress_context"]
    rt = instrumentation.install(version="1.2.0")
    assert [(s.name, s.state) for s in rt.seams] == [("compression", "patched")]
    wrapped = fake_table.AIAgent.__dict__["_compress_context"]
    assert wrapped is not original
    assert instrumentation.install(version="1.2.0") is rt  # idempotent: no second wrapper
    assert fake_table.AIAgent.__dict__["_compress_context"] is wrapped
    instrumentation.uninstall()
    assert fake_table.AIAgent.__dict__["_compress_context"] is original
    assert instrumentation.current_runtime() is None


def test_older_unknown_version_patches_nothing(fake_table: types.ModuleType) -> None:
    original = fake_table.AIAgent.__dict__["_compress_context"]
    rt = instrumentation.install(version="0.9.0")
    (status,) = rt.seams
    assert status.state == "skipped" and "0.9.0" in status.reason and "1.0.0" in status.reason
    assert fake_table.AIAgent.__dict__["_compress_context"] is original


def test_newer_unknown_version_never_gets_the_compression_seam(fake_table: types.ModuleType) -> None:
    original = fake_table.AIAgent.__dict__["_compress_context"]
    rt = instrumentation.install(version="9.0.0")
    (status,) = rt.seams
    assert status.state == "skipped" and "never patched on a signature match alone" in status.reason
    assert not rt.host_in_table and fake_table.AIAgent.__dict__["_compress_context"] is original


def test_changed_signature_is_refused(fake_table: types.ModuleType) -> None:
    def other(self: Any, conversation: list) -> tuple[list, str]:
        return conversation, ""

    fake_table.AIAgent._compress_context = other
    rt = instrumentation.install(version="1.0.0")
    (status,) = rt.seams
    assert status.state == "skipped" and "signature" in status.reason
    assert fake_table.AIAgent.__dict__["_compress_context"] is other


def test_missing_target_is_refused(fake_table: types.ModuleType) -> None:
    del fake_table.AIAgent._compress_context
    rt = instrumentation.install(version="1.0.0")
    assert rt.seams[0].state == "skipped" and "not found" in rt.seams[0].reason


def test_guard_failure_before_the_host_skips_the_compression(fake_table: types.ModuleType, mocker: Any) -> None:
    instrumentation.install(version="1.0.0")
    mocker.patch.object(compression_entry, "guarded_compression", side_effect=RuntimeError("guard bug"))
    agent = fake_table.AIAgent()
    messages = [1, 2, 3]
    out, prompt = agent._compress_context(messages, "sys")
    assert out is messages and out == [1, 2, 3] and prompt == "sys"  # the host never ran


def test_select_row_matches_declared_ranges() -> None:
    assert seams.select_row("compression", (0, 14, 0)).behaviour.strategy == "detach_db"
    assert seams.select_row("compression", (0, 19, 0)).behaviour.strategy == "host_in_place"
    assert seams.select_row("compression", (0, 20, 0)).behaviour.strategy == "host_native"
    assert seams.select_row("compression", (0, 23, 0)) is None
    assert seams.select_row("compression", None) is None


def _tracing(label: str, calls: list[str]) -> Any:
    def factory(runtime: Any, row: seams.SeamRow) -> seams.Wrapper:
        def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            calls.append(label)
            return wrapped(*args, **kwargs)

        return wrapper

    return factory


def test_a_second_seam_on_one_attribute_is_refused_and_only_the_first_runs(
    fake_table: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One wrapper per Hermes target: the table never puts two seams on one function
    (test_seam_table), and a second row that does is refused rather than stacked."""
    calls: list[str] = []
    rows = tuple(
        seams.SeamRow(
            seam=name, since=(1, 0, 0), until=(2, 0, 0), module=fake_table.__name__,
            attribute="AIAgent._compress_context", params=("self", "messages", "system_message"),
            wrapper=_tracing(name, calls), failure_policy="open",
        )
        for name in ("first", "second")
    )
    monkeypatch.setattr(seams, "SEAMS", rows)
    original = fake_table.AIAgent.__dict__["_compress_context"]
    rt = instrumentation.install(version="1.0.0")
    assert [(s.name, s.state) for s in rt.seams] == [("first", "patched"), ("second", "failed")]
    assert fake_table.AIAgent()._compress_context([1, 2], "sys") == ([1], "sys")
    assert calls == ["first"]
    instrumentation.uninstall()
    assert fake_table.AIAgent.__dict__["_compress_context"] is original
    calls.clear()
    assert fake_table.AIAgent()._compress_context([1, 2], "sys") == ([1], "sys")
    assert calls == []
