"""The hand-off packet without a host: what it says, what it hides, where it may be written."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hermes_session_guard.config import parse_config
from hermes_session_guard.handoff.packet import (
    PACKET_HEADING,
    SEED_MARKER,
    PacketInputs,
    PathEscapeError,
    SnapshotPointer,
    artifact_dir,
    last_user_request,
    latest_summary,
    open_questions,
    packet_filename,
    render_packet,
    seed_message_text,
    todos_from_messages,
    write_packet,
)
from hermes_session_guard.host import summary_prefixes

PREFIX = summary_prefixes()[0]  # the host's marker when one is installed, else the known default
SUMMARY = "## Goal\nShip it.\n\n## Pending User Asks\n- Which region?\n\n## Blocked\n- None\n"
TODO_TEXT = ("[Your active task list was preserved across context compression]\n"
             "- [>] 1. Rotate keys (in_progress)\n- [ ] 2. Write notes (pending)")


def _transcript() -> list[dict]:
    return [
        {"role": "user", "content": "start"},
        {"role": "assistant", "content": f"{PREFIX}\n\n{SUMMARY}", "is_compressed_summary": True},
        {"role": "user", "content": "deploy now please"},
        {"role": "assistant", "content": "Sure. Should I also tag the release? Done."},
        {"role": "user", "content": TODO_TEXT},
    ]


def test_transcript_readers() -> None:
    msgs = _transcript()
    assert latest_summary(msgs) == SUMMARY.strip()
    assert last_user_request(msgs) == "deploy now please"  # not the todo snapshot
    assert todos_from_messages(msgs) == [
        {"id": "1", "content": "Rotate keys", "status": "in_progress"},
        {"id": "2", "content": "Write notes", "status": "pending"},
    ]
    assert open_questions(latest_summary(msgs), msgs) == ["Which region?", "Should I also tag the release?"]


def test_a_summary_merged_into_the_users_message_is_not_the_request() -> None:
    merged = (f"{PREFIX}\n\n{SUMMARY}\n\n--- END OF CONTEXT SUMMARY — respond to the message below, not the "
              "summary above ---\n\nand what about staging?")
    assert last_user_request([{"role": "user", "content": merged, "is_compressed_summary": True}]) \
        == "and what about staging?"
    # untagged, it is somebody quoting the marker: kept whole
    assert last_user_request([{"role": "user", "content": merged}]) == merged
    assert last_user_request([{"role": "user", "content": f"{PREFIX}\n{SUMMARY}", "_compressed_summary": True}]) is None


def test_a_seeded_child_yields_its_packets_summary() -> None:
    packet = render_packet(PacketInputs(session_id="A", summary=SUMMARY, created_at=0.0))
    child = [{"role": "user", "content": seed_message_text(packet, "A")}, {"role": "user", "content": "next"}]
    assert "Ship it." in (latest_summary(child) or "")
    assert last_user_request(child) == "next"


def test_render_has_every_section() -> None:
    text = render_packet(PacketInputs(
        session_id="S2", lineage=["S0", "S1", "S2"], title="Payments", working_dir="/srv/app",
        git_branch="main", git_commit="abc1234", todos=[{"id": "1", "content": "x", "status": "in_progress"}],
        summary=SUMMARY, last_user_request="go\nnow", open_questions=["Which region?"],
        snapshots=[SnapshotPointer("S2.snapshot.1", 48, 0.0)], compressions=3, reason="automatic",
        note="freeze friday", created_at=0.0,
    ))
    assert text.startswith(PACKET_HEADING + "\n")
    for line in ["- Session: `S2`", "- Lineage: `S0` → `S1` → `S2`", "- Title: Payments",
                 "- Working directory: `/srv/app`", "- Git: branch `main` at `abc1234`",
                 "- Compressions of this session: 3", "## Note\n\nfreeze friday", "> go\n> now",
                 "- [>] 1. x (in_progress)", "### Goal\nShip it.", "- Which region?",
                 "- `S2.snapshot.1` — 48 messages", "Earlier sessions of this line: `S0`, `S1`"]:
        assert line in text, line


def test_render_redacts_every_field() -> None:
    secret = "sk-proj-ZZZZYYYYXXXXWWWW1234"
    text = render_packet(PacketInputs(
        session_id="S", title=f"t {secret}", working_dir=f"/w/{secret}", todos=[{"id": "1", "content": secret}],
        summary=f"key={secret}", last_user_request=secret, open_questions=[secret], note=secret,
    ))
    assert "ZZZZYYYYXXXXWWWW" not in text


@pytest.mark.parametrize("configured", ["../out", "/abs", "a/../../b", "C:\\x", "\\\\server\\share", ""])
def test_artifact_dir_outside_home_is_refused(tmp_path: Path, configured: str) -> None:
    with pytest.raises(PathEscapeError):
        artifact_dir(tmp_path, configured)
    cfg = parse_config({"handoff": {"artifact_dir": configured}})
    assert cfg.handoff.artifact_dir == "handoffs"  # the default is used
    assert [f.key for f in cfg.fallbacks] == ["session_guard.handoff.artifact_dir"]


@pytest.mark.skipif(os.name != "posix", reason="symlinks need privileges on Windows")
def test_a_symlink_out_of_home_is_refused(tmp_path: Path) -> None:
    home, outside = tmp_path / "home", tmp_path / "outside"
    home.mkdir()
    outside.mkdir()
    (home / "handoffs").symlink_to(outside, target_is_directory=True)
    with pytest.raises(PathEscapeError):
        write_packet(home, "handoffs", "S", "x", 0.0)
    assert list(outside.iterdir()) == []


def test_write_is_atomic_private_and_sanitised(tmp_path: Path) -> None:
    path = write_packet(tmp_path, "handoffs/packets", "../../etc/passwd", "body\n", 1_700_000_000.0)
    assert path.parent == (tmp_path / "handoffs" / "packets").resolve()
    assert path.name == packet_filename("../../etc/passwd", 1_700_000_000.0) and "/" not in path.name
    assert path.read_text(encoding="utf-8") == "body\n"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind
    if os.name == "posix":
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    again = write_packet(tmp_path, "handoffs/packets", "../../etc/passwd", "second\n", 1_700_000_000.0)
    assert again != path and path.read_text(encoding="utf-8") == "body\n"


def test_seed_message_is_marked_as_reference() -> None:
    text = seed_message_text("# packet", "PARENT")
    assert text.startswith(SEED_MARKER) and "PARENT" in text and text.endswith("# packet")
