"""The per-instance shims (the context engine's ``compress``, each platform adapter's
``send``/``edit_message``/``send_draft``) are rows of the seam table: verified like
any row, listed by selftest, applied where they always were."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

import hermes_session_guard
from hermes_session_guard import host
from hermes_session_guard.seam_behaviour import SeamKind, SeamState
from hermes_session_guard.seams import apply as instrumentation
from hermes_session_guard.seams import table as seams

SHIMS = {
    "engine_compress_shim": ("agent.context_engine:ContextEngine.compress", host.shim_engine),
    "delivery_send_shim": ("gateway.platforms.base:BasePlatformAdapter.send", host.shim_adapter),
    "delivery_edit_shim": ("gateway.platforms.base:BasePlatformAdapter.edit_message", host.shim_adapter),
    "delivery_draft_shim": ("gateway.platforms.base:BasePlatformAdapter.send_draft", host.shim_adapter),
    "delivery_platform_send_shim": ("gateway.relay.adapter:RelayAdapter.send_for_platform", host.shim_adapter),
    "dashboard_messages_shim": ("hermes_cli.web_server:app", host.shim_dashboard),
}
# Shims a release range does not have (the row there wraps nothing: not needed).
SINCE = {"delivery_platform_send_shim": (0, 20, 0)}


def _shim_rows() -> list[seams.SeamRow]:
    return [row for row in seams.SEAMS if row.kind is SeamKind.INSTANCE_SHIM]


def test_every_instance_shim_has_a_row_on_every_tested_release() -> None:
    assert {row.seam for row in _shim_rows()} == set(SHIMS)
    for release in seams.TESTED_RELEASES:
        version = tuple(int(p) for p in release.split("."))
        for name, (target, applied_by) in SHIMS.items():
            row = seams.select_row(name, version)
            assert row is not None, (name, release)
            if version < SINCE.get(name, (0, 0, 0)):
                assert not row.patches and row.note.startswith("not needed"), (name, release)
                continue
            assert row.target == target and row.applied_by is applied_by, (name, release)


@pytest.mark.parametrize("row", _shim_rows(), ids=lambda r: r.seam)
def test_a_shim_row_names_what_it_leans_on(row: seams.SeamRow) -> None:
    assert row.wrapper is None and row.patches  # nothing wrapped at class level, yet it changes the host
    assert row.requires and row.note and row.failure_policy == "open"
    assert row.params[0] in ("self", "scope")  # a method of host objects, or the dashboard's ASGI app
    # the platform base and the dashboard are never imported by the guard
    assert row.lazy is (row.module.startswith("gateway.") or row.module == "hermes_cli.web_server")


# -- against a fake host ------------------------------------------------------------------

MODULE = "fake_platform_base"


def _shim_row(params: tuple[str, ...] = ("self", "chat_id", "content"),
              requires: tuple[str, ...] = (f"{MODULE}:SendResult",), lazy: bool = False) -> seams.SeamRow:
    return seams.SeamRow(seam="delivery_send_shim", since=(0, 13, 0), until=(0, 20, 0), module=MODULE,
                         attribute="BasePlatformAdapter.send", params=params, wrapper=None,
                         failure_policy="open", note="fake shim", requires=requires,
                         kind=SeamKind.INSTANCE_SHIM, applied_by=host.shim_adapter, lazy=lazy)


@pytest.fixture
def fake_base(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    instrumentation.uninstall()
    module = types.ModuleType(MODULE)

    class BasePlatformAdapter:
        async def send(self, chat_id: str, content: str, reply_to: Any = None) -> Any:
            return content

    class SendResult:
        pass

    module.BasePlatformAdapter = BasePlatformAdapter  # type: ignore[attr-defined]
    module.SendResult = SendResult  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, MODULE, module)
    monkeypatch.setattr(instrumentation, "installed_version", lambda: "0.19.0")
    monkeypatch.setattr(instrumentation, "_reported", set())
    yield module
    instrumentation.uninstall()


def test_verify_row_checks_a_shim_target_and_its_requires(fake_base: types.ModuleType) -> None:
    assert instrumentation.verify_row(_shim_row()) is None
    assert "signature differs" in str(instrumentation.verify_row(_shim_row(params=("self", "content"))))
    assert "SendResul" in str(instrumentation.verify_row(_shim_row(requires=(f"{MODULE}:SendResul",))))
    del fake_base.BasePlatformAdapter.send
    assert "not found" in str(instrumentation.verify_row(_shim_row()))


def test_install_reports_a_shim_row_and_leaves_the_class_alone(
    fake_base: types.ModuleType, monkeypatch: pytest.MonkeyPatch,
) -> None:
    send = fake_base.BasePlatformAdapter.__dict__["send"]
    monkeypatch.setattr(seams, "SEAMS", (_shim_row(),))
    runtime = hermes_session_guard.install()
    (status,) = runtime.seams
    assert (status.name, status.state, status.target) == ("delivery_send_shim", SeamState.PATCHED,
                                                          f"{MODULE}:BasePlatformAdapter.send")
    assert status.reason == "instance shim, applied by shim_adapter: fake shim"
    assert fake_base.BasePlatformAdapter.__dict__["send"] is send  # the class is never wrapped
    assert "delivery_send_shim" not in instrumentation._applied


def test_a_shim_row_whose_target_is_gone_is_skipped(
    fake_base: types.ModuleType, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(seams, "SEAMS", (_shim_row(params=("self", "chat", "text")),))
    (status,) = hermes_session_guard.install().seams
    assert status.state == SeamState.SKIPPED and "signature differs" in status.reason


def test_a_lazy_shim_row_waits_for_hermes_to_import_its_module(monkeypatch: pytest.MonkeyPatch) -> None:
    instrumentation.uninstall()
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    monkeypatch.setattr(instrumentation, "installed_version", lambda: "0.19.0")
    monkeypatch.setattr(seams, "SEAMS", (_shim_row(lazy=True),))
    try:
        (status,) = hermes_session_guard.install().seams
        assert status.state == SeamState.PENDING and MODULE in status.reason
    finally:
        instrumentation.uninstall()
