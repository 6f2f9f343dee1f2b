"""Which compaction a message list belongs to, and what a stale list adopts."""

from __future__ import annotations

from typing import Any

from hermes_session_guard.contract.generations import (
    assess,
    block_digest,
    digest_matches,
    foreign_messages,
    genuinely_new,
    keys_of,
    message_key,
    turn_in_progress,
    turn_last,
)
from hermes_session_guard.store import GenerationRecord

PREFIX = "[CONTEXT COMPACTION — REFERENCE ONLY]"
SID = "20260528_155201_68dc5996"


def is_summary(text: str) -> bool:
    return PREFIX in text


def msgs(*texts: str) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]


def record(block: list[dict[str, Any]], generation: int = 1) -> GenerationRecord:
    return GenerationRecord(SID, generation, len(block), block_digest(keys_of(block)), "op", None, 0.0)


RAW = msgs(*(f"turn-{i}" for i in range(10)))
BLOCK = [*RAW[:2], {"role": "user", "content": f"{PREFIX}\nsummary of turns 2-7"}, *RAW[8:]]


def test_a_record_of_an_earlier_digest_form_still_matches() -> None:
    """Generation records written before the length-prefixed digest hold a SHA-256 of the keys'
    JSON: they are read in that form, so an upgrade never takes a current list for a stale one."""
    import hashlib
    import json

    keys = keys_of(BLOCK)
    legacy = hashlib.sha256(json.dumps(keys, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()
    assert digest_matches(keys, legacy) and digest_matches(keys, block_digest(keys))
    assert not digest_matches(keys[:-1], legacy) and not digest_matches(keys[:-1], block_digest(keys))
    assert assess(BLOCK, BLOCK, GenerationRecord(SID, 1, len(BLOCK), legacy, "op", None, 0.0), is_summary).basis \
        == "record"
    # no two key lists give one byte stream: a role, call id or text boundary moved is another digest
    assert block_digest([("user", "ab", "")]) != block_digest([("user", "a", "b")])


def test_message_key_survives_a_database_round_trip() -> None:
    assert message_key({"role": "user", "content": "hello "}) == message_key({"role": "user", "content": "hello"})
    parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert message_key(parts) == ("user", "a\nb", "")
    assert message_key({"role": "tool", "content": None, "tool_call_id": "c1"}) == ("tool", "", "c1")


def test_list_that_starts_with_the_recorded_block_is_current() -> None:
    live = [*BLOCK, *msgs("later")]
    standing = assess([*BLOCK, *msgs("mine")], live, record(BLOCK), is_summary)
    assert not standing.stale and standing.basis == "record" and standing.block_len == len(BLOCK)


def test_list_from_before_the_compaction_is_stale() -> None:
    standing = assess([*RAW, *msgs("mine")], BLOCK, record(BLOCK, generation=3), is_summary)
    assert standing.stale and standing.basis == "record" and standing.generation == 3


def test_list_from_an_older_generation_is_stale_even_with_the_same_summary_text() -> None:
    older = [*BLOCK, *msgs("x", "y")]
    newer = [*BLOCK[:3], *msgs("y")]  # same head and summary text, different block
    assert assess(older, newer, record(newer, 2), is_summary).stale


def test_without_a_usable_record_the_live_summary_decides() -> None:
    rewritten = record(msgs("something else"))  # no longer matches the live transcript
    assert assess([*RAW], BLOCK, rewritten, is_summary).stale
    standing = assess([*BLOCK, *msgs("new")], BLOCK, None, is_summary)
    assert not standing.stale and standing.basis == "summary" and standing.block_len == 3


def test_never_compacted_session_is_never_stale() -> None:
    standing = assess(RAW[:4], RAW, None, is_summary)
    assert not standing.stale and standing.basis == "never-compacted"


def test_foreign_messages_are_the_live_turns_this_agent_does_not_have() -> None:
    mine = [*RAW, {"role": "user", "content": "a-new"}]
    theirs = [{"role": "user", "content": "b-new"}, {"role": "assistant", "content": "b-answer"}]
    live = [*RAW, theirs[0], {"role": "user", "content": "a-new"}, theirs[1]]
    assert foreign_messages(mine, live) == theirs
    assert foreign_messages(live, live) == []


def test_foreign_messages_keep_a_repeated_short_message_from_another_agent() -> None:
    mine = [*msgs("ok", "fine")]
    live = [*msgs("ok", "fine"), {"role": "user", "content": "ok"}]
    assert foreign_messages(mine, live) == [{"role": "user", "content": "ok"}]


def test_stale_list_adopts_only_its_own_new_messages() -> None:
    snapshot = [*RAW, {"role": "user", "content": "a-new"}]
    live = [*BLOCK, {"role": "user", "content": "c-flushed-after"}]
    mine_new = {"role": "user", "content": "b-new"}
    flushed = {"role": "user", "content": "c-flushed-after"}
    stale = [*RAW, flushed, mine_new]
    new = genuinely_new(stale, [snapshot, live], live, len(BLOCK))
    assert new == [mine_new]
    assert new[0] is mine_new  # the caller's own dict, so the host keeps tracking it


def test_stale_list_from_two_generations_ago_lines_up_with_the_older_snapshot() -> None:
    gen1_input = [*RAW]
    gen2_input = [*BLOCK, *msgs("p", "q")]
    live = [*BLOCK[:3], *msgs("q")]
    stale = [*RAW, {"role": "user", "content": "late"}]
    assert genuinely_new(stale, [gen2_input, gen1_input, live], live, len(live)) == [
        {"role": "user", "content": "late"}
    ]


def test_stale_list_that_lines_up_with_nothing_is_not_placed() -> None:
    assert genuinely_new(msgs("unrelated", "history"), [RAW], BLOCK, len(BLOCK)) is None
    assert genuinely_new([], [RAW], BLOCK, len(BLOCK)) == []


def merged(*parts: dict[str, Any]) -> dict[str, Any]:
    """What Hermes's alternation repair makes of consecutive same-role turns."""
    return {"role": parts[0]["role"], "content": "\n\n".join(str(p["content"]) for p in parts)}


def test_list_whose_consecutive_turns_hermes_merged_is_still_current() -> None:
    other, mine = {"role": "user", "content": "other agent asks"}, {"role": "user", "content": "I ask"}
    block = [*BLOCK[:-1], {"role": "user", "content": "last kept turn"}]
    live = [*block, other, mine]
    # the block's last user turn and the two after it became one message in memory
    contender = [*block[:-1], merged(block[-1], other, mine), {"role": "assistant", "content": "answer"}]
    assert not assess(contender, live, record(block), is_summary).stale
    # ... and nothing in it is new or foreign
    assert genuinely_new(contender, [live], live, len(block)) == [{"role": "assistant", "content": "answer"}]
    assert foreign_messages(contender, live) == []


def test_merged_turns_inside_the_block_still_line_up() -> None:
    u1, u2 = {"role": "user", "content": "u1"}, {"role": "user", "content": "u2"}
    block = [*BLOCK, u1, u2]
    assert not assess([*BLOCK, merged(u1, u2)], block, record(block), is_summary).stale
    assert assess([*BLOCK, {"role": "user", "content": "u1 u3"}], block, record(block), is_summary).stale


def test_merge_with_stray_whitespace_at_the_join_lines_up() -> None:
    a, b = {"role": "user", "content": "first question "}, {"role": "user", "content": " second question"}
    raw_merge = {"role": "user", "content": a["content"] + "\n\n" + b["content"]}
    assert not assess([*BLOCK, raw_merge], [*BLOCK, a, b], record([*BLOCK, a, b]), is_summary).stale
    assert assess([*BLOCK, {"role": "user", "content": "first questionsecond question"}], [*BLOCK, a, b],
                  record([*BLOCK, a, b]), is_summary).stale


def test_a_turn_stored_without_its_in_memory_note_is_not_foreign() -> None:
    stored = {"role": "user", "content": "what changed?"}
    in_memory = {"role": "user", "content": "[System note: a new message arrived.]\n\nwhat changed?"}
    assert foreign_messages([*RAW, in_memory], [*RAW, stored]) == []


def test_a_short_foreign_turn_inside_a_longer_own_text_is_still_foreign() -> None:
    theirs = {"role": "user", "content": "ok"}
    mine = {"role": "user", "content": "looking at it, ok with me"}
    assert foreign_messages([*RAW, mine], [*RAW, mine, theirs]) == [theirs]
    assert foreign_messages([*RAW, mine], [*RAW, theirs]) == [theirs]


def test_the_turn_in_progress_runs_from_the_last_user_message_until_an_answer() -> None:
    asked = [*RAW[:4], {"role": "user", "content": "new question"}]
    assert turn_in_progress(asked, is_summary) == 1
    calls = [*asked, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]},
             {"role": "tool", "content": "result", "tool_call_id": "c1"}]
    assert turn_in_progress(calls, is_summary) == 3
    assert turn_in_progress([*calls, {"role": "assistant", "content": "the answer"}], is_summary) == 0
    assert turn_in_progress([RAW[0], {"role": "user", "content": f"{PREFIX} summary"}], is_summary) == 0
    assert turn_in_progress([], is_summary) == 0


def test_the_turn_in_progress_ends_the_list_after_what_others_persisted_meanwhile() -> None:
    mine = {"role": "user", "content": "s0-next"}
    others = [{"role": "user", "content": "s2-next"}, {"role": "user", "content": "s1-next"}]
    arrived = [*BLOCK, mine, *others]  # state.db order: s0 persisted its question first
    out = turn_last(arrived, keys_of(arrived), keys_of([mine]))
    assert out == [*BLOCK, *others, mine]
    assert out[-1] is mine
    # several messages of the turn keep their order; a message already last stays put
    turn = [mine, {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}]
    mixed = [*BLOCK, turn[0], others[0], turn[1]]
    assert turn_last(mixed, keys_of(mixed), keys_of(turn)) == [*BLOCK, others[0], *turn]
    assert turn_last(out, keys_of(out), keys_of([mine])) == out
