"""uninstall() gives every host attribute back as it was: an inherited method is not
left behind as a copy in the subclass, and a second seam on one attribute is refused, never
stacked."""

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
def test_a_second_seam_on_a_wrapped_attribute_is_refused_and_uninstall_restores_the_original(
    fake_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch, attribute: str,
) -> None:
    """One wrapper per Hermes target: a second row on an attribute another seam wraps is
    not stacked on it (FAILED, naming the first), and uninstall gives the host's own back."""
    cls = getattr(fake_module, attribute.split(".")[0])
    had_own = "_handle_message" in cls.__dict__
    original = cls.__dict__.get("_handle_message")
    host_own = BaseRunner.__dict__["_handle_message"]
    monkeypatch.setattr(seams, "SEAMS", (_row("gateway_message", attribute), _row("second", attribute)))
    runtime = hermes_session_guard.install()
    states = {s.name: (s.state, s.reason) for s in runtime.seams}
    assert states["gateway_message"][0] == "patched"
    assert states["second"][0] == "failed" and "already wrapped by seam gateway_message" in states["second"][1]
    wrapped = cls.__dict__["_handle_message"]
    assert wrapped.__wrapped__ is host_own  # one layer
    assert cls()._handle_message("y") == "handled y"
    instrumentation.uninstall()
    assert ("_handle_message" in cls.__dict__) is had_own
    assert cls.__dict__.get("_handle_message") is original
    assert cls._handle_message is host_own and BaseRunner.__dict__["_handle_message"] is host_own
