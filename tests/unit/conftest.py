"""Fixtures shared by the unit tests of the compression contract (no Hermes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.config import GuardConfig
from hermes_session_guard.runtime import Runtime


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    """A guard runtime with the default options, its stores under ``tmp_path``."""
    rt = Runtime(config=GuardConfig(), host_version="test", fixed_home=tmp_path)
    yield rt
    rt.close()


@pytest.fixture
def db(mocker: Any, tmp_path: Path) -> Any:
    """A stand-in SessionDB. The guard reads the live transcript for its generation
    check: nothing stored yet."""
    fake = mocker.Mock()
    fake.db_path = tmp_path / "state.db"
    fake.get_messages_as_conversation.return_value = []
    return fake
