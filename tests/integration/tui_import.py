"""Importing Hermes's TUI gateway (``tui_gateway.server``) in the host tests.

Hermes 0.21.3+ declares Python 3.14 and its TUI gateway relies on 3.14's deferred
annotations: on 3.11, annotations naming what a module never imports (``Path`` in
``tui_gateway/methods_onboarding.py`` on 0.22.2) raise ``NameError`` at import. These
machines have no 3.14, so on an older Python the tests compile the ``tui_gateway`` package
with ``from __future__ import annotations`` (annotations kept as strings, never evaluated
at import, as 3.14 defers them); nothing else about the code changes. Only the tests do
this: the guard patches whatever Hermes imported, however it was imported."""

from __future__ import annotations
import __future__

import importlib
import importlib.abc
import importlib.machinery
import sys
from typing import Any

import pytest

from .conftest import HOST

PACKAGE = "tui_gateway"
# Upstream 0.21.3 is the first release that declares Python >= 3.14.
WRITTEN_FOR_PY314 = HOST >= (0, 21, 3)


class _DeferredAnnotationsLoader(importlib.machinery.SourceFileLoader):
    def path_stats(self, path: str) -> Any:
        raise OSError(path)  # no bytecode cache: compiled here every time, never written

    def source_to_code(self, data: Any, path: Any, *, _optimize: int = -1) -> Any:  # type: ignore[override]
        return compile(data, path, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True,
                       optimize=_optimize)


class _DeferredAnnotationsFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != PACKAGE and not name.startswith(PACKAGE + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and type(spec.loader) is importlib.machinery.SourceFileLoader:
            spec.loader = _DeferredAnnotationsLoader(spec.loader.name, spec.loader.path)
        return spec


def _defer_annotations() -> None:
    installed = any(isinstance(f, _DeferredAnnotationsFinder) for f in sys.meta_path)
    if WRITTEN_FOR_PY314 and sys.version_info < (3, 14) and not installed:
        sys.meta_path.insert(0, _DeferredAnnotationsFinder())


def tui_server() -> Any:
    """``tui_gateway.server``, or a skip naming why this host cannot import it. It keeps the
    real stdout for JSON-RPC and points ``sys.stdout`` at stderr: put it back."""
    if PACKAGE + ".server" not in sys.modules:
        _defer_annotations()
    saved = sys.stdout
    try:
        return importlib.import_module(PACKAGE + ".server")
    except Exception as exc:  # ImportError where there is none
        pytest.skip(f"tui_gateway.server does not import on this host ({type(exc).__name__}: {exc})")
    finally:
        sys.stdout = saved
