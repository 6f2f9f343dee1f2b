"""Recognising, tagging and annotating the host's compaction summaries.

A summary is a message the compressor produced carrying the host's summary
prefix, either as the whole message or merged into the first tail message (0.14:
summary first, then the end marker, then the original text; 0.19: "[PRIOR
CONTEXT ...]" header, the original text, a delimiter, then the summary). Nothing
here imports Hermes; the markers come from :mod:`host`.

Whether a message *is* a summary is decided by what was recorded, never by the
prefix appearing in its text (people paste Hermes logs, models quote them): the
guard's tag, Hermes's own flag (0.17+), the content hash the guard stored for the
session's summaries, or, at compression time, being a new message the compressor
wrote (not one it kept from the conversation). :func:`is_summary_text` is only a
cheap "may carry a summary" filter and the way to take apart a message already
known to be one.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Any

from ..store import message_text, text_hash
from . import host_port

#: The guard's own marker key (frontends filter on it; never sent to a provider).
SUMMARY_TAG = "is_compressed_summary"

# Where a summary merged into a tail message ends (0.14+: the tail follows it).
SUMMARY_END_MARKER = "--- END OF CONTEXT SUMMARY"

_HEADER_RE = re.compile(r"^\[Original context: session [^\n\]]*\][ \t]*(?:\n|$)", re.MULTILINE)
_HEADER_SNAPSHOT_RE = re.compile(r"^\[Original context: session [^\n\]]*?, snapshot ([^\n\]]+)\]", re.MULTILINE)


def is_summary_text(text: str | None) -> bool:
    """True when ``text`` carries a compaction summary, standalone or merged into
    another message (0.19 puts the prefix after a merge delimiter, so look anywhere)."""
    return text is not None and any(p in text for p in host_port.summary_prefixes())


def is_tagged(message: Any) -> bool:
    return isinstance(message, dict) and bool(message.get(SUMMARY_TAG) or message.get(host_port.NATIVE_SUMMARY_KEY))


def is_summary_message(message: Any, known_hashes: Collection[str] = ()) -> bool:
    """A summary by the guard's tag, the host's own flag, or a content hash the
    guard recorded for a summary (``known_hashes`` plus this process's
    :func:`remember_summary` record). Text that merely contains the prefix is not."""
    if not isinstance(message, dict):
        return False
    if is_tagged(message):
        return True
    text = message_text(message)
    if not text or not is_summary_text(text):
        return False
    digest = text_hash(text)
    return digest in known_hashes or digest in _recorded


def summary_indices(messages: list[Any], before: list[Any] | None = None) -> list[int]:
    """Indices of the summaries in a compressor's output ``messages``: tagged ones, and
    messages carrying the prefix that the compressor wrote itself (absent from its
    input ``before``: the standalone summary or the tail message it merged one into).
    A kept message that quotes the prefix is not one. Without ``before`` every
    message carrying the prefix counts (a bare compressor output, nothing kept)."""
    return _summary_indices(messages, _Texts(before if before is not None else []))


class _Texts:
    """The texts of a message list, for ``in``: found by length first, so no long text is
    hashed (a compaction's input holds the whole transcript, about 0.7 MB at 48 turns).
    Collected at the first ``in``: a scan that finds every summary tagged asks none."""

    __slots__ = ("_messages", "_by_length")

    def __init__(self, messages: list[Any]) -> None:
        self._messages = messages
        self._by_length: dict[int, list[str | None]] | None = None

    def __contains__(self, text: object) -> bool:
        if self._by_length is None:
            self._by_length = {}
            for m in self._messages:
                if isinstance(m, dict):
                    kept = message_text(m)
                    self._by_length.setdefault(-1 if kept is None else len(kept), []).append(kept)
        return text in self._by_length.get(len(text) if isinstance(text, str) else -1, ())


def _summary_indices(messages: list[Any], kept: _Texts) -> list[int]:
    """:func:`summary_indices` with the input's texts ``kept`` already collected."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            continue
        if is_tagged(m):
            out.append(i)
            continue
        text = message_text(m)
        if is_summary_text(text) and text not in kept:
            out.append(i)
    return out


# -- what this process recorded ----------------------------------------------------------
_RECORD_LIMIT = 512
_recorded: OrderedDict[str, str] = OrderedDict()  # content hash -> text, newest last
_record_lock = threading.Lock()


def remember_summary(text: str | None) -> None:
    """Record a summary the guard tagged (made by a compression here, or loaded with a
    stored mark), so copies that lost their keys are still known, and a model repeating
    it verbatim can be recognised on delivery."""
    if not text or not text.strip():
        return
    digest = text_hash(text)
    with _record_lock:
        _recorded[digest] = text
        _recorded.move_to_end(digest)
        while len(_recorded) > _RECORD_LIMIT:
            _recorded.popitem(last=False)


def recorded_summaries() -> list[str]:
    """The summary texts this process recorded, newest first."""
    with _record_lock:
        return list(reversed(_recorded.values()))


def tag_recorded(messages: list[Any], hashes: Collection[str], snapshot_ids: Collection[str],
                 native_key: str | None) -> list[Any]:
    """Tag the messages of a loaded transcript whose content hash the guard stored for a
    summary, or Hermes summaries that carry the guard's recall line naming one of the
    session's snapshots; returns the tagged messages."""
    found = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        text = message_text(message)
        # A stored hash is a record on its own (an engine's own format has no prefix);
        # a recall line counts only inside a Hermes summary.
        if text_hash(text) in hashes or (
                is_summary_text(text) and any(s in snapshot_ids for s in header_snapshot_ids(text))):
            tag(message, native_key)
            remember_summary(text)
            found.append(message)
    return found


# -- the recall header ---------------------------------------------------------------


def recall_header(session_id: str, first_turn: int, last_turn: int, snapshot_id: str) -> str:
    return f"[Original context: session {session_id}, turns {first_turn}–{last_turn}, snapshot {snapshot_id}]"


def strip_recall_header(text: str) -> str:
    """Remove the guard's ``[Original context: ...]`` line(s); everything else is kept byte for byte."""
    if "[Original context: session " not in text:
        return text
    return _HEADER_RE.sub("", text)


def header_snapshot_ids(text: str | None) -> list[str]:
    return _HEADER_SNAPSHOT_RE.findall(text or "")


def with_recall_header(text: str, header: str) -> str:
    """``text`` with ``header`` as its own line right after the line carrying the
    summary prefix, so prefix-based detection by the host keeps working."""
    text = strip_recall_header(text)
    found = [(text.find(p), p) for p in host_port.summary_prefixes() if p in text]
    if not found:
        return text
    start, _prefix = min(found)
    located = _structured_start(text, host_port.merged_summary_markers()[1])
    if located is not None:
        start = located[1]
    end_of_line = text.find("\n", start)
    if end_of_line < 0:
        return f"{text}\n{header}"
    return f"{text[: end_of_line + 1]}{header}\n{text[end_of_line + 1:]}"


def map_summary_text(message: dict[str, Any], fn: Callable[[str], str]) -> None:
    """Apply ``fn`` to the text that carries the summary (string content, or the
    text part of list content that carries it)."""
    content = message.get("content")
    if isinstance(content, str):
        if is_summary_text(content):
            message["content"] = fn(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str) and is_summary_text(part["text"]):
                part["text"] = fn(part["text"])
                return


# -- what is summary and what is the conversation ------------------------------------


def split_summary(text: str) -> tuple[str, str, str]:
    """``(before, summary_block, after)``: the block runs from the summary prefix (or
    the 0.19 merge delimiter in front of it) through the end-marker line."""
    found = [text.find(p) for p in host_port.summary_prefixes() if p in text]
    if not found:
        return text, "", ""
    start = prefix_at = min(found)
    prior_header, delimiter = host_port.merged_summary_markers()
    located = _structured_start(text, delimiter)
    if located is not None:
        start, prefix_at = located
    elif delimiter:
        d = text.rfind(delimiter, 0, prefix_at)
        if d >= 0:
            start = d
    marker = text.find(SUMMARY_END_MARKER, prefix_at)
    if marker >= 0:
        nl = text.find("\n", marker)
        end = len(text) if nl < 0 else nl + 1
    else:
        end = len(text)
    before, block, after = text[:start], text[start:end], text[end:]
    if prior_header and before.lstrip().startswith(prior_header):
        before = before.lstrip()[len(prior_header):]
    return before, block, after


def _structured_start(text: str, delimiter: str) -> tuple[int, int] | None:
    """``(block_start, prefix_at)`` where the host put a summary: the prefix right after
    the 0.19 merge delimiter, or at the very start of the message (standalone, 0.14
    merge). ``None`` when the prefix only appears somewhere inside other text."""
    prefixes = host_port.summary_prefixes()
    if delimiter:
        at = text.find(delimiter)
        while at >= 0:
            rest = text[at + len(delimiter):]
            stripped = rest.lstrip()
            if any(stripped.startswith(p) for p in prefixes):
                return at, at + len(delimiter) + (len(rest) - len(stripped))
            at = text.find(delimiter, at + 1)
    stripped = text.lstrip()
    if any(stripped.startswith(p) for p in prefixes):
        return 0, len(text) - len(stripped)
    return None


def has_summary_block(text: str | None) -> bool:
    """``text`` carries the prefix where the host puts a summary (its start, or right
    after the 0.19 merge delimiter), not only quoted somewhere inside."""
    return (text is not None and is_summary_text(text)
            and _structured_start(text, host_port.merged_summary_markers()[1]) is not None)


def original_part(text: str | None) -> str:
    """The conversation text of a message known to be a summary, with the summary
    block removed (empty for a standalone summary; the real user text of a merged
    one). Further blocks are removed only where the host puts them (a summary merged
    into a message that already carried one); the prefix quoted inside the person's
    own words is their text and stays."""
    text = text or ""
    for n in range(8):  # a message never carries more than a couple of blocks
        if n and not has_summary_block(text):
            break
        before, block, after = split_summary(text)
        if not block:
            break
        text = f"{before.strip()}\n\n{after.strip()}".strip()
    return text.strip()


def summary_body(text: str) -> str:
    """What follows the prefix, up to a merged message's end marker: the summary
    the model wrote."""
    block = split_summary(text)[1]
    text = block or text
    for prefix in host_port.summary_prefixes():
        if prefix in text:
            text = text.split(prefix, 1)[1]
            break
    return strip_recall_header(text.split(SUMMARY_END_MARKER, 1)[0]).strip()


def summary_body_sizes(messages: list[Any], found: list[int]) -> list[int]:
    """Characters of summary text (after the prefixes) of each summary ``found`` in ``messages``
    (:func:`summary_indices`): all zero when the compressor inserted a summary marker with
    nothing behind it (an empty answer from the summary model that the host did not treat
    as a failure)."""
    return [len(summary_body(message_text(messages[i]) or "")) for i in found]


# -- which turns were compacted -----------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    return (
        isinstance(a, dict) and isinstance(b, dict) and a.get("role") == b.get("role")
        and message_text(a) == message_text(b)
    )


def _kept_in(original: Any, new: Any) -> bool:
    """``new`` is ``original`` itself, or ``original`` with the summary merged into it."""
    if _same(original, new):
        return True
    if not (isinstance(original, dict) and isinstance(new, dict)):
        return False
    old_text, new_text = (message_text(original) or "").strip(), message_text(new) or ""
    return bool(old_text) and is_summary_text(new_text) and old_text in new_text


def compacted_range(before: list[Any], after: list[Any]) -> tuple[int, int] | None:
    """1-based positions ``(first, last)`` of the turns of ``before`` that ``after``
    no longer carries verbatim: the protected head and tail are matched from
    both ends, whatever lies between was summarised."""
    n, m = len(before), len(after)
    head = 0
    while head < min(n, m) and _same(before[head], after[head]):
        head += 1
    tail = 0
    while tail < n - head and tail < m - head and _kept_in(before[n - 1 - tail], after[m - 1 - tail]):
        tail += 1
    first, last = head + 1, n - tail
    return (first, last) if first <= last else None


# -- what an engine of its own produced --------------------------------------------------
#: Where each message an engine of its own was given came from (its position in the
#: input), recorded on the message for the length of one ``compress`` call: a copy the
#: engine makes of a kept message (``{**m, "content": shorter}``) carries it, the message
#: it writes itself does not. Never sent to a provider (:mod:`.wire`), removed after the call.
SOURCE_KEY = "_session_guard_source"


def mark_sources(messages: list[Any]) -> list[dict[str, Any]]:
    """Record each message's position in ``messages`` on it (:data:`SOURCE_KEY`);
    returns the marked dicts, for :func:`unmark_sources`."""
    marked = []
    for j, message in enumerate(messages):
        if isinstance(message, dict) and SOURCE_KEY not in message:
            message[SOURCE_KEY] = j
            marked.append(message)
    return marked


def unmark_sources(*groups: Any) -> None:
    """Remove :data:`SOURCE_KEY` from every dict of ``groups`` (lists of messages)."""
    for group in groups:
        for message in group if isinstance(group, list) else ():
            if isinstance(message, dict):
                message.pop(SOURCE_KEY, None)


def produced_by_source(before: list[Any], after: list[Any]) -> list[int] | None:
    """Positions in ``after`` of the one message the engine wrote itself, decided by the
    recorded :data:`SOURCE_KEY` (never by what a text says): the one user/assistant
    message without a counterpart in ``before``, when the engine kept marked messages
    (copies, shortened or not, count as kept), dropped more than it added, and a kept
    message follows it. ``None`` when no message of ``after`` carries a mark (nothing
    to go by); ``[]`` when the output does not fit (several new messages, or kept ones
    rebuilt without their keys: hiding a person's turn is worse than showing a summary)."""
    n, m = len(before), len(after)
    sources = [a.get(SOURCE_KEY) if isinstance(a, dict) else None for a in after]
    kept = [i for i, src in enumerate(sources) if isinstance(src, int) and 0 <= src < n]
    if not kept:
        return None
    new = [i for i in range(m) if sources[i] is None]
    made = [i for i in new if isinstance(after[i], dict) and after[i].get("role") in ("user", "assistant")
            and not after[i].get("tool_calls")]
    dropped = n - len({sources[i] for i in kept})
    if len(made) != 1 or dropped <= len(new) or not any(i > made[0] for i in kept):
        return []
    return made


# -- tagging ---------------------------------------------------------------------------


def tag(message: dict[str, Any], native_key: str | None) -> None:
    message[SUMMARY_TAG] = True
    if native_key:
        message[native_key] = True


def decorate_summaries(
    before: list[Any],
    after: list[Any],
    *,
    session_id: str,
    snapshot_id: str,
    header: bool,
    native_key: str | None,
    produced: list[int] | None = None,
    found: list[int] | None = None,
) -> list[int]:
    """Tag every summary in ``after`` and give the new ones the recall header.
    ``produced``: positions of summaries known from the compaction itself (an engine's
    own format, without Hermes's prefix); they are tagged too (no header: there is
    no prefix line to put it after). ``found``: ``summary_indices(after, before)``, when
    the caller has it already. Returns the indices of the new summaries."""
    old = _Texts(before)
    summaries = _summary_indices(after, old) if found is None else found
    # the new ones: an earlier summary kept in the protected head keeps its own header (an
    # untagged one was found by not being in ``before``)
    fresh = [i for i in summaries if not is_tagged(after[i]) or message_text(after[i]) not in old]
    span = compacted_range(before, after)
    tagged = sorted({*summaries, *(produced or ())})
    for i in tagged:
        tag(after[i], native_key)
    if header and span is not None:
        line = recall_header(session_id, span[0], span[1], snapshot_id)
        for i in fresh:
            map_summary_text(after[i], lambda text: with_recall_header(text, line))
    for i in tagged:
        remember_summary(message_text(after[i]))
    return fresh


def text_without_summary(text: str) -> str:
    """What a message says besides a compaction summary merged into it ("" for a
    standalone summary): the text after the end marker's line (0.14+) or the prior text
    wrapped before the summary (0.19, whose summary itself ends with the end marker).
    The same cut as :func:`original_part`."""
    if not is_summary_text(text):
        return text
    return original_part(text)
