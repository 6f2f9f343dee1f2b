"""Recall: the exact original text of a conversation's compacted turns.

Searches the calling session's snapshots (and Hermes's own archived rows of that
session and of the sessions it continues after a pre-guard rotation) by words
and/or a turn range, and answers with verbatim excerpts and their turn numbers,
within a character budget. Nothing here knows where the session id comes from:
the caller passes the one the host says is calling, and everything read is
filtered by that session's lineage, in SQL and again in Python.

Why one module: the search (words and turn ranges), the lineage filter and
the budgeted answer are one algorithm; the tool around it is :mod:`.recall_tool`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..store import GuardStore, RecallDoc, message_text, text_hash
from .tags import has_summary_block, is_summary_message, original_part

#: First line of every recall answer; answers stored in later snapshots are not re-indexed.
OUTPUT_MARKER = "[session_guard_recall]"

MAX_CANDIDATES = 60
MIN_CANDIDATES = 24  # enough narrow matches: the wide OR query is not needed
# A word in at most this share of the indexed passages (or this many) counts as rare.
RARE_SHARE = 0.02
RARE_MIN_DOCS = 50
MAX_PASSAGES = 8
MAX_QUERY_TERMS = 8
# A term in more than this share of all indexed passages says little and costs a
# full scan of the index to rank: it is dropped (unless nothing else is left).
COMMON_TERM_SHARE = 0.35

_WORD = re.compile(r"[A-Za-z0-9]+")
_PHRASE = re.compile(r'"([^"]{2,200})"')

STOPWORDS = frozenset(
    """a about above after again all also am an and any are as at be been before being below between both but by
    can could did do does doing done down during each earlier exact exactly few find for from get give got had has
    have having he her here hers him his how i if in into is it its itself just let lets like look me more most my
    need no nor not now of off on once only or other our out over own please recall remember same say said she
    should show so some such tell than that the their them then there these they this those through to too turn
    turns under until up us use used very was we were what when where which while who whom why will with would you
    your original conversation session earlier previously compacted summary text value""".split()
)


def recall_text(message: dict[str, Any]) -> str | None:
    """The text of a stored message that recall indexes: the conversation part
    (summaries removed); recall's own answers are left out."""
    text = message_text(message) if isinstance(message, dict) else None
    if not text or text.lstrip().startswith(OUTPUT_MARKER):
        return None
    if not (is_summary_message(message) or has_summary_block(text)):
        return text  # the prefix quoted inside somebody's words is their text
    return original_part(text) or None


def recall_content(content: str | None) -> str | None:
    return recall_text({"content": content})


# -- the query --------------------------------------------------------------------------


def _key(term: str) -> str:
    """A crude stem for matching a query word inside a line (``deployment`` matches
    ``deployed``, ``migrations`` matches ``migration``)."""
    term = term.lower()
    if len(term) > 6:
        return term[:6]
    if len(term) > 3 and term.endswith("s"):
        return term[:-1]
    return term


@dataclass
class Query:
    text: str
    words: list[str] = field(default_factory=list)
    phrases: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> Query:
        text = (text or "").strip()[:1000]
        phrases = [p.strip() for p in _PHRASE.findall(text) if p.strip()]
        words: list[str] = []
        for w in _WORD.findall(text):
            lw = w.lower()
            if lw in STOPWORDS or (len(lw) < 2) or lw in words:
                continue
            words.append(lw)
        return cls(text=text, words=words, phrases=phrases)

    @property
    def empty(self) -> bool:
        return not self.words and not self.phrases


_TERM = re.compile(r"[^\W_]+")  # a term of the index's unicode61 tokenizer


def fts_expression(words: list[str], forms: dict[str, dict[str, int]] | None = None) -> str:
    """An FTS5 content expression: each word as any of its ``forms`` (the index's
    terms sharing its stem, :meth:`~hermes_session_guard.store.GuardStore.word_forms`;
    the word itself without them), OR-ed. Only quoted letters and digits ever reach it,
    so nothing the model writes can change its shape."""
    return " OR ".join(word_match(w, forms) for w in words if _WORD.fullmatch(w))


def word_match(word: str, forms: dict[str, dict[str, int]] | None = None) -> str:
    """One word as an FTS5 expression: its forms, quoted, OR-ed."""
    terms = sorted(t for t in ((forms or {}).get(word) or {word: 0}) if _TERM.fullmatch(t)) or [word]
    return f'"{terms[0]}"' if len(terms) == 1 else "(" + " OR ".join(f'"{t}"' for t in terms) + ")"


# -- excerpts ---------------------------------------------------------------------------


def _line_score(line: str, keys: list[str], weights: dict[str, float], phrases: list[str]) -> float:
    low = line.lower()
    score = sum(weights.get(k, 1.0) for k in keys if k in low)
    score += sum(3.0 for p in phrases if p.lower() in low)
    return score


# Something a summary tends to lose: numbers, paths, identifiers, flags, quoted code.
_SPECIFIC = re.compile(r"\d|[/_=`\\]|--|\w\.\w|[A-Z]{2,}\w*[:(]")


def passage_score(text: str, keys: list[str], weights: dict[str, float], phrases: list[str]) -> float:
    """How well a passage answers a request for a specific detail: its best line (and
    whether that line carries a specific value), plus how many query words it covers."""
    best, best_line = 0.0, ""
    for line in text.splitlines() or [text]:
        score = _line_score(line, keys, weights, phrases)
        if score > best:
            best, best_line = score, line
    if best <= 0:
        return 0.0
    low = text.lower()
    coverage = sum(1 for k in set(keys) if k in low)
    specific = 0.6 if _SPECIFIC.search(best_line) else 0.0
    return best + 0.25 * coverage + specific


def excerpt(text: str, query: Query, budget: int) -> str:
    """Verbatim lines of ``text`` that best match ``query`` (with a neighbour each
    side), in document order, within ``budget`` characters."""
    if budget <= 0:
        return ""
    if len(text) <= budget:
        return text
    keys = [_key(w) for w in query.words]
    lines = text.splitlines() or [text]
    scored = [(_line_score(line, keys, {}, query.phrases), i) for i, line in enumerate(lines)]  # each word weighs 1
    if max((s for s, _ in scored), default=0.0) <= 0:
        return text[:budget]
    chosen: list[int] = []
    used = 0
    for score, i in sorted(scored, key=lambda x: (-x[0], x[1])):
        if score <= 0:
            break
        for j in (i, i - 1, i + 1):
            if 0 <= j < len(lines) and j not in chosen:
                cost = len(lines[j]) + 1
                if j != i and used + cost > budget:
                    continue
                if j == i and used + cost > budget:
                    if not chosen:  # one very long line: a window around its best match
                        return _window_around(lines[i], keys, query.phrases, budget)
                    continue
                chosen.append(j)
                used += cost
        if used >= budget:
            break
    chosen.sort()
    out: list[str] = []
    for n, j in enumerate(chosen):
        if n and j != chosen[n - 1] + 1:
            out.append("…")
        out.append(lines[j])
    return "\n".join(out)[:budget]


def _window_around(line: str, keys: list[str], phrases: list[str], budget: int) -> str:
    low = line.lower()
    hits = [low.find(p.lower()) for p in phrases] + [low.find(k) for k in keys]
    hits = [h for h in hits if h >= 0]
    centre = min(hits) if hits else 0
    start = max(0, min(centre - budget // 3, len(line) - budget))
    piece = line[start: start + budget]
    return ("…" if start else "") + piece[: budget - (1 if start else 0)]


# -- the recall ---------------------------------------------------------------------------


@dataclass
class Passage:
    label: str
    turn: int
    role: str
    text: str
    score: float = 0.0


@dataclass
class Recall:
    """One recall for the session ``session_id`` (the host says who is calling)."""

    store: GuardStore
    session_id: str
    lineage: list[str]
    max_chars: int
    stored_text: Callable[[int], str | None] | None = None

    def run(self, args: dict[str, Any]) -> str:
        notes: list[str] = []
        args = args if isinstance(args, dict) else {}
        ignored = sorted(k for k in args if k not in ("query", "turn_start", "turn_end", "snapshot_id"))
        if ignored:
            notes.append(
                f"ignored argument(s) {', '.join(ignored)}: recall only reads this conversation"
                f" (session {self.session_id})."
            )
        query = Query.parse(str(args.get("query") or ""))
        first, last = _int(args.get("turn_start")), _int(args.get("turn_end"))
        snapshot_id = str(args.get("snapshot_id") or "").strip() or None
        snapshots = [s for sid in self.lineage for s in self.store.list_snapshots(sid)]
        known = {s.snapshot_id: s for s in snapshots}
        if snapshot_id is not None and snapshot_id not in known:
            return self._finish(
                [], notes + [f"snapshot {snapshot_id!r} is not part of this conversation; nothing was read from it."],
                query,
            )
        if first is None and last is None and query.empty:
            return self._finish([], notes + [
                "give a query (words, an error code, a file name, a command) and/or turn_start/turn_end "
                "from the summary's [Original context: ...] line."], query)

        passages: list[Passage]
        if first is not None or last is not None:
            if not snapshots:
                return self._finish([], notes + ["this conversation has no compacted turns yet."], query)
            snap = known[snapshot_id] if snapshot_id else max(snapshots, key=lambda s: (s.created_at, s.snapshot_id))
            lo = first if first is not None else (last or 1)
            hi = last if last is not None else lo
            lo, hi = max(lo, snap.first_turn or 1), min(hi, snap.last_turn or hi)
            if lo > hi:
                return self._finish([], notes + [
                    f"snapshot {snap.snapshot_id} holds turns {snap.first_turn}–{snap.last_turn}."], query)
            passages = self._range(snap.snapshot_id, lo, hi, query)
        else:
            passages = self._search(query, snapshot_id)
        return self._finish(passages, notes, query)

    # -- the two ways in ------------------------------------------------------------
    def _range(self, snapshot_id: str, first: int, last: int, query: Query) -> list[Passage]:
        out = []
        weights = {_key(w): 1.0 for w in query.words}
        for turn, message in self.store.snapshot_turns(snapshot_id, first, last):
            text = recall_text(message)
            if not text:
                continue
            score = max((_line_score(line, list(weights), weights, query.phrases) for line in text.splitlines()),
                        default=0.0)
            if not query.empty and score <= 0:
                continue
            out.append(Passage(f"snapshot {snapshot_id}", turn, str(message.get("role") or ""), text, score))
        return out

    def _search(self, query: Query, snapshot_id: str | None) -> list[Passage]:
        words = list(query.words)
        for phrase in query.phrases:
            words += [w.lower() for w in _WORD.findall(phrase) if w.lower() not in words]
        forms = {w: self.store.word_forms(w) for w in words} if self.store.fts else {}
        # how many documents hold one of a word's forms (one holding two counts twice: an
        # estimate, for weighting)
        counts = {w: sum(f.values()) for w, f in forms.items()}
        words = self._informative(words, counts)
        if not words:
            return []
        if self.store.fts:
            docs = self._candidates(words, counts, forms)
        else:
            docs = self.store.scan_docs(self.lineage, words, MAX_CANDIDATES)
        allowed = set(self.lineage)
        docs = [d for d in docs if d.session_id in allowed and (snapshot_id is None or d.ref == snapshot_id)]
        weights = self._weights(words, counts)
        keys = [_key(w) for w in words]
        compacted = self.store.compacted_ranges(self.lineage)
        out: list[Passage] = []
        for doc in docs:
            text = self._doc_text(doc)
            if not text:
                continue
            score = passage_score(text, keys, weights, query.phrases)
            span = compacted.get(doc.ref)
            if doc.source == "archived" or (span and span[0] <= doc.position <= span[1]):
                score += 0.5  # the model no longer has this turn in its context
            label = f"snapshot {doc.ref}" if doc.source == "snapshot" else f"archived, session {doc.ref}"
            out.append(Passage(label, doc.position, doc.role or "", text, score))
        out.sort(key=lambda p: -p.score)  # stable: equal scores keep the candidates' rank order
        return out

    def _candidates(self, words: list[str], counts: dict[str, int],
                    forms: dict[str, dict[str, int]]) -> list[RecallDoc]:
        """Documents holding all the words first, then two of them, then any rare one. A
        pair of common words or a common word alone matches much of a long history, costs
        a scan of its postings to rank and says little, so those combinations are skipped."""
        rare_cap = max(RARE_MIN_DOCS, int(RARE_SHARE * max(1, self.store.doc_count())))
        rare = [w for w in words if counts.get(w, 0) <= rare_cap]
        stages = [" AND ".join(word_match(w, forms) for w in words)] if len(words) > 1 else []
        if len(words) > 2:
            pairs = [f"({word_match(a, forms)} AND {word_match(b, forms)})"
                     for i, a in enumerate(words) for b in words[i + 1:]
                     if a in rare or b in rare]
            if pairs:
                stages.append(" OR ".join(pairs))
        wide = rare or sorted(words, key=lambda w: counts.get(w, 0))[:1]
        stages.append(fts_expression(wide, forms))
        docs: list[RecallDoc] = []
        have: set[int] = set()
        for expr in stages:
            if len(docs) >= MIN_CANDIDATES:
                break
            found = self.store.search_docs(self.lineage, expr, MAX_CANDIDATES - len(docs), exclude=have)
            docs += found
            have |= {d.doc_id for d in found}
        return docs

    def _informative(self, words: list[str], counts: dict[str, int]) -> list[str]:
        """Drop words found in most indexed documents (they rank nothing and are the
        expensive part of a full-text query); keep the rarest few."""
        if len(words) <= 1 or not self.store.fts:
            return words[:MAX_QUERY_TERMS]
        total = max(counts.values(), default=0)
        n_docs = self.store.doc_count() or 1
        kept = [w for w in words if counts.get(w, 0) <= COMMON_TERM_SHARE * n_docs]
        if not kept:
            kept = sorted(words, key=lambda w: counts.get(w, total))[:1]
        kept = [w for w in kept if counts.get(w, 1) > 0] or kept
        return sorted(kept, key=lambda w: counts.get(w, 0))[:MAX_QUERY_TERMS]

    def _weights(self, words: list[str], counts: dict[str, int]) -> dict[str, float]:
        return {_key(w): 1.0 + 1.0 / (1 + counts.get(w, 0)) ** 0.5 for w in words}

    def _doc_text(self, doc: RecallDoc) -> str | None:
        if doc.source == "snapshot" and doc.message is not None:
            return recall_text(doc.message)
        if doc.source == "snapshot":
            message = self.store.snapshot_message(doc.ref, doc.position)
            return recall_text(message) if message else None
        if doc.host_row_id is not None and self.stored_text is not None:
            return recall_content(self.stored_text(doc.host_row_id))
        return None

    # -- the answer ---------------------------------------------------------------------
    def _finish(self, passages: list[Passage], notes: list[str], query: Query) -> str:
        seen: set[str] = set()
        unique = []
        for p in passages:
            h = text_hash(p.text)
            if h not in seen:
                seen.add(h)
                unique.append(p)
        shown = unique[:MAX_PASSAGES]
        about = f' for "{query.text}"' if query.text else ""
        if not shown:
            head = f"{OUTPUT_MARKER} nothing in this conversation's stored turns{about}."
            tips = "Try other words (an error code, a file name, a setting, a command) or a turn range."
            return _bounded("\n".join([head, *notes, tips]), self.max_chars)
        head = f"{OUTPUT_MARKER} {len(shown)} verbatim passage(s) from this conversation's stored turns{about}:"
        lines = [head, *notes]
        used = sum(len(x) + 1 for x in lines)
        tail = "(more passages exist: narrow the query or the turn range)" if len(unique) > len(shown) else ""
        reserve = len(tail) + 1 + 120
        for n, p in enumerate(shown):
            left = self.max_chars - used - reserve
            per = max(200, left // max(1, len(shown) - n))
            label = f"--- turn {p.turn} · {p.role} · {p.label}"
            body_budget = min(left, per) - len(label) - 2
            if body_budget < 80:
                tail = "(output limit reached: narrow the query or the turn range for the rest)"
                break
            body = excerpt(p.text, query, body_budget)
            block = f"{label}\n{body}"
            lines.append(block)
            used += len(block) + 1
        if tail:
            lines.append(tail)
        return _bounded("\n".join(lines), self.max_chars)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _bounded(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    cut = "\n(truncated at session_guard.recall.max_chars)"
    return text[: max(0, max_chars - len(cut))] + cut
