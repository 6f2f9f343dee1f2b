"""``write_snapshot_reference(matching=...)`` (0.18.2-0.19 in place): a reference only when
the rows it names hold exactly the replaced list; otherwise nothing is written and the
caller stores a copy. Hermes's rows come from a stub reader here (the real one is
host/reads.py, exercised on the real host in tests/integration/test_snapshot_references.py)."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hermes_session_guard.store.snapshots as snapshots_mod
from hermes_session_guard.store import GuardStore

ROWS = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[GuardStore]:
    monkeypatch.setattr(snapshots_mod, "_archived_reader", lambda _db, _sid, _runs: [dict(r) for r in ROWS])
    s = GuardStore(tmp_path / "state.db")
    yield s
    s.close()


def _write(store: GuardStore, snapshot_id: str, matching: list[Any]) -> Any:
    return store.write_snapshot_reference(snapshot_id=snapshot_id, session_id="S", row_runs=[(1, 2)],
                                          matching=matching)


def test_rows_that_hold_the_list_become_a_reference(store: GuardStore) -> None:
    info = _write(store, "S.snapshot.1", [dict(r, extra=1) for r in ROWS])
    assert info is not None and info.message_count == 2
    assert store.snapshot_messages("S.snapshot.1") == ROWS


@pytest.mark.parametrize("matching", [
    ROWS[:1],  # a row the list does not have (stored meanwhile)
    [*ROWS, {"role": "user", "content": "c"}],  # a message never flushed
    [ROWS[0], {"role": "assistant", "content": "B"}],  # stored differently
    [ROWS[1], ROWS[0]],  # another order
    [ROWS[0], "not a dict"],
])
def test_rows_that_do_not_hold_the_list_write_nothing(store: GuardStore, matching: list[Any]) -> None:
    assert _write(store, "S.snapshot.2", matching) is None
    assert not store.snapshot_exists("S.snapshot.2")
    assert store.list_snapshots("S") == []


def test_rows_read_by_the_caller_are_not_read_again(store: GuardStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """``read``: the count and digest of the rows as the caller just read them; the reference
    records those, and a later read of changed rows says so."""
    monkeypatch.setattr(snapshots_mod, "_archived_reader", lambda *_a: pytest.fail("the rows were read again"))
    info = store.write_snapshot_reference(snapshot_id="S.snapshot.3", session_id="S", row_runs=[(1, 2)],
                                          read=(2, snapshots_mod.content_digest([{"role": "user", "content": "x"},
                                                                                ROWS[1]])))
    assert info is not None and info.message_count == 2
    monkeypatch.setattr(snapshots_mod, "_archived_reader", lambda _db, _sid, _runs: [dict(r) for r in ROWS])
    with pytest.raises(snapshots_mod.SnapshotGone, match="changed content"):
        store.referenced_messages("S.snapshot.3")


def test_references_of_earlier_versions_and_of_this_one_are_checked_against_their_own_digest() -> None:
    # the stream both digest: references stored earlier hold its SHA-256, new ones its CRC-32
    messages = [{"role": "user", "content": "h\u00e9llo \ud800"}, {"role": "assistant", "content": None},
                {"role": "tool", "content": [{"type": "text", "text": "t"}]}]
    stream = "".join(f"{m['role']}\x1f{m['content'] if isinstance(m['content'], str) else repr(m['content'])}\x1e"
                     for m in messages).encode("utf-8", "surrogatepass")
    earlier = hashlib.sha256(stream).hexdigest()
    assert snapshots_mod.content_digest(messages) == f"crc32:{zlib.crc32(stream):08x}"
    for digest in (earlier, snapshots_mod.content_digest(messages)):
        assert snapshots_mod.reference_problem(messages, 3, digest) is None
        changed = [*messages[:2], {"role": "tool", "content": "t"}]
        assert snapshots_mod.reference_problem(changed, 3, digest) == "3 of its 3 rows are there, with changed content"
        assert snapshots_mod.reference_problem(messages[:2], 3, digest) == "2 of its 3 rows are there"
