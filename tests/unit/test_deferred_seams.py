"""Rows whose module is half imported (plugin discovery runs inside ``import run_agent``)
or not imported at all (display modules) are patched when the module is complete."""

from __future__ import annotations

import importlib
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
from hermes_session_guard.seams.table import SeamRow


def _marking_wrapper(runtime: Runtime, row: SeamRow) -> Any:
    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        return ("guarded", wrapped(*args, **kwargs))

    return wrapper


def _row(module: str, *, lazy: bool = False) -> SeamRow:
    return SeamRow(seam=f"test_{module}", since=(0, 0, 0), until=(99, 0, 0), module=module, attribute="target",
                   params=("x",), wrapper=_marking_wrapper, failure_policy="open", lazy=lazy)


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    rt = Runtime(config=GuardConfig(), host_version="0.0.0", fixed_home=tmp_path)
    monkeypatch.setattr(runtime_module, "_current", rt)
    yield rt
    ins._pending.clear()
    ins._imported.clear()
    ins._remove_finder()
    for seam in [s for s in ins._applied if s.startswith("test_")]:
        applied = ins._applied.pop(seam)
        setattr(applied.parent, applied.name, applied.original)


def test_a_half_imported_module_is_patched_once_its_import_finishes(runtime: Runtime, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("sg_half_built")
    module.__spec__ = importlib.machinery.ModuleSpec("sg_half_built", None)
    module.__spec__._initializing = True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sg_half_built", module)
    row = _row("sg_half_built")

    status = ins._schedule(row, runtime)
    assert status.state == "pending"
    module.target = lambda x: x  # the rest of the module body runs
    ins.apply_pending()
    assert ins.module_state("sg_half_built") == "importing"
    assert row.seam in ins._pending  # still building: nothing patched yet

    module.__spec__._initializing = False  # type: ignore[attr-defined]
    (tmp_path / "sg_next_import.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("sg_next_import")  # any later import gives the guard its chance

    assert row.seam not in ins._pending
    assert module.target(3) == ("guarded", 3)
    assert [s.state for s in runtime.seams if s.name == row.seam] == ["patched"]


def test_a_lazy_row_waits_for_the_host_to_import_the_module(runtime: Runtime, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sg_display_module.py").write_text("def target(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sg_display_module", raising=False)
    row = _row("sg_display_module", lazy=True)

    status = ins._schedule(row, runtime)
    assert status.state == "pending"
    assert "sg_display_module" not in sys.modules  # the guard never imports it itself

    module = importlib.import_module("sg_display_module")
    assert module.target(2) == ("guarded", 2)
    assert row.seam not in ins._pending


def test_an_absent_eager_module_is_imported_and_patched(runtime: Runtime, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sg_core_module.py").write_text("def target(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sg_core_module", raising=False)

    status = ins._schedule(_row("sg_core_module"), runtime)

    assert status.state == "patched"
    assert sys.modules["sg_core_module"].target(1) == ("guarded", 1)


def test_a_row_without_wrapper_is_not_needed(runtime: Runtime) -> None:
    row = SeamRow(seam="test_none", since=(0, 0, 0), until=(99, 0, 0), module="json", attribute="dumps",
                  params=(), wrapper=None, failure_policy="", note="nothing to do on this release")
    assert ins._schedule(row, runtime).state == "not-needed"


def test_a_half_imported_module_is_patched_even_if_nothing_else_is_imported(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    module = types.ModuleType("sg_used_right_away")
    module.__spec__ = importlib.machinery.ModuleSpec("sg_used_right_away", None)
    module.__spec__._initializing = True  # type: ignore[attr-defined]
    module.target = lambda x: x
    monkeypatch.setitem(sys.modules, "sg_used_right_away", module)
    row = _row("sg_used_right_away")
    assert ins._schedule(row, runtime).state == "pending"

    module.__spec__._initializing = False  # type: ignore[attr-defined]  # the import statement returns
    deadline = time.monotonic() + 5
    while row.seam in ins._pending and time.monotonic() < deadline:
        time.sleep(0.005)
    assert module.target(4) == ("guarded", 4)
