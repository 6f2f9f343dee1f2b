"""Provider rule sets loaded from data shipped in packages, run in linear time.

Two maintained sets feed one engine:

- CredSweeper's rules (Samsung, MIT; ``rules/credsweeper.yaml``, copied unchanged from
  the ``credsweeper`` 1.19.5 wheel, licence in ``rules/LICENSE.credsweeper``): 151 rules,
  about 120 of them provider token shapes (Vault, age, Shopify, Sentry, Mailgun, Heroku, Terraform Cloud,
  New Relic, Google OAuth, Atlassian, Linear, Postman, Grafana, Databricks, Doppler,
  Supabase, Pulumi, ...) and ``name = value`` pair rules. CredSweeper itself is not a
  dependency (it pulls an ML runtime and office-file parsers); only its rule data is used,
  with Python's ``re`` (the rules are written for it).
- detect-secrets' pattern plugins (the installed ``detect-secrets``): their ``denylist``
  expressions, without the plugin machinery (which costs seconds per megabyte).

What is used, and what is not (counted in ``RuleSet.stats``):

- CredSweeper ``pattern`` and ``multi`` rules: every pattern of a rule runs on its own;
  the ``value`` group (the whole match when there is none) is masked;
- CredSweeper ``keyword`` rules (a template built in CredSweeper's code) and ``pem_key``
  are left out: the guard's own assignment and private-key rules cover them;
- :data:`LEFT_OUT`: rules that flag things that are not secrets in conversation text
  (UUIDs, host names, app ids, any 32-hex run, ...) or whose matching costs far more
  than the rest (measured: seconds on 50 KB of one repeated character).

Linear time: one ``str.count`` per required substring says whether it occurs, and one
scan finds where, when a rule needs the places (:class:`Occurrences`; capitals as
written, the rest in any case). A pair rule that starts with its key word
(:data:`ANCHORED_START`) is tried only there, its match bounded to :data:`ANCHORED_SPAN`
characters. Any other rule runs on the regions around the occurrences (:data:`BEFORE`
characters before, :data:`AFTER` after), cut into windows of at most :data:`WINDOW`
characters overlapping by :data:`OVERLAP` (a secret up to that long lies whole in some
window); a rule without required substrings runs over windows of the whole text. The
matching work of one window is bounded by its size and each rule covers the text at
most about 1.4 times, so the total grows linearly with the text. :func:`sub_near` and
:func:`sub_at` run the guard's own rules the same way.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..fail_open import failing_open

WINDOW = 2048
OVERLAP = 512
BEFORE = 64
AFTER = 512
ANCHORED_SPAN = 384  # an anchored pair rule's match: key, separator and value fit in it
RULES_RESOURCE = ("rules", "credsweeper.yaml")

# Rules that fire on ordinary conversation text, not on secrets.
LEFT_OUT = frozenset({
    "UUID",  # session and request ids
    "Firebase Domain",  # a host name
    "AWS S3 Bucket",  # a host name
    "Tencent WeChat API App ID",  # a public app id
    "AWS Client ID",  # the guard's own rule masks AWS key ids; this one also takes ids in prose
    "JSON Web Key",  # kty/alg fields of a public key
    "JWK",  # same
    "Twilio Multi",  # its second pattern is any 32-hex run (commit hashes, md5 sums); the guard has Twilio rules
    "Alibaba Multi",  # its second pattern is any 30-character mixed-case word
    "AWS Multi",  # its second pattern is any 40-44 character run (the guard's AWS rules need context)
    "IP_ID_PASSWORD_TRIPLE",  # any word after an IP address
    "ID_PAIR_PASSWD_PAIR",  # its second pattern takes "user X", "host X", "name X" in prose
    "ID_PASSWD_PAIR",  # same
    "Product Activation Key",  # any 5x5 group of capitals and digits
    "OTP / 2FA Secret",  # base32 words
    "Docker Swarm Key",  # a prefix, not a credential
    "Dropbox App secret",  # any 15-character lower-case word ("recommendations")
    "Dropbox API secret (long term)",  # 1-2 s on 1 MB of capital A's (a lookahead and three runs per position)
    "X App-Only Authentication Bearer Token",  # same
    "CURL User Password",  # a 512-character lazy scan after every "curl" (24 s on 1 MB of "curl -u "); the
    # guard's curl rule looks for the option first
    "DOC_GET",  # super-linear: up to 8,000-character groups with a lookahead at every step
    "DOC_CREDENTIALS",  # same
})
# detect-secrets plugins left out: entropy and IP plugins flag words, ids and hashes; the
# keyword plugin is not a pattern list (the guard's assignment rule does its work).
DETECT_SECRETS_LEFT_OUT = frozenset({"IPPublicDetector", "Base64HighEntropyString", "HexHighEntropyString",
                                     "KeywordDetector"})
# The literal text each detect-secrets plugin's patterns contain (capitals: as written,
# for patterns that are case-sensitive; others: any case), so they run near it only; a
# plugin not named here runs over the whole text.
DETECT_SECRETS_TRIGGERS: dict[str, tuple[str, ...]] = {
    "ArtifactoryDetector": ("AKC", "AP"),
    "AWSKeyDetector": ("a3t", "abia", "acca", "akia", "asia", "aws"),
    "AzureStorageKeyDetector": ("accountkey",),
    "BasicAuthDetector": ("://",),
    "CloudantDetector": ("cl",),
    "GitHubTokenDetector": ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    "GitLabTokenDetector": ("glpat-", "gldt-", "glft-", "glsoat-", "glrt-", "gr1348941", "glcbt-"),
    "IbmCloudIamDetector": ("ibm",),
    "IbmCosHmacDetector": ("cos",),
    "JwtTokenDetector": ("eyj",),
    "MailchimpDetector": ("-us",),
    "NpmDetector": ("_authtoken",),
    "OpenAIDetector": ("t3blbkfj",),
    "PrivateKeyDetector": ("private key", "putty", "ssh2"),
    "PypiTokenDetector": ("pypi-",),
    "SendGridDetector": ("sg.",),
    "SlackDetector": ("xox", "hooks.slack.com"),
    "SoftlayerDetector": ("softlayer", "sl"),
    "SquareOAuthDetector": ("sq0csp",),
    "StripeDetector": ("k_live_",),
    "TelegramBotTokenDetector": (":",),
    "TwilioKeyDetector": ("ac", "sk"),
    "DiscordBotTokenDetector": (".",),
}
# A part every match of a detect-secrets plugin's patterns holds, where its literal is a
# punctuation mark found everywhere: a window is searched only when it holds this.
DETECT_SECRETS_REQUIRED: dict[str, str] = {
    "TelegramBotTokenDetector": r":[0-9A-Za-z_-]{35}",  # the token's secret half
}
_UNUSED_TYPES = frozenset({"keyword", "pem_key"})
# The left boundary many CredSweeper patterns start with (start of text, a separator, or an
# escape sequence before the token). Tried at every position it costs more than the rest of
# the pattern, so it is cut off and checked in Python on each match (:func:`_left_boundary`),
# which lets ``re`` jump to the token's literal start.
BOUNDARY_PREFIX = (r"(?:^|/|[^\\0-9A-Za-z+_-]|\\[0abfnrtv]|(?:%|\\x)[0-9A-Fa-f]{2}|\\[0-7]{3}"
                   r"|\\[Uu][0-9A-Fa-f]{4}|\x1B\[[0-9;]{0,80}m)")
# Pair rules that start with their key word (after an optional quote): tried only where it occurs.
ANCHORED_START = "(?P<variable>[\\\"'`]?(?i:"
_QUOTES = frozenset("\"'`")
_ESCAPE_BEFORE = re.compile(r"(?:\\[0abfnrtv]|(?:%|\\x)[0-9A-Fa-f]{2}|\\[0-7]{3}|\\[Uu][0-9A-Fa-f]{4}"
                            r"|\x1B\[[0-9;]{0,80}m)\Z")
# CredSweeper's mixed-case value: 8..N characters of [A-Z], [a-z] and a symbol class, then
# conditionals that fail unless an upper and a lower case letter were among them. A value
# without both makes ``re`` back off N-8 times, re-testing the conditionals at each length
# (7 µs a try: "password=password=..." took 3 s per MB). :func:`_with_value_guard` puts two
# lookaheads before it that fail at once in that case. Each is a necessary condition of the
# conditionals (a capital, resp. a small letter, within the value's first N characters, all
# of the value's class): no match is lost, none is added. The possessive run is exact because
# its class and the letter after it are disjoint.
_MIXED_CASE_VALUE = re.compile(r"\(\?P<value>\(\?-i:\(\?P<a>\[A-Z\]\)\|\(\?P<b>\[a-z\]\)\|\(\?P<c>\[([^\]\\]+)\]\)\)"
                               r"\{\d+,(\d+)\}")
_WORD_CHARS = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz+_-\\")
# Required substrings given here instead of the rule's own, which are single characters
# found everywhere (the rule would run over all of every text).
TRIGGER_OVERRIDES: dict[str, tuple[str, ...]] = {
    "MailGun API Key": ("key-",),
    "Facebook App Token": ("|",),  # every match holds the "|" between the app id and its token
    # without "sword": every match starts with "pass" or "paasw" (``pa[as]sw``), so an
    # anchored try at "sword" could never match, and "password" would be tried twice
    "PASSWD_PAIR": ("p/w", "paasw", "pass", "pswd", "pw", "비밀번호", "비번", "암호", "패스워드"),
}
# A part every match of the rule contains, for rules whose required substrings are common
# words ("password", "token"): a window is searched with the rule's pattern (which starts
# with an alternation tried at every position, 130 ms per MB) only when it holds this.
REQUIRED_OVERRIDES: dict[str, str] = {
    "CMD Password": r"(?i)-[A-Za-z_-]*pass(?:in|out|word|phrase)",
    "CMD Token": r"(?i)-[A-Za-z_-]*(?:token|oauth2-bearer)",
}
# The same as words (any case), looked for with ``str.find``: a case-insensitive
# alternation of words costs ``re`` 170 ms per MB where it is absent.
REQUIRED_WORDS: dict[str, tuple[str, ...]] = {
    "SQL Password": ("alter", "create", "insert", "set", "update"),
}


@dataclass(frozen=True)
class Rule:
    name: str
    patterns: tuple[re.Pattern[str], ...]
    triggers: tuple[str, ...]  # capitals: as written; others: any case; empty: runs on every window
    group: str | int = "value"  # what is masked: this group when it matched, else the whole match
    required: re.Pattern[str] | None = None  # a window must hold a match of this for the rule to run
    required_words: tuple[str, ...] = ()  # ... and one of these (any case)
    boundary: bool = False  # the match must start after BOUNDARY_PREFIX (checked by _left_boundary)
    anchored: bool = False  # every match starts at a required substring (or a quote just before it)


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]
    triggers: tuple[str, ...]  # every rule's required substrings
    stats: dict[str, int]


_state: dict[str, RuleSet | None] = {}
_lock = threading.Lock()


def _load_data() -> list[dict[str, Any]]:
    import yaml

    ref = resources.files(__package__).joinpath(*RULES_RESOURCE)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser where PyYAML has it: ~10x faster
    data = yaml.load(ref.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 (a safe loader)
    if not isinstance(data, list):
        raise ValueError("the rule file is not a list of rules")
    return data


# A pattern that starts with a negative lookbehind of a literal and then its value's first
# character class: ``re`` skips to a start character only when the pattern begins with one,
# so the lookbehind moves after that character (5x faster; same matches).
_LEADING_LOOKBEHIND = re.compile(r"\A\(\?<!([A-Za-z0-9_-]+)\)(\(\?P<value>)(\[[A-Za-z0-9_-]+\])")


def _lookbehind_after_first(pattern: str) -> str:
    m = _LEADING_LOOKBEHIND.match(pattern)
    if m is None:
        return pattern
    literal, group, first = m.groups()
    return f"{group}{first}(?<!{literal}{first})" + pattern[m.end():]


def _with_value_guard(pattern: str) -> str:
    """``pattern`` with :data:`_MIXED_CASE_VALUE`'s lookaheads before its value (unchanged
    when it has no such value)."""
    m = _MIXED_CASE_VALUE.search(pattern)
    if m is None:
        return pattern
    symbols, most = m.group(1), int(m.group(2))
    guard = (f"(?=(?-i:[a-z{symbols}]{{0,{most - 1}}}+[A-Z]))"
             f"(?=(?-i:[A-Z{symbols}]{{0,{most - 1}}}+[a-z]))")
    return pattern[:m.start()] + guard + pattern[m.start():]


def build(data: list[dict[str, Any]]) -> RuleSet:
    """The usable rules of ``data`` (CredSweeper's rule format), compiled."""
    stats = {"rules": len(data), "used": 0, "left_out": 0, "other_type": 0, "patterns": 0, "not_compiled": 0}
    rules: list[Rule] = []
    for item in data:
        name = str(item.get("name", ""))
        if item.get("type") in _UNUSED_TYPES:
            stats["other_type"] += 1
            continue
        if name in LEFT_OUT:
            stats["left_out"] += 1
            continue
        compiled = []
        values = [str(v) for v in item.get("values") or []]
        boundary = bool(values) and all(v.startswith(BOUNDARY_PREFIX) for v in values)
        for value in values:
            try:
                source = value[len(BOUNDARY_PREFIX):] if boundary else value
                compiled.append(re.compile(_with_value_guard(_lookbehind_after_first(source)), re.MULTILINE))
            except (re.error, OverflowError, RecursionError):
                stats["not_compiled"] += 1
        if not compiled:
            continue
        stats["boundary_checked_in_python"] = stats.get("boundary_checked_in_python", 0) + boundary
        # a substring written in capitals is looked for as written, the others in any case
        triggers = tuple(sorted(
            {str(s) if str(s).isupper() else str(s).lower() for s in item.get("required_substrings") or [] if s}))
        if any(len(t) < 2 and t.isascii() for t in triggers):
            triggers = ()  # a one-character substring is everywhere: the rule runs on the whole text
        triggers = TRIGGER_OVERRIDES.get(name, triggers)
        required = None
        if item.get("required_regex") or name in REQUIRED_OVERRIDES:
            try:
                required = re.compile(REQUIRED_OVERRIDES.get(name) or str(item["required_regex"]))
            except re.error:
                stats["not_compiled"] += 1
        anchored = bool(triggers) and all(v.startswith(ANCHORED_START) for v in values)
        rules.append(Rule(name, tuple(compiled), triggers, "value", required, REQUIRED_WORDS.get(name, ()), boundary,
                          anchored))
        stats["patterns"] += len(compiled)
    rules += _detect_secrets_rules(stats)
    stats["used"] = len(rules)
    return RuleSet(tuple(rules), tuple(sorted({t for r in rules for t in r.triggers})), stats)


def _detect_secrets_rules(stats: dict[str, int]) -> list[Rule]:
    """detect-secrets' pattern plugins as rules (none when it is not installed)."""
    stats.setdefault("detect_secrets_plugins", 0)
    with failing_open("importing detect-secrets", "detect-secrets is unavailable and its patterns are not used "
                      "(`pip install detect-secrets`)", advice=None, level=logging.WARNING) as failed:
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
        from detect_secrets.plugins.base import RegexBasedDetector
    if failed:
        return []
    out = []
    classes: list[type] = sorted(get_mapping_from_secret_type_to_class().values(), key=lambda c: c.__name__)
    for cls in classes:
        if cls.__name__ in DETECT_SECRETS_LEFT_OUT or not issubclass(cls, RegexBasedDetector):
            continue
        with failing_open(f"detect-secrets' {cls.__name__} patterns", "the plugin is left out", advice=None,
                          level=logging.DEBUG) as failed:
            patterns = tuple(p if isinstance(p, re.Pattern) else re.compile(p) for p in cls().denylist)
        if failed:
            stats["not_compiled"] += 1
            continue
        for pattern in patterns:
            # detect-secrets reports group 1 when a pattern has groups (``findall``)
            triggers = DETECT_SECRETS_TRIGGERS.get(cls.__name__, ())
            required = DETECT_SECRETS_REQUIRED.get(cls.__name__)
            out.append(Rule(f"detect-secrets {cls.__name__}", (pattern,), triggers, 1 if pattern.groups else 0,
                            re.compile(required) if required else None))
        stats["detect_secrets_plugins"] += 1
        stats["patterns"] += len(patterns)
    return out


def rule_set() -> RuleSet | None:
    """The shipped rule set, loaded once; ``None`` (said once) when it cannot be read."""
    with _lock:
        if "rules" not in _state:
            with failing_open("loading the provider rule set", "the provider rule set could not be loaded and "
                              "hand-off packets are redacted by the other passes only", advice=None,
                              level=logging.WARNING) as failed:
                _state["rules"] = build(_load_data())
            if failed:
                _state["rules"] = None
        return _state["rules"]


def _windows(start: int, end: int) -> list[tuple[int, int]]:
    """``[start, end)`` as windows of at most WINDOW characters overlapping by OVERLAP."""
    if end - start <= WINDOW:
        return [(start, end)]
    out = []
    while True:
        stop = min(start + WINDOW, end)
        out.append((start, stop))
        if stop == end:
            return out
        start += WINDOW - OVERLAP


def _lower(text: str) -> str:
    """``text`` in lower case, same length (a character whose lower case is longer is kept)."""
    low = text.lower()
    if len(low) == len(text):
        return low
    return "".join(ch.lower() if len(ch.lower()) == 1 else ch for ch in text)


_LITERALS: dict[str, re.Pattern[str]] = {}


def _overlaps_itself(trigger: str) -> bool:
    """Whether two occurrences of ``trigger`` can overlap ("aa" in "aaa")."""
    return any(trigger[:k] == trigger[-k:] for k in range(1, len(trigger)))


class Occurrences:
    """Where substrings occur in one text (capitals: as written; others: any case),
    found once each and kept: a count is one ``str.count``, positions one scan."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.low = _lower(text)
        self._counts: dict[str, int] = {}
        self._positions: dict[str, list[int]] = {}
        self._hits: dict[int, frozenset[str]] = {}

    def _where(self, trigger: str) -> str:
        return self.text if trigger.isupper() else self.low

    def occurring(self, rs: RuleSet) -> frozenset[str]:
        """Which of ``rs``'s required substrings occur: counted in one pass over the list
        (kept for :meth:`count`), so a rule none of whose substrings occur costs one set test."""
        hits = self._hits.get(id(rs))
        if hits is None:
            hits = self._hits[id(rs)] = frozenset(t for t in rs.triggers if self.count((t,)))
        return hits

    def count(self, triggers: tuple[str, ...]) -> int:
        """How many times ``triggers`` occur in all (an upper bound when they overlap)."""
        total = 0
        for t in triggers:
            n = self._counts.get(t)
            if n is None:
                n = self._counts[t] = self._where(t).count(t)
            total += n
        return total

    def of(self, trigger: str) -> list[int]:
        """Where ``trigger`` occurs (asked by :meth:`sorted_of` only for a trigger that does)."""
        found = self._positions.get(trigger)
        if found is None:
            where = self._where(trigger)
            if _overlaps_itself(trigger):
                found = []
                i = where.find(trigger)
                while i >= 0:
                    found.append(i)
                    i = where.find(trigger, i + 1)
            else:
                literal = _LITERALS.get(trigger)
                if literal is None:
                    literal = _LITERALS[trigger] = re.compile(re.escape(trigger))
                found = [m.start() for m in literal.finditer(where)]
            self._positions[trigger] = found
        return found

    def sorted_of(self, triggers: tuple[str, ...]) -> list[int]:
        """Every position of ``triggers``, sorted, each once."""
        self.count(triggers)
        counts = self._counts
        lists = [self.of(t) for t in triggers if counts[t]]
        if len(lists) == 1:
            return lists[0]  # sorted, each once
        return sorted({p for found in lists for p in found})


def _covers(occurrences: int, length: int, before: int, after: int) -> bool:
    """Whether regions from ``before`` each of ``occurrences`` to ``after`` it would cover
    a text of ``length``: then one plain pass over it costs no more."""
    return occurrences > 2 * length // (before + after) + 1


def _regions(rule: Rule, found: Occurrences) -> list[tuple[int, int]]:
    length = len(found.text)
    if not rule.triggers:
        return [(0, length)]
    # find_spans asks only for a rule one of whose required substrings occurs
    if _covers(found.count(rule.triggers), length, BEFORE, AFTER):
        return [(0, length)]
    return _around(found.sorted_of(rule.triggers), length, BEFORE, AFTER)


def _around(starts: list[int], length: int, before: int, after: int) -> list[tuple[int, int]]:
    """The regions from ``before`` characters before each of ``starts`` to ``after`` after it, merged."""
    return _merge([(max(0, p - before), min(length, p + after)) for p in starts])


def _left_boundary(text: str, i: int) -> bool:
    """Whether a token starting at ``text[i]`` has BOUNDARY_PREFIX before it."""
    if i == 0 or text[i - 1] not in _WORD_CHARS or text[i - 1] == "/":
        return True
    return _ESCAPE_BEFORE.search(text, max(0, i - 90), i) is not None


def _masked_span(m: re.Match[str], group: str | int) -> tuple[int, int]:
    if group:
        try:
            s, e = m.span(group)
        except IndexError:
            s = -1
        if s >= 0:
            return s, e
    return m.span()


def _anchored_spans(rule: Rule, found: Occurrences) -> list[tuple[int, int]]:
    """An anchored rule's matches, tried at each occurrence of its required substrings
    (and at a quote just before one) that lies after the previous match, as ``finditer``
    would; a match is bounded to ANCHORED_SPAN characters."""
    text = found.text
    length = len(text)
    patterns = rule.patterns
    out = []
    last = 0
    for p in found.sorted_of(rule.triggers):
        if p < last:
            continue
        m = None
        for start in ((p - 1, p) if p and text[p - 1] in _QUOTES else (p,)):
            end = start + ANCHORED_SPAN
            for pattern in patterns:
                m = pattern.match(text, start, end if end < length else length)
                if m:
                    break
            if m:
                break
        if m:
            s, e = _masked_span(m, rule.group)
            if _takes(text, m.start(), s, e):
                out.append((s, e))
            last = max(last, m.end())
    return out


# A value that stands for a secret instead of being one: a word for it
# ("password", "secret"), a template (``<password>``, ``${DB_PASSWORD}``, ``{{ token }}``,
# ``%PASSWORD%``, ``$TOKEN``) or a run of x's, stars or dots.
_PLACEHOLDER = re.compile(r"(?i)[\"'`]?(?:pass(?:word|wd)?|pwd|secret|token|api[_-]?key|your[_-]?[a-z_-]{1,32}"
                          r"|<[^<>\s]{1,64}>|\$\{[^{}\s]{1,64}\}|\{\{[^{}]{1,64}\}\}|%[A-Za-z_]{1,64}%"
                          r"|\$[A-Za-z_][A-Za-z0-9_]{0,63}|x{3,}|\*{3,}|\.{3,}|…)[\"'`]?")


def is_placeholder(value: str) -> bool:
    """Whether ``value`` stands for a secret rather than being one (see ``_PLACEHOLDER``)."""
    return _PLACEHOLDER.fullmatch(value) is not None


def _takes(text: str, match_start: int, s: int, e: int) -> bool:
    """Whether a rule's match masks ``text[s:e]``: at least 4 characters, not a placeholder,
    and not on a later line than where the match starts (a key at a line's end never
    takes the next line for its value)."""
    return e - s >= 4 and "\n" not in text[match_start:s] and not is_placeholder(text[s:e])


def find_spans(text: str, rs: RuleSet, found: Occurrences | None = None) -> list[tuple[int, int]]:
    """The ``(start, end)`` spans of ``text`` the rules take for secrets, merged.
    ``found``: ``text``'s occurrences when known."""
    if found is None or found.text is not text:
        found = Occurrences(text)
    spans: list[tuple[int, int]] = []
    required_found: dict[tuple[str, int, int], bool] = {}  # (required pattern, window) -> found
    hits = found.occurring(rs)
    for rule in rs.rules:
        if rule.triggers and hits.isdisjoint(rule.triggers):
            continue
        if rule.anchored:
            spans += _anchored_spans(rule, found)
            continue
        for region in _regions(rule, found):
            for start, end in _windows(*region):
                window = text[start:end]
                if rule.required_words and not any(found.low.find(w, start, end) >= 0 for w in rule.required_words):
                    continue
                if rule.required is not None:
                    key = (rule.required.pattern, start, end)
                    if key not in required_found:
                        required_found[key] = rule.required.search(window) is not None
                    if not required_found[key]:
                        continue
                for pattern in rule.patterns:
                    for m in pattern.finditer(window):
                        if rule.boundary and not _left_boundary(text, start + m.start()):
                            continue
                        s, e = _masked_span(m, rule.group)
                        if _takes(text, start + m.start(), start + s, start + e):
                            spans.append((start + s, start + e))
    return _merge(spans)


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _spliced(text: str, pieces: Iterable[tuple[int, int, str]]) -> str:
    """``text`` with each ``(start, end, replacement)`` of ``pieces`` (in order, not
    overlapping) put in place of ``text[start:end]``; ``text`` itself when there are none."""
    out: list[str] = []
    last = 0
    for s, e, replacement in pieces:
        out.append(text[last:s])
        out.append(replacement)
        last = e
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


def _replacement(repl: str | Callable[[re.Match[str]], str], m: re.Match[str]) -> tuple[int, int, str]:
    return m.start(), m.end(), repl(m) if callable(repl) else repl


def redact_with_rules(text: str, mask: str, found: Occurrences | None = None) -> str:
    """Every span the shipped rules find, replaced by ``mask`` (text unchanged when
    the rule set is unavailable). ``found``: ``text``'s occurrences when known."""
    rs = rule_set()
    if rs is None or not text:
        return text
    return _spliced(text, ((s, e, mask) for s, e in find_spans(text, rs, found)))


def sub_near(pattern: re.Pattern[str], repl: str | Callable[[re.Match[str]], str], text: str,
             triggers: tuple[str, ...] | re.Pattern[str], before: int = 512, after: int = 1024,
             found: Occurrences | None = None) -> str:
    """``pattern.sub(repl, text)`` where a match can only lie near one of ``triggers``
    (capitals: as written; others: any case; or the matches of a pattern with a literal
    start, which ``re`` finds as fast): the pattern runs on the regions from ``before``
    characters before each occurrence to ``after`` after it, and nowhere else, so a text
    without them costs one ``str.count`` per trigger. ``found``: ``text``'s occurrences
    when known."""
    if not text:
        return text
    if isinstance(triggers, re.Pattern):
        starts = [m.start() for m in triggers.finditer(text)]
        dense = _covers(len(starts), len(text), before, after)
    else:
        if found is None or found.text is not text:
            found = Occurrences(text)
        if not found.count(triggers):
            return text
        dense = _covers(found.count(triggers), len(text), before, after)
        starts = [] if dense else found.sorted_of(triggers)
    if dense:  # so many occurrences that the regions would cover the text
        return pattern.sub(repl, text)
    if not starts:
        return text

    def pieces() -> Iterator[tuple[int, int, str]]:
        last = 0
        for s, e in _around(starts, len(text), before, after):
            for m in pattern.finditer(text, max(s, last), e):
                yield _replacement(repl, m)
                last = m.end()

    return _spliced(text, pieces())


def sub_at(pattern: re.Pattern[str], repl: str | Callable[[re.Match[str]], str], text: str,
           triggers: tuple[str, ...], found: Occurrences | None = None) -> str:
    """``pattern.sub(repl, text)`` for a pattern whose matches start with one of
    ``triggers``: ``pattern.match`` is tried only where a trigger occurs, so a text costs
    one match attempt per occurrence. ``found``: ``text``'s occurrences when known."""
    if not text:
        return text
    if found is None or found.text is not text:
        found = Occurrences(text)
    starts = found.sorted_of(triggers)

    def pieces() -> Iterator[tuple[int, int, str]]:
        last = 0
        match = pattern.match
        for p in starts:
            if p < last:
                continue
            m = match(text, p)
            if m is None or m.end() == p:
                continue
            yield _replacement(repl, m)
            last = m.end()

    return _spliced(text, pieces())
