"""Which compaction a message list belongs to, and what to do with a list that is behind.

Every guarded compaction of a session makes its live transcript start with a new
*compacted block* (summary, kept head and tail). The guard records that block's
length and a digest of its message keys as the session's *generation*
(:class:`~hermes_session_guard.store.GenerationRecord`). A contender whose list
does not start with the current block predates the latest compaction: compacting
it again would summarise turns that are already summarised and overwrite the
winner's work (a lost update and a second summary call). Instead it *adopts* the
live transcript plus the messages only it has.

Everything here is plain data manipulation on message dicts; no Hermes import.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..store import GenerationRecord, message_text

Key = tuple[str, str, str]


# A lone UTF-16 surrogate cannot be bound by sqlite3: Hermes's writer stores U+FFFD instead.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def message_key(message: Any) -> Key:
    """What identifies a message across a round trip through state.db: role, text
    (stripped, as Hermes's loaders strip it; lone surrogates as Hermes's writer stores
    them) and tool call id."""
    if isinstance(message, dict):
        role, text, call = message.get("role"), message_text(message), message.get("tool_call_id")
    else:
        role, text, call = getattr(message, "role", ""), getattr(message, "content", ""), ""
    text = str(text or "").strip()
    return (str(role or ""), text if text.isascii() else _LONE_SURROGATE.sub("\ufffd", text), str(call or ""))


def keys_of(messages: Iterable[Any]) -> list[Key]:
    return [message_key(m) for m in messages]


class Keyed:
    """A message list with its keys computed once (texts can be large)."""

    __slots__ = ("messages", "keys")

    def __init__(self, messages: Sequence[Any], keys: list[Key] | None = None) -> None:
        self.messages = messages
        self.keys = keys_of(messages) if keys is None else keys


def _keyed(x: Sequence[Any] | Keyed) -> Keyed:
    return x if isinstance(x, Keyed) else Keyed(x)


_DIGEST_FORM = "k2:"  # block_digest's form; a record without it was written by an earlier guard (JSON of the keys)


def block_digest(keys: Sequence[Key]) -> str:
    """A digest of the keys: each key's role, tool call id and text, each after its length
    (so no two key lists give one byte stream), hashed one message at a time."""
    h = hashlib.sha256()
    for role, text, call in keys:
        h.update(f"{len(role)}:{role}{len(call)}:{call}{len(text)}:".encode("utf-8", "surrogatepass"))
        h.update(text.encode("utf-8", "surrogatepass"))  # any str (safe_text)
    return _DIGEST_FORM + h.hexdigest()


def digest_matches(keys: Sequence[Key], recorded: str) -> bool:
    """Whether ``keys`` have the digest ``recorded``, in the form it was recorded in (a
    generation record written before :func:`block_digest`'s form is read as it was written)."""
    if recorded.startswith(_DIGEST_FORM):
        return block_digest(keys) == recorded
    payload = json.dumps(list(keys), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest() == recorded


_MERGEABLE = ("user", "assistant")


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _merged_run(item: Key, reference: Sequence[Key], j: int) -> int:
    """If ``item`` is Hermes's merge of the same-role run ``reference[j:k]`` (its
    alternation repair joins consecutive user or assistant turns with blank lines),
    return ``k``; a merge that runs on past the end of ``reference`` counts up to
    the end. Otherwise return ``j``."""
    role, text = item[0], item[1]
    if role not in _MERGEABLE:
        return j
    pos, k = 0, j
    while k < len(reference) and reference[k][0] == role:
        part = reference[k][1]
        if not text.startswith(part, pos):
            return j
        end = pos + len(part)
        k += 1
        if end == len(text):
            return k if k > j + 1 else j
        pos = _skip_space(text, end)
        if pos == end and part:  # parts of a merge are separated by whitespace
            return j
    # the merge goes on past what ``reference`` holds (e.g. the block's last turn
    # merged with one appended after the compaction)
    return k if k == len(reference) and k > j else j


def aligned_prefix(contender: Sequence[Key], reference: Sequence[Key]) -> tuple[int, int]:
    """The longest common start of two key lists, where one contender message may be
    a merge of several consecutive reference messages. Returns how many contender
    and how many reference messages it covers."""
    i = j = 0
    while i < len(contender) and j < len(reference):
        if contender[i] == reference[j]:
            i, j = i + 1, j + 1
            continue
        k = _merged_run(contender[i], reference, j)
        if k == j:
            break
        i, j = i + 1, k
    return i, j


def _paragraph_of(whole: str, part: str) -> bool:
    """``part`` is a whole paragraph of ``whole`` (blank lines around it): how a merged
    turn or a turn Hermes prefixed with a note carries the text it was stored with."""
    if not part or whole == part:
        return False
    pattern = rf"(?:^|\n\s*\n\s*){re.escape(part)}(?:\s*\n\s*\n|$)"
    return re.search(pattern, whole) is not None


def _without(items: Sequence[Any], keys: Sequence[Key], taken: Sequence[Key]) -> list[Any]:
    """``items`` in order, minus one occurrence per key in ``taken`` (a ``taken``
    message that is a merge of several items, or an item with a note around it,
    accounts for them)."""
    left = Counter(taken)
    merged = [k for k in taken if k[0] in _MERGEABLE]
    out = []
    for item, key in zip(items, keys, strict=True):
        if left[key] > 0:
            left[key] -= 1
            continue
        if key[0] in _MERGEABLE and any(m[0] == key[0] and _paragraph_of(m[1], key[1]) for m in merged):
            continue
        out.append(item)
    return out


@dataclass(frozen=True)
class Assessment:
    """Where a contender's list stands against the live transcript."""

    stale: bool
    basis: str  # "record" | "summary" | "never-compacted"
    generation: int
    block_len: int  # how many leading live messages the latest compaction wrote


def assess(
    contender: Sequence[Any] | Keyed,
    live: Sequence[Any] | Keyed,
    record: GenerationRecord | None,
    is_summary: Callable[[str], bool],
) -> Assessment:
    """Is ``contender`` behind the session's latest compaction?

    With a generation record that still matches the live transcript, the answer is
    exact: the contender must start with the recorded block. Without one (the
    session was compacted by Hermes alone, or rewritten since), the last summary
    in the live transcript must sit at the same place, with the same messages
    before it, in the contender. Turns Hermes merged in memory still line up."""
    c_keys, l_keys = _keyed(contender).keys, _keyed(live).keys
    if record is not None and len(l_keys) >= record.block_len:
        block = l_keys[: record.block_len]
        if digest_matches(block, record.block_digest):
            stale = aligned_prefix(c_keys, block)[1] < len(block)
            return Assessment(stale, "record", record.generation, record.block_len)
    summary_at = [i for i, k in enumerate(l_keys) if is_summary(k[1])]
    generation = record.generation if record is not None else 0
    if not summary_at:
        return Assessment(False, "never-compacted", generation, 0)
    end = summary_at[-1] + 1
    return Assessment(aligned_prefix(c_keys, l_keys[:end])[1] < end, "summary", generation, end)


def foreign_messages(own: Sequence[Any] | Keyed, live: Sequence[Any] | Keyed) -> list[Any]:
    """Live messages the compressing agent does not have: turns other agents of the
    same session appended since it loaded the transcript. They are not part of its
    summary and must stay live after the compaction (in order, after the block)."""
    own_k, live_k = _keyed(own), _keyed(live)
    i, j = aligned_prefix(own_k.keys, live_k.keys)
    return _without(live_k.messages[j:], live_k.keys[j:], own_k.keys[i:])


def genuinely_new(
    contender: Sequence[Any] | Keyed,
    known_versions: Iterable[Sequence[Any] | Keyed],
    live: Sequence[Any] | Keyed,
    appended_from: int,
) -> list[Any] | None:
    """The messages of a stale ``contender`` that no earlier transcript had and the
    live one does not have yet (its own turns since it loaded the transcript).

    ``known_versions`` are the transcripts the session went through (its snapshots
    and the live one); the contender's list is a prefix of one of them plus its own
    messages. Returns None when the list lines up with none of them (it cannot be
    placed safely, so the caller skips rather than guess)."""
    c = _keyed(contender)
    best = 0
    for version in known_versions:
        best = max(best, aligned_prefix(c.keys, _keyed(version).keys)[0])
        if best == len(c.keys):
            break
    if best == 0 and c.keys:
        return None
    return _without(c.messages[best:], c.keys[best:], _keyed(live).keys[appended_from:])


def turn_in_progress(messages: Sequence[Any], is_summary: Callable[[str | None], bool]) -> int:
    """How many trailing messages of an agent's list are its turn in progress: its last
    user message and what followed it (tool calls and their results), while no final
    answer (an assistant message without tool calls) ends the list. 0 when the list
    ends with an answer, or when its last user message is a summary."""
    if not messages:
        return 0
    last = messages[-1]
    if isinstance(last, dict) and last.get("role") == "assistant" and not last.get("tool_calls"):
        return 0
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, dict) and m.get("role") == "user":
            return 0 if is_summary(message_text(m)) else len(messages) - i
    return 0


def turn_last(messages: Sequence[Any], keys: Sequence[Key], turn: Sequence[Key]) -> list[Any]:
    """``messages`` with the agent's turn in progress (``turn``, its keys in order) at
    the end: the last occurrence of each of those messages is moved after everything
    else. Other agents' messages of the same session that arrived during the turn
    (Hermes 0.17 and 0.18.2 persist a user message before its preflight compression)
    then come before it, so the agent still answers its own question, as it would
    had no compression happened."""
    wanted = Counter(turn)
    picked: list[int] = []
    for i in range(len(messages) - 1, -1, -1):
        if wanted[keys[i]] > 0:
            wanted[keys[i]] -= 1
            picked.append(i)
    chosen = set(picked)
    moved = sorted(picked)  # the turn's own order, as it stands in ``messages``
    return [m for i, m in enumerate(messages) if i not in chosen] + [messages[i] for i in moved]


def own_turn_apart(messages: Sequence[Any], keys: Sequence[Key], own: Sequence[Key],
                   is_summary: Callable[[str], bool], start: int = 0) -> list[Any]:
    """``messages`` (an adopted or carried-over list the agent continues with) without
    the user messages of *other* turns that have no answer in it: another turn of the
    same session that stored its prompt and is still running (Hermes 0.17+ persist a
    turn's user message before its preflight compression). Left in, such a prompt
    sits right before the agent's own one, and Hermes's alternation repair folds two
    adjacent user messages into one (``a\n\nb``): the agent would answer a merged
    prompt, and that merge would be written back. The message stays in state.db,
    where its own turn answers it; ``own`` (the keys of the agent's own messages,
    counted) are never left out, nor are summaries, nor anything before ``start``
    (the compacted block)."""
    mine = Counter(own)
    out: list[Any] = list(messages[:start])
    for i, (m, key) in enumerate(zip(messages[start:], keys[start:], strict=True), start):
        if mine[key] > 0:
            mine[key] -= 1
            out.append(m)
            continue
        nxt = keys[i + 1][0] if i + 1 < len(keys) else None
        unanswered = key[0] == "user" and nxt in ("user", None) and not is_summary(key[1])
        if not unanswered:
            out.append(m)
    return out
