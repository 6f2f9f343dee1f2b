"""uninstall() gives every host attribute back as it was: an inherited method is not
left behind as a copy in the subclass, and two seams on one attribute restore the
host's own whatever the order they are undone in."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

import hermes_session_guard
from hermes_session_guard.seams import apply as instrumentation
from hermes_session_guard.seams import table as seams
from hermes_session_guard.seams.table import SeamRow

MODULE = "fake_gateway_run"


def _passing(runtime: Any, row: SeamRow) -> Any:
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return wrapped(*args, **kwargs)

    return wrapper


def _row(seam: str, attribute: str) -> SeamRow:
    return SeamRow(seam=seam, since=(0, 13, 0), until=(0, 20, 0), module=MODULE, attribute=attribute,
                   params=("self", "event"), wrapper=_passing, failure_policy="open", note=f"fake {seam}")


class BaseRunner:
    def _handle_message(self, event: str) -> str:
        return f"handled {event}"


class GatewayRunner(BaseRunner):
    def _own(self, event: str) -> str:
        return f"own {event}"


@pytest.fixture
def fake_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    instrumentation.uninstall()
    module = types.ModuleType(MODULE)
    module.BaseRunner = BaseRunner  # type: ignore[attr-defined]
    module.GatewayRunner = GatewayRunner  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, MODULE, module)
    monkeypatch.setattr(instrumentation, "installed_version", lambda: "0.19.0")
    monkeypatch.setattr(instrumentation, "_reported", set())
    yield module
    instrumentation.uninstall()


def test_an_inherited_method_is_restored_by_deleting_the_subclass_copy(
    fake_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(seams, "SEAMS", (_row("inherited", "GatewayRunner._handle_message"),
                                         _row("own", "GatewayRunner._own")))
    own = GatewayRunner.__dict__["_own"]
    assert "_handle_message" not in GatewayRunner.__dict__
    runtime = hermes_session_guard.install()
    assert {s.name: s.state for s in runtime.seams} == {"inherited": "patched", "own": "patched"}
    assert "_handle_message" in GatewayRunner.__dict__  # the wrapper sits on the subclass
    assert GatewayRunner()._handle_message("x") == "handled x"
    instrumentation.uninstall()
    assert "_handle_message" not in GatewayRunner.__dict__
    assert GatewayRunner._handle_message is BaseRunner._handle_message
    assert BaseRunner.__dict__["_handle_message"].__name__ == "_handle_message"
    assert not hasattr(BaseRunner.__dict__["_handle_message"], "__wrapped__")
    assert GatewayRunner.__dict__["_own"] is own  # an own method is set back


@pytest.mark.parametrize("attribute", ["BaseRunner._handle_message", "GatewayRunner._handle_message"])
@pytest.mark.parametrize("order", ["last applied first", "first applied first"])
def test_two_seams_on_one_attribute_restore_the_original_in_either_order(
    fake_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch, order: str, attribute: str,
) -> None:
    cls = getattr(fake_module, attribute.split(".")[0])
    had_own = "_handle_message" in cls.__dict__
    original = cls.__dict__.get("_handle_message")
    host_own = BaseRunner.__dict__["_handle_message"]
    monkeypatch.setattr(seams, "SEAMS", (_row("gateway_message", attribute), _row("buffer_handoff", attribute)))
    hermes_session_guard.install()
    wrapped = cls.__dict__["_handle_message"]
    assert wrapped.__wrapped__.__wrapped__ is host_own  # two layers
    assert cls()._handle_message("y") == "handled y"
    applied = instrumentation._applied
    names = list(applied)
    assert names == ["gateway_message", "buffer_handoff"]
    if order == "first applied first":
        # uninstall undoes the last entry first: put the first-applied seam last
        monkeypatch.setattr(instrumentation, "_applied", {n: applied[n] for n in reversed(names)})
    instrumentation.uninstall()
    assert ("_handle_message" in cls.__dict__) is had_own
    assert cls.__dict__.get("_handle_message") is original
    assert cls._handle_message is host_own and BaseRunner.__dict__["_handle_message"] is host_own


def test_restore_of_each_entry_gives_the_original_back_on_its_own(
    fake_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch,
) -> None:
    attribute = "BaseRunner._handle_message"
    original = BaseRunner.__dict__["_handle_message"]
    monkeypatch.setattr(seams, "SEAMS", (_row("gateway_message", attribute), _row("buffer_handoff", attribute)))
    hermes_session_guard.install()
    first, second = instrumentation._applied["gateway_message"], instrumentation._applied["buffer_handoff"]
    assert first.original is original and second.original is original
    instrumentation._restore(first)
    assert BaseRunner.__dict__["_handle_message"] is original
    instrumentation._restore(second)
    assert BaseRunner.__dict__["_handle_message"] is original
