"""Whether a bare token looks generated (a key, a password, a token) rather than written
(an identifier, a word, a version, a hash, an id): decided by the token's shape only,
for forms no rule names (ADR 0031, docs/redaction.md).

A token is cut into parts at ``/ . _ -``. It looks generated when a part does, or when
there are 2 to :data:`MAX_JOINED_PARTS` parts, each with at least two character classes,
none holding a word of 4+ letters, and the parts joined look generated. A part (judged
by its first :data:`MAX_JUDGED` characters) looks generated when:

- it mixes capitals, small letters and digits and holds at least
  :data:`MIN_THREE_CLASS` of them, or mixes two of the three and holds at least
  :data:`MIN_TWO_CLASS` (symbols such as ``!@#$*`` join a password's pieces but are
  not counted);
- it is not hex (with or without ``0x``: git and image digests, ids, checksums, UUIDs
  cut at their dashes) and has at least 4 letters;
- its runs (a capitalised or small-letter word, a run of capitals, a run of digits) are
  short: at least one run per :data:`MAX_CHARS_PER_RUN` characters (three classes), one
  per 1/0.35 (two), where ``RootManageSharedAccessKey`` or ``Qwen2.5-Coder-32B`` has
  long ones;
- word-like runs (3+ letters, one of a, e, i, o, u, no 5 consonants in a row) cover less
  than half of it (three classes) or a third (two).

Measured on 66,596 distinct tokens of 12+ characters with a digit or both cases from an
installed Python environment's sources and docs (code, prose, URLs, paths): 0.4 % are
taken, nearly all base64 data (fonts, images), generated ids and example keys; random
tokens over letters and digits are taken 86 % of the time at 12-16 characters, 94 % at
16-24, 99 % at 24-48; over small letters and digits only 0 %, 25 %, 50 % (those need a
name beside them: :func:`value_looks_secret`).
"""

from __future__ import annotations

import re

MIN_THREE_CLASS = 12
MIN_TWO_CLASS = 20
MAX_CHARS_PER_RUN = 1 / 0.3
_VOWELS = frozenset("aeiou")
_RUN = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
_LETTER_RUN = re.compile(r"[A-Z]?[a-z]{2,}")
_FIVE_CONSONANTS = re.compile(r"[^aeiou]{5}")
_HEX = re.compile(r"(?:0[xX])?(?:[0-9a-f]+|[0-9A-F]+)")
_SEPARATORS = re.compile(r"[/._\-]")
_EDGES = "._-~$/+=*!#"


def _word_like(run: str) -> bool:
    low = run.lower()
    return len(run) >= 3 and not run.isdigit() and any(c in _VOWELS for c in low) and not _FIVE_CONSONANTS.search(low)


# Each ASCII letter or digit to its class (U, L, D); anything else (a password's symbols too:
# they join a token's pieces, but ``%Y%m%d``, ``#FFD700`` or ``user@host`` are not passwords) dropped
_CLASS_OF = str.maketrans({**{chr(c): "U" for c in range(65, 91)}, **{chr(c): "L" for c in range(97, 123)},
                           **{chr(c): "D" for c in range(48, 58)}})
_NOT_CLASSED = re.compile(r"[^UDL]+")
# A part is judged by its first characters (a secret is shorter; a longer run is a blob, judged
# by its start), so a megabyte-long token costs no more than this
MAX_JUDGED = 512
# The parts of a token joined are judged only when there are this few (a secret split by a dot
# or two, ``HAC66klP.uvBt5wOaS``, not a dotted path)
MAX_JOINED_PARTS = 4


def _classes(part: str) -> tuple[int, int]:
    """(how many of capitals, small letters, digits ``part`` has; how many of them in all)."""
    classes = _NOT_CLASSED.sub("", part.translate(_CLASS_OF))
    return ("U" in classes) + ("L" in classes) + ("D" in classes), len(classes)


def part_looks_generated(part: str, min_three: int = MIN_THREE_CLASS, min_two: int = MIN_TWO_CLASS) -> bool:
    """Whether one part (no separators) looks generated: see the module's description."""
    if len(part) < min_three:
        return False
    part = part[:MAX_JUDGED]
    kinds = _NOT_CLASSED.sub("", part.translate(_CLASS_OF))
    size = len(kinds)
    classes = ("U" in kinds) + ("L" in kinds) + ("D" in kinds)
    if classes < 2 or size < min_three or (classes == 2 and size < min_two):
        return False
    if kinds.count("U") + kinds.count("L") < 4 or _HEX.fullmatch(part):
        return False
    runs = len(_RUN.findall(part))
    if runs / size < (1 / MAX_CHARS_PER_RUN if classes == 3 else 0.35):
        return False  # long runs: words, acronyms, numbers
    # word-like runs: 3+ letters ending in a small letter (a run of capitals is no word)
    words = sum(len(w) for w in _LETTER_RUN.findall(part) if len(w) >= 3 and _word_like(w))
    return words * (2 if classes == 3 else 3) < size


def looks_generated(token: str, min_three: int = MIN_THREE_CLASS, min_two: int = MIN_TWO_CLASS) -> bool:
    """Whether ``token`` (a run without spaces) looks generated: see the module's description."""
    core = token.strip(_EDGES)
    if _SEPARATORS.search(core) is None:
        return part_looks_generated(core, min_three, min_two)
    parts = [p for p in _SEPARATORS.split(core) if p]
    if any(part_looks_generated(p, min_three, min_two) for p in parts):
        return True
    return (1 < len(parts) <= MAX_JOINED_PARTS and all(_classes(p)[0] >= 2 for p in parts)
            and not any(len(r) >= 4 and _word_like(r) for p in parts for r in _RUN.findall(p))
            and part_looks_generated("".join(parts), min_three, min_two))


# The value beside a name that says it is a credential: shorter forms count
CONTEXT_MIN_THREE_CLASS = 8
CONTEXT_MIN_TWO_CLASS = 12
_LONG_HEX = re.compile(r"(?=[0-9a-fA-F]{0,255}[a-fA-F])[0-9a-f]{16,256}|(?=[0-9A-F]{0,255}[A-F])[0-9A-F]{16,256}")


def value_looks_secret(value: str) -> bool:
    """Whether a value given beside a secret-ish name (``Subscription-Key: …``, ``api key -> …``,
    ``--token …``) looks like a credential: 16+ hex digits with a letter among them,
    generated-looking at :data:`CONTEXT_MIN_THREE_CLASS` / :data:`CONTEXT_MIN_TWO_CLASS`
    characters, or letters and digits interleaved (:func:`_interleaved`). A word, a path,
    a number or a version is not."""
    if value.startswith(("/", "~/", "./")) or "://" in value:
        return False
    return (_LONG_HEX.fullmatch(value) is not None
            or looks_generated(value, CONTEXT_MIN_THREE_CLASS, CONTEXT_MIN_TWO_CLASS)
            or any(_interleaved(p) for p in _SEPARATORS.split(value)))


_DIGIT_RUN = re.compile(r"[0-9]+")


def _interleaved(part: str) -> bool:
    """12+ letters and digits with digits in 3+ places among 4+ letters (``2jywq5dr9p15ng``):
    generated, where words with a number (``created_at_2024``, ``user2admin``) have one or two."""
    classes, size = _classes(part[:MAX_JUDGED])
    return (size >= CONTEXT_MIN_TWO_CLASS and classes >= 2 and len(_DIGIT_RUN.findall(part[:MAX_JUDGED])) >= 3
            and size - sum(c.isdigit() for c in part[:MAX_JUDGED]) >= 4)
