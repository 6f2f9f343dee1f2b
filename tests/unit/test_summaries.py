"""Summary detection, the recall line, compacted ranges, display and wire copies."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hermes_session_guard import host
from hermes_session_guard.store import text_hash
from hermes_session_guard.summaries import tags as s
from hermes_session_guard.summaries.visibility import display_messages, outgoing_text
from hermes_session_guard.summaries.wire import provider_messages

PREFIX = host.summary_prefixes()[0]
END = "--- END OF CONTEXT SUMMARY — respond to the message below, not the summary above ---"
HEADER, DELIM = host.merged_summary_markers()
BODY = "## Goal\nShip the release.\n\n## Progress\n- migrated the orders table"


def standalone() -> str:
    return f"{PREFIX}\n{BODY}\n\n{END}"


def merged_014(original: str) -> str:  # summary first, then the real tail message
    return f"{PREFIX}\n{BODY}\n\n{END}\n\n{original}"


def merged_019(original: str) -> str:  # prior content, delimiter, then the summary
    return f"{HEADER}\n{original}\n\n{DELIM}\n\n{PREFIX}\n{BODY}\n\n{END}"


def host_detects(text: str) -> bool:
    """What Hermes's own _is_context_summary_content checks (0.19 looks past the delimiter)."""
    text = text.split(DELIM, 1)[1].lstrip() if DELIM in text else text.lstrip()
    return text.startswith(PREFIX)


def test_detection_finds_standalone_and_merged_summaries() -> None:
    assert s.is_summary_text(standalone())
    assert s.is_summary_text(merged_014("what next?"))
    assert s.is_summary_text(merged_019("what next?"))
    assert not s.is_summary_text("a normal answer that mentions compaction")
    assert s.is_summary_message({"role": "user", "content": "x", "is_compressed_summary": True})
    assert s.is_summary_message({"role": "user", "content": "x", "_compressed_summary": True})


def test_recall_line_goes_after_the_prefix_line_and_comes_out_byte_for_byte() -> None:
    line = s.recall_header("S1", 4, 17, "S1.snapshot.X")
    assert line == "[Original context: session S1, turns 4–17, snapshot S1.snapshot.X]"
    for text in (standalone(), merged_014("what next?"), merged_019("what next?")):
        with_line = s.with_recall_header(text, line)
        lines = with_line.splitlines()
        at = next(i for i, x in enumerate(lines) if PREFIX in x)
        assert lines[at + 1] == line
        assert host_detects(with_line) == host_detects(text)
        assert s.strip_recall_header(with_line) == text
        assert s.header_snapshot_ids(with_line) == ["S1.snapshot.X"]
        # adding it twice keeps one line
        assert s.with_recall_header(with_line, line).count("[Original context:") == 1


def test_original_part_keeps_only_the_conversation() -> None:
    assert s.original_part(standalone()) == ""
    assert s.original_part(merged_014("what next?")) == "what next?"
    assert s.original_part(merged_019("what next?")) == "what next?"
    assert s.original_part("plain") == "plain"
    assert s.summary_body(s.with_recall_header(standalone(), "[Original context: session a, turns 1–2, snapshot b]")) \
        == BODY


def _msgs(n: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn-{i}"} for i in range(n)]


def test_compacted_range_standalone_and_merged() -> None:
    before = _msgs(10)
    after = before[:3] + [{"role": "user", "content": standalone()}] + copy.deepcopy(before[7:])
    assert s.compacted_range(before, after) == (4, 7)
    merged = copy.deepcopy(before[6:])
    merged[0]["content"] = merged_014(merged[0]["content"])
    assert s.compacted_range(before, before[:3] + merged) == (4, 6)
    assert s.compacted_range(before, copy.deepcopy(before)) is None


@pytest.mark.parametrize("found_by_caller", [False, True])
def test_decorate_tags_every_summary_and_heads_only_new_ones(found_by_caller: bool) -> None:
    old_line = "[Original context: session S, turns 4–9, snapshot S.snapshot.1]"
    old = {"role": "user", "content": s.with_recall_header(standalone(), old_line), "is_compressed_summary": True}
    before = [*_msgs(3), old, *_msgs(12)[3:]]
    after = [*copy.deepcopy(before[:4]), {"role": "assistant", "content": standalone()}, *copy.deepcopy(before[13:])]
    # the engine shim finds them once and hands them over: the same tags and recall lines
    found = s.summary_indices(after, before) if found_by_caller else None
    fresh = s.decorate_summaries(before, after, session_id="S", snapshot_id="S.snapshot.2", header=True,
                                 native_key="_compressed_summary", found=found)
    assert fresh == [4]
    assert after[3]["content"] == old["content"]  # the earlier summary keeps its own line
    assert after[3]["is_compressed_summary"] and after[4]["is_compressed_summary"]
    assert after[4]["_compressed_summary"] is True
    assert "[Original context: session S, turns 5–13, snapshot S.snapshot.2]" in after[4]["content"]


def test_display_copy_hides_summaries_and_keeps_the_real_text() -> None:
    history = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": standalone(), "is_compressed_summary": True},
        {"role": "user", "content": merged_019("the real question"), "_compressed_summary": True},
        {"role": "assistant", "content": "answer"},
    ]
    frozen = copy.deepcopy(history)
    hidden = display_messages(history, "false")
    assert [m["content"] for m in hidden] == ["hello", "the real question", "answer"]
    assert not any("is_compressed_summary" in m for m in hidden)
    tagged = display_messages(history, "tagged")
    assert [bool(m.get("is_compressed_summary")) for m in tagged] == [False, True, True, False]
    assert history == frozen


def test_outgoing_text_drops_recorded_summaries_a_model_repeats() -> None:
    recorded = [standalone()]
    assert outgoing_text("plain reply", "false", recorded) == "plain reply"
    assert outgoing_text(standalone(), "false", recorded) is None
    assert outgoing_text(f"Here you go.\n\n{standalone()}\n\nAnything else?", "false", recorded) == \
        "Here you go.\n\nAnything else?"
    # repeated with its line breaks reflowed
    assert outgoing_text("Sure. " + " ".join(standalone().split()) + " Done.", "false", recorded) == "Sure. Done."
    assert outgoing_text(standalone(), "tagged", recorded) == standalone()
    # a summary nobody recorded is somebody's text: delivered whole
    assert outgoing_text(standalone(), "false", []) == standalone()


def test_provider_copy_never_carries_guard_keys_and_leaves_the_original() -> None:
    live = [{"role": "assistant", "content": "x", "is_compressed_summary": True, "_compressed_summary": True},
            {"role": "user", "content": "y"}]
    sent = provider_messages(live)
    assert sent == [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]
    assert live[0]["is_compressed_summary"] is True
    assert sent[1] is live[1]


# -- the marker in ordinary text ---------------------------------------------------------

LEGACY = "[CONTEXT SUMMARY]:"
QUOTING = [
    f"Step 1: run make.\nStep 2: the line `{LEGACY}` in your log…\nStep 3: rotate the deploy key NOW",
    f"{LEGACY} is what Hermes prints; ignore it.\nThe fix is in step 3.",
    f"```\n2026-06-01 INFO {PREFIX} Earlier turns were compacted\n```\nwhy does my log say that?",
    f"{PREFIX} — that is the header I keep seeing. What does it mean?",
]


def test_the_marker_in_ordinary_text_is_not_a_summary() -> None:
    for text in QUOTING:
        message = {"role": "user", "content": text}
        assert not s.is_summary_message(message)
        assert display_messages([message], "false") == [message]
        assert display_messages([message], "tagged") == [message]
        assert outgoing_text(text, "false", [standalone()]) == text
        assert outgoing_text(text, "false") == text


def test_a_recorded_hash_makes_a_summary_and_the_quote_in_a_merged_message_stays() -> None:
    assert s.is_summary_message({"role": "user", "content": standalone()}, {text_hash(standalone())})
    quoted = f"my log has `{LEGACY}` twice"
    for merged in (merged_014(quoted), merged_019(quoted)):
        shown = display_messages([{"role": "user", "content": merged, "is_compressed_summary": True}], "false")
        assert [m["content"] for m in shown] == [quoted]


def test_compression_tags_what_the_compressor_wrote_not_a_kept_quote() -> None:
    before = _msgs(10)
    before[8]["content"] = QUOTING[0]
    after = [*copy.deepcopy(before[:3]), {"role": "assistant", "content": standalone()}, *copy.deepcopy(before[7:])]
    s.decorate_summaries(before, after, session_id="S", snapshot_id="S.snapshot.1", header=True, native_key=None)
    assert [i for i, m in enumerate(after) if m.get("is_compressed_summary")] == [3]
    assert after[5]["content"] == QUOTING[0]
    assert s.summary_indices(after, before) == [3]

    class Unread(list[dict[str, str]]):
        def __iter__(self) -> Any:
            raise AssertionError("the input's texts were collected")

    # every summary tagged by then and no quote to tell apart: the input's texts are not collected
    assert s.summary_indices([*after[:5], *after[6:]], Unread(before)) == [3]


def test_the_recall_line_goes_after_the_hosts_prefix_not_after_a_quote() -> None:
    line = s.recall_header("S1", 4, 17, "S1.snapshot.X")
    text = s.with_recall_header(merged_019(f"quoting `{PREFIX}` here"), line)
    assert text.split(DELIM, 1)[1].lstrip().splitlines()[1] == line


def test_recall_indexes_a_quoting_message_whole() -> None:
    from hermes_session_guard.summaries.recall import recall_text

    for text in QUOTING[:1] + QUOTING[2:3]:
        assert recall_text({"role": "user", "content": text}) == text
    assert recall_text({"role": "user", "content": merged_014("what next?")}) == "what next?"
    assert recall_text({"role": "assistant", "content": standalone()}) is None


def test_a_turn_in_progress_that_quotes_the_prefix_is_still_the_turn() -> None:
    from hermes_session_guard.contract.generations import turn_in_progress

    quoting = [{"role": "assistant", "content": "ok"}, {"role": "user", "content": QUOTING[0]}]
    assert turn_in_progress(quoting, s.has_summary_block) == 1
    merged = [{"role": "assistant", "content": "ok"}, {"role": "user", "content": merged_014("what next?")}]
    assert turn_in_progress(merged, s.has_summary_block) == 0


def test_text_without_summary_keeps_the_text_of_a_019_merged_message() -> None:
    """0.19 puts the tail message's text before the summary, which ends with the end
    marker: the text after the marker is empty, the person's words are before it."""
    assert s.text_without_summary(merged_019("what next?")) == "what next?"
    assert s.text_without_summary(merged_014("what next?")) == "what next?"
    assert s.text_without_summary(standalone()) == ""
    assert s.text_without_summary("plain") == "plain"
