"""The shipped provider rule sets (handoff/rule_set.py) and the trigger-gated running of
the guard's own rules: what loads, what is left out, windows that do not cut a secret,
and gated runs that give exactly what a plain ``re.sub`` over the whole text gives."""

from __future__ import annotations

import json
import random
import re
import string
from pathlib import Path

import pytest

from hermes_session_guard.handoff import redaction, rule_set
from hermes_session_guard.handoff.redaction import MASK, redact

CORPUS = json.loads((Path(__file__).parents[1] / "fixtures" / "secrets_corpus.json").read_text(encoding="utf-8"))
TEXTS = [e["text"] for e in CORPUS["secrets"] + CORPUS["held_out"]] + CORPUS["controls"]


def test_the_rule_data_ships_with_the_package_and_every_rule_compiles() -> None:
    rules = rule_set.rule_set()
    assert rules is not None
    stats = rules.stats
    assert stats["rules"] >= 140
    assert stats["not_compiled"] == 0
    assert stats["used"] >= 140  # CredSweeper's usable rules plus detect-secrets' pattern plugins
    assert stats["left_out"] == len(rule_set.LEFT_OUT)


def test_every_left_out_rule_names_a_rule_of_the_data() -> None:
    """A renamed rule in a newer copy of the data would silently come back in."""
    names = {str(item["name"]) for item in rule_set._load_data()}
    assert rule_set.LEFT_OUT <= names
    assert set(rule_set.TRIGGER_OVERRIDES) <= names


def test_the_boundary_prefix_is_the_one_the_data_uses() -> None:
    values = [str(v) for item in rule_set._load_data() for v in item.get("values") or []]
    assert sum(v.startswith(rule_set.BOUNDARY_PREFIX) for v in values) >= 30
    rules = rule_set.rule_set()
    assert rules is not None and rules.stats["boundary_checked_in_python"] >= 30


def test_a_token_after_a_separator_or_an_escape_sequence_is_taken() -> None:
    token = "shpat_" + "0123456789abcdef" * 2
    assert MASK in rule_set.redact_with_rules(f"use {token} now", MASK)
    assert MASK in rule_set.redact_with_rules(f"key={token}", MASK)
    assert MASK in rule_set.redact_with_rules(f"\\n{token}", MASK)  # after an escape sequence


@pytest.mark.parametrize("offset", [0, 1, 1000, rule_set.WINDOW - 20, rule_set.WINDOW - rule_set.OVERLAP - 10,
                                    2 * (rule_set.WINDOW - rule_set.OVERLAP) - 7, 50_000])
def test_a_secret_at_any_offset_of_a_long_text_is_masked(offset: int) -> None:
    """Windows overlap, so a secret that straddles one window's end lies whole in the next."""
    secret = "hvs." + "AbCdEfGh12345678" * 6
    text = ("lorem ipsum " * 10_000)[:offset] + " " + secret + " " + "dolor sit amet " * 500
    out = redact(text)
    assert secret[4:20] not in out
    assert MASK in out


def _shifted(text: str) -> list[str]:
    rng = random.Random(len(text))
    filler = "".join(rng.choice(string.ascii_letters + " \n:=") for _ in range(3000))
    return [text, filler + text, text + filler, filler[:1500] + text + filler[:700] + text]


# the rules run only near their literals (a rule without any runs over the whole text)
_GATED = [i for i, (_, _, triggers) in enumerate(redaction._GUARD_RULES) if triggers]


@pytest.mark.parametrize("index", _GATED)
def test_gated_guard_rules_give_what_a_plain_sub_gives(index: int) -> None:
    """Every gated rule's literals are right: running it only near them changes nothing."""
    pattern, repl, triggers = redaction._GUARD_RULES[index]
    run = rule_set.sub_at if pattern in redaction._ANCHORED_RULES else rule_set.sub_near
    for base in TEXTS:
        for text in _shifted(redaction.normalise(base)):
            assert run(pattern, repl, text, triggers) == pattern.sub(repl, text), base[:60]


def test_anchored_pair_rules_find_what_a_window_scan_finds() -> None:
    rs = rule_set.rule_set()
    assert rs is not None
    anchored = [r for r in rs.rules if r.anchored]
    assert {r.name for r in anchored} >= {"SECRET_PAIR", "PASSWD_PAIR"}
    for text in TEXTS + ['config: {"password": "Xy7pQ2mN9vL4kR8s", token="AbC123dEf456GhI789"}']:
        found = rule_set.Occurrences(text)
        for rule in anchored:
            spans = rule_set._anchored_spans(rule, found)
            scanned = [rule_set._masked_span(m, rule.group) for p in rule.patterns for m in p.finditer(text)]
            assert set(rule_set._merge(scanned)) <= set(rule_set._merge(spans)) | {s for s in scanned
                                                                                   if s[1] - s[0] < 4}, text[:60]


def _rewritten_patterns() -> list[tuple[re.Pattern[str], re.Pattern[str]]]:
    """(as shipped, as compiled) for every shipped pattern the build rewrites for speed."""
    out = []
    for item in rule_set._load_data():
        for value in item.get("values") or []:
            faster = rule_set._with_value_guard(rule_set._lookbehind_after_first(str(value)))
            if faster != value:
                out.append((re.compile(str(value), re.MULTILINE), re.compile(faster, re.MULTILINE)))
    return out


def test_rewritten_patterns_match_exactly_what_the_shipped_ones_match() -> None:
    """The value lookaheads and the moved lookbehind change speed only: same spans on
    texts built around each rule's key words and value shapes."""
    pairs = _rewritten_patterns()
    assert len(pairs) >= 3  # the two pair rules' values, the Jira token's lookbehind
    rng = random.Random(29)
    alphabet = "aAbZ09=:_- \"'`(\n/+xyzQ#MNOgjwzcBD"
    heads = ["password=", "pwd: ", "token=", "secret = \"", "key:'", "PASSWORD=", "api_key=(", "BBDC-", "x ", ""]
    # ... and values whose first capital (or small letter) comes at every position up to
    # past the value's longest length
    edges = [head + (filler * 40)[:k] + letter + "z9Q"
             for head in ("password=", "token: '") for k in range(100)
             for filler, letter in (("ab1", "Q"), ("AB1", "q"))]
    texts = edges + [rng.choice(heads) + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 90)))
                     for _ in range(6000)]
    matched = 0
    for text in texts:
        for shipped, faster in pairs:
            for start in (0, min(len(text), 5)):
                a, b = shipped.search(text, start), faster.search(text, start)
                assert (a and (a.span(), a.groupdict())) == (b and (b.span(), b.groupdict())), text
                matched += a is not None
    assert matched > 100


def test_a_value_without_mixed_case_is_refused_without_backing_off() -> None:
    """"password=password=..." has no capital: the pair rule fails at its lookahead."""
    rs = rule_set.rule_set()
    assert rs is not None
    rule = next(r for r in rs.rules if r.name == "PASSWD_PAIR")
    assert "(?=(?-i:[a-z" in rule.patterns[0].pattern
    assert rule_set._anchored_spans(rule, rule_set.Occurrences("password=" * 50)) == []
    assert rule_set._anchored_spans(rule, rule_set.Occurrences("password=Xy7pQ2mN9vL4")) != []


def test_a_dense_trigger_falls_back_to_one_plain_pass() -> None:
    pattern = re.compile(r"a:(\d+)")
    text = "a:1 " * 5000
    assert rule_set.sub_near(pattern, "X", text, (":",)) == pattern.sub("X", text)


def test_the_quadratic_pgpass_form_is_gone() -> None:
    """The .pgpass rule's host part is bounded: a long run before a colon is not a host."""
    run = "A1b2C3d4" * 2000
    assert redaction._PGPASS.search(run + ":5432:db:user:pw") is None
    assert redaction._PGPASS.search("db.example.com:5432:app:deploy:S3cretPw") is not None
