"""Any str the guard stores or indexes round-trips: lone surrogates and NUL."""

from __future__ import annotations

from pathlib import Path

from hermes_session_guard.contract.generations import block_digest, keys_of
from hermes_session_guard.safe_text import encodable, json_text, searchable, sendable_messages
from hermes_session_guard.store import GuardStore, text_hash

ODD = ["a broken emoji \ud83d here", "a low half \udc80", "a NUL \x00 inside", "plain ü text"]


def test_helpers() -> None:
    import json

    for text in ODD:
        assert json.loads(json_text({"t": text})) == {"t": text}
        assert encodable(searchable(text)) and encodable(json_text(text))
    assert text_hash("plain ü text") == text_hash(" plain ü text ")  # unchanged for valid text
    assert text_hash(ODD[0]) != text_hash(ODD[1])
    assert block_digest(keys_of([{"role": "user", "content": t} for t in ODD]))


def test_snapshot_and_index_round_trip(tmp_path: Path) -> None:
    store = GuardStore(tmp_path / "state.db")
    messages = [{"role": "user", "content": t} for t in ODD] + [
        {"role": "user", "content": [{"type": "text", "text": "parts \ud800 too"}]}]
    store.write_snapshot(snapshot_id="s.snapshot.1", session_id="s", messages=messages,
                         index_text=lambda m: m["content"] if isinstance(m["content"], str) else None)
    assert store.snapshot_messages("s.snapshot.1") == messages
    assert store.doc_count() == len(messages)  # every message of a copy is a document, surrogates and all


def test_sendable_messages_replaces_only_what_utf8_cannot_carry() -> None:
    clean = {"role": "user", "content": "fine"}
    odd = {"role": "user", "content": ODD[0]}
    same = [clean, {"role": "user", "content": ODD[2]}]
    assert sendable_messages(same) is same
    out = sendable_messages([clean, odd])
    assert out[0] is clean and out[1] is not odd and encodable(out[1]["content"])
    assert odd["content"] == ODD[0]  # the caller's message is untouched
