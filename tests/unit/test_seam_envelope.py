"""The envelope applies a row's failure policy around its wrapper (ADR 0008, seams/envelope.py):
an error of the guard's own code under ``open`` gives Hermes's result and one log line, under
``closed`` refuses the call; Hermes's own error passes through unchanged under both; Hermes's
call is never made twice; and the seams installed by ``apply`` run inside it."""

from __future__ import annotations

import asyncio
import logging
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import runtime as runtime_module
from hermes_session_guard.config import GuardConfig
from hermes_session_guard.runtime import Runtime
from hermes_session_guard.seams import apply as ins
from hermes_session_guard.seams.envelope import Hermes, enveloped, fails_as
from hermes_session_guard.seams.row import SeamRow


class GuardBug(RuntimeError):
    pass


class HermesError(ValueError):
    pass


def _row(policy: str, wrapper: Any = None, module: str = "sg_envelope_host") -> SeamRow:
    return SeamRow(seam=f"test_{policy}", since=(0, 0, 0), until=(99, 0, 0), module=module, attribute="target",
                   params=("x",), wrapper=wrapper, failure_policy=policy)


class Host:
    """Hermes's function: counts its calls, returns ``("hermes", x)`` or raises ``error``."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.calls, self.error = 0, error

    def __call__(self, x: Any) -> Any:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return ("hermes", x)


def raises_before(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    raise GuardBug("before Hermes")


def raises_after(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    wrapped(*args, **kwargs)
    raise GuardBug("after Hermes")


def passes_through(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return ("guarded", wrapped(*args, **kwargs))


def _own(wrapper: Any) -> Any:
    """A copy of ``wrapper`` to mark with ``fails_as`` (which marks the function it is given)."""
    return types.FunctionType(wrapper.__code__, wrapper.__globals__, wrapper.__name__, wrapper.__defaults__,
                              wrapper.__closure__)


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hermes_session_guard" and r.levelno >= logging.ERROR]


@pytest.mark.parametrize("inner", [raises_before, raises_after])
def test_open_a_guard_error_gives_hermes_result_once_and_one_line(inner: Any, caplog: pytest.LogCaptureFixture
                                                                  ) -> None:
    host = Host()
    with caplog.at_level(logging.DEBUG, logger="hermes_session_guard"):
        result = enveloped(_row("open"), inner)(host, None, (7,), {})
    assert result == ("hermes", 7)
    assert host.calls == 1  # never twice, whether the guard failed before or after Hermes's call
    lines = _lines(caplog)
    assert len(lines) == 1
    assert "seam sg_envelope_host:target failed" in lines[0] and "GuardBug" in lines[0]
    assert "failing open: Hermes runs this call as it would without the guard" in lines[0]


def test_open_the_line_names_the_consequence_the_wrapper_gives(caplog: pytest.LogCaptureFixture) -> None:
    inner = fails_as("summaries load untagged", advice="doctor")(_own(raises_before))
    with caplog.at_level(logging.ERROR, logger="hermes_session_guard"):
        assert enveloped(_row("open"), inner)(Host(), None, (1,), {}) == ("hermes", 1)
    assert _lines(caplog)[0].endswith("failing open: summaries load untagged. Run `hermes-session-guard doctor`.")


def test_closed_a_guard_error_refuses_the_call_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    host = Host()
    with caplog.at_level(logging.DEBUG, logger="hermes_session_guard"), pytest.raises(GuardBug):
        enveloped(_row("closed"), raises_before)(host, None, (7,), {})
    assert host.calls == 0
    lines = _lines(caplog)
    assert len(lines) == 1 and "failing closed: this call is refused" in lines[0]


def test_closed_a_named_refusal_replaces_the_error() -> None:
    seen: list[tuple[str, bool]] = []

    def refuse(exc: Exception, hermes: Hermes, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        seen.append((str(exc), hermes.ran))
        return "skipped"

    inner = fails_as("the compression is skipped", refuse=refuse)(_own(raises_before))
    host = Host()
    assert enveloped(_row("closed"), inner)(host, None, (1,), {}) == "skipped"
    assert seen == [("before Hermes", False)] and host.calls == 0


@pytest.mark.parametrize("policy", ["open", "closed"])
@pytest.mark.parametrize("inner", [passes_through, fails_as("x", refuse=lambda *a: "never")(_own(passes_through))])
def test_hermes_own_error_passes_through_unchanged(policy: str, inner: Any, caplog: pytest.LogCaptureFixture) -> None:
    error = HermesError("Hermes's own")
    host = Host(error)
    with caplog.at_level(logging.DEBUG, logger="hermes_session_guard"), pytest.raises(HermesError) as raised:
        enveloped(_row(policy), inner)(host, None, (1,), {})
    assert raised.value is error
    assert raised.value.__context__ is None and raised.value.__cause__ is None
    assert host.calls == 1
    assert _lines(caplog) == []


def test_a_base_exception_of_the_guard_is_never_intercepted() -> None:
    def interrupted(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise KeyboardInterrupt

    host = Host()
    with pytest.raises(KeyboardInterrupt):
        enveloped(_row("open"), interrupted)(host, None, (1,), {})
    assert host.calls == 0


def test_async_open_a_guard_error_awaits_hermes_once(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[Any] = []

    async def hermes(x: Any) -> Any:
        calls.append(x)
        return ("hermes", x)

    async def after(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        await wrapped(*args, **kwargs)
        raise GuardBug("after Hermes")

    async def before(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise GuardBug("before Hermes")

    with caplog.at_level(logging.ERROR, logger="hermes_session_guard"):
        assert asyncio.run(enveloped(_row("open"), after)(hermes, None, (1,), {})) == ("hermes", 1)
        assert asyncio.run(enveloped(_row("open"), before)(hermes, None, (2,), {})) == ("hermes", 2)
    assert calls == [1, 2]
    assert len(_lines(caplog)) == 2


def test_async_hermes_own_error_passes_through_unchanged() -> None:
    error = HermesError("Hermes's own")

    async def hermes(x: Any) -> Any:
        raise error

    async def inner(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return await wrapped(*args, **kwargs)

    with pytest.raises(HermesError) as raised:
        asyncio.run(enveloped(_row("open"), inner)(hermes, None, (1,), {}))
    assert raised.value is error


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    rt = Runtime(config=GuardConfig(), host_version="0.0.0", fixed_home=tmp_path)
    monkeypatch.setattr(runtime_module, "_current", rt)
    yield rt
    for seam in [s for s in ins._applied if s.startswith("test_")]:
        applied = ins._applied.pop(seam)
        setattr(applied.parent, applied.name, applied.original)
    rt.close()


@pytest.mark.parametrize(("policy", "outcome"), [("open", ("hermes", 3)), ("closed", GuardBug)])
def test_apply_installs_each_wrapper_inside_its_rows_policy(runtime: Runtime, monkeypatch: pytest.MonkeyPatch,
                                                            policy: str, outcome: Any) -> None:
    module = types.ModuleType("sg_envelope_host")
    host = Host()
    module.target = host  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sg_envelope_host", module)

    assert ins._apply(_row(policy, lambda runtime, row: raises_before), runtime, "test").state == "patched"

    if isinstance(outcome, tuple):
        assert module.target(3) == outcome
        assert host.calls == 1
    else:
        with pytest.raises(outcome):
            module.target(3)
        assert host.calls == 0


def test_a_search_no_snapshot_can_match_calls_hermes_once_and_passes_its_error(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The vocabulary read's handler once held Hermes's call too: Hermes's own error was caught
    there (DEBUG) and the search ran Hermes a second time."""
    from hermes_session_guard.seams.legacy import search

    monkeypatch.setattr(search, "no_snapshot_can_match", lambda *a: True)
    error = HermesError("no such table: messages_fts")
    calls: list[Any] = []

    def search_messages(query: str, limit: int = 20, offset: int = 0) -> Any:
        calls.append(query)
        raise error

    row = _row("open")
    with caplog.at_level(logging.DEBUG, logger="hermes_session_guard"), pytest.raises(HermesError) as raised:
        enveloped(row, search.search_wrapper(runtime, row))(search_messages, None, ("needle",), {})
    assert raised.value is error and calls == ["needle"]
    assert not [r for r in caplog.records if "failed" in r.getMessage()]
