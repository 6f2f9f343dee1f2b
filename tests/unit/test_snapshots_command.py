from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes_session_guard.commands.cli import main
from hermes_session_guard.store import GuardStore

from .hermes_like_db import HermesLikeHome


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    HermesLikeHome(tmp_path).close()
    store = GuardStore(tmp_path / "state.db")
    store.write_snapshot(snapshot_id="S.snapshot.1", session_id="S", created_at=1.0,
                         messages=[{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}])
    store.write_snapshot(snapshot_id="T.snapshot.1", session_id="T", created_at=2.0,
                         messages=[{"role": "user", "content": "secret of T"}])
    store.close()
    return tmp_path


def test_lists_a_sessions_snapshots_as_json(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshots", "S", "--json"]) == 0
    (snap,) = json.loads(capsys.readouterr().out)
    assert snap["snapshot_id"] == "S.snapshot.1" and snap["message_count"] == 2 and snap["created_at"] == 1.0
    assert snap["created_at_iso"] == "1970-01-01T00:00:01.000Z"


def test_lists_dates_not_epoch_seconds(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshots", "S"]) == 0
    out = capsys.readouterr().out
    assert "created=1970-01-01T00:00:01.000Z" in out and "created_at=1.0" not in out


def test_a_fresh_home_has_no_such_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.yaml").write_text("plugins:\n  enabled: [session-guard]\n", encoding="utf-8")
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    assert main(["snapshots", "S"]) == 2
    assert "no session S" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_shows_one_snapshot(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshots", "S", "--show", "S.snapshot.1", "--json"]) == 0
    msgs = json.loads(capsys.readouterr().out)
    assert [(m["role"], m["content"]) for m in msgs] == [("user", "hello"), ("assistant", "hi")]


def test_refuses_another_sessions_snapshot(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshots", "S", "--show", "T.snapshot.1", "--json"]) == 1
    assert "secret of T" not in capsys.readouterr().out


def test_missing_home_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "nope"))
    assert main(["snapshots", "S"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_snapshots_are_immutable(tmp_path: Path) -> None:
    store = GuardStore(tmp_path / "state.db")
    store.write_snapshot(snapshot_id="S.snapshot.1", session_id="S", messages=[{"role": "user", "content": "a"}])
    with pytest.raises(Exception, match="UNIQUE"):
        store.write_snapshot(snapshot_id="S.snapshot.1", session_id="S", messages=[{"role": "user", "content": "b"}])
    assert store.snapshot_messages("S.snapshot.1") == [{"role": "user", "content": "a"}]
