#!/usr/bin/env python3
"""Redaction time against input size: the guard's full local chain (provider rule sets
and the guard's rules, :func:`hermes_session_guard.handoff.redaction.redact`), then the
same with Hermes's own pass (``redact_sensitive_text`` where the installed Hermes has it,
bounded as the packet bounds it), on texts of 256 KB, 512 KB and 1 MB of several kinds,
ordinary and hostile; then long single tokens (120 KB, 240 KB, 1 MB of letters and
digits) through the guard's chain, the chain with Hermes's pass, and a whole hand-off
packet whose note is the token. ``--unbounded-host`` also times Hermes's pass on the
whole unclipped token, as the packet ran it before it was bounded (18 s for 120 KB).

    python scripts/bench_redaction.py              # every kind, 3 sizes, best of 3
    python scripts/bench_redaction.py --kinds prose base64 --repeat 1
    python scripts/bench_redaction.py --kinds --unbounded-host --repeat 1   # the tokens only, with "before"

Prints seconds per size and the 1 MB / 256 KB ratio (about 4 for linear time; the
quadratic ``.pgpass`` rule this replaced took 12 s on a 60 KB base64 run). The target is
1 MB under 1 s; a figure over it is marked, never asserted (timings depend on the
machine and its load: see docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import random
import string
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hermes_session_guard import host  # noqa: E402
from hermes_session_guard.handoff import rule_set  # noqa: E402
from hermes_session_guard.handoff.packet import PacketInputs, render_packet  # noqa: E402
from hermes_session_guard.handoff.redaction import redact  # noqa: E402

SIZES = (256 * 1024, 512 * 1024, 1024 * 1024)
TOKEN_SIZES = (120 * 1024, 240 * 1024, 1024 * 1024)
TARGET_SECONDS = 1.0
B64 = string.ascii_letters + string.digits + "+/"
WORDS = ("the session was compressed and the summary kept the last request about the deploy key rotation "
         "please run the tests again token budget password policy we need to check the config file and "
         "restart the gateway after that").split()


def _rng() -> random.Random:
    return random.Random(27)


def prose(n: int) -> str:
    rng = _rng()
    lines = []
    size = 0
    while size < n:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 18))).capitalize() + "."
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:n]


def conversation_with_secrets(n: int) -> str:
    """Prose with a planted credential every few lines (the masking work itself)."""
    rng = _rng()
    secrets = ["export OPENAI_API_KEY=sk-proj-" + "".join(rng.choice(B64[:62]) for _ in range(40)),
               "token hvs." + "".join(rng.choice(B64[:62]) for _ in range(90)),
               "password: " + "".join(rng.choice(B64[:62]) for _ in range(16)),
               "https://bob:" + "".join(rng.choice(B64[:62]) for _ in range(12)) + "@db.example.com/app",
               "shpat_" + "".join(rng.choice("0123456789abcdef") for _ in range(32))]
    out = []
    size = 0
    while size < n:
        line = " ".join(rng.choice(WORDS) for _ in range(10))
        if rng.random() < 0.2:
            line += " " + rng.choice(secrets)
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)[:n]


def source_code(n: int) -> str:
    files = sorted((ROOT / "hermes_session_guard").rglob("*.py"))
    text = "\n".join(f.read_text(encoding="utf-8") for f in files)
    return (text * (n // max(1, len(text)) + 1))[:n]


def base64_run(n: int) -> str:
    rng = _rng()
    return "".join(rng.choice(B64) for _ in range(n))


def hex_run(n: int) -> str:
    rng = _rng()
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def json_log(n: int) -> str:
    rng = _rng()
    out = []
    size = 0
    while size < n:
        sid = f"20260604_{rng.randint(0, 999999):06d}_" + "".join(rng.choice("0123456789abcdef") for _ in range(6))
        msg = " ".join(rng.choice(WORDS) for _ in range(6))
        line = (f'{{"ts": {rng.randint(1, 10**9)}, "level": "info", "session_id": "{sid}", "msg": "{msg}", '
                f'"tokens": {rng.randint(1, 200000)}}}')
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)[:n]


def repeated(unit: str) -> Callable[[int], str]:
    def make(n: int) -> str:
        return (unit * (n // len(unit) + 1))[:n]
    make.__name__ = f"repeated {unit!r}"
    return make


def alnum_token(n: int) -> str:
    """One run of letters and digits (what makes Hermes's redactor quadratic)."""
    rng = _rng()
    return "".join(rng.choice(B64[:62]) for _ in range(n))


def generated_tokens(n: int) -> str:
    """Random 12-24 character letter-and-digit tokens separated by spaces (each one goes
    through the shape detector)."""
    rng = _rng()
    out = []
    size = 0
    while size < n:
        token = "".join(rng.choice(B64[:62]) for _ in range(rng.randint(12, 24)))
        out.append(token)
        size += len(token) + 1
    return " ".join(out)[:n]


KINDS: dict[str, Callable[[int], str]] = {
    "prose": prose,
    "conversation+secrets": conversation_with_secrets,
    "source code": source_code,
    "json log": json_log,
    "base64": base64_run,
    "hex": hex_run,
    "password=": repeated("password="),
    "key: ": repeated("key: "),
    "a": repeated("a"),
    "a.": repeated("a."),
    "a:": repeated("a:"),
    "newlines": repeated("\n"),
    "AAAA": repeated("A"),
    "curl -u ": repeated("curl -u "),
    "x=\"": repeated('x="'),
    "generated tokens": generated_tokens,
    "key ": repeated("key "),
    "token -> ": repeated("token -> "),
    " -p ": repeated(" -p "),
    "a-": repeated("a-"),
    "Ab1.": repeated("Ab1."),
}


def best_of(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """The best wall and the best CPU seconds of ``repeat`` runs."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return wall, cpu


def _row(label: str, times: list[tuple[float, float]]) -> str:
    flag = "  over 1 s" if times[-1][0] > TARGET_SECONDS else ""
    return (f"{label:30s} " + " ".join(f"{t:8.3f}s" for t, _ in times)
            + f"   {times[-1][0] / max(times[0][0], 1e-9):6.1f}   {times[-1][1]:7.3f}s" + flag)


def long_tokens(host_redactor: Callable[[str], str] | None, repeat: int, unbounded: bool) -> float:
    """The long single tokens: guard chain, chain + Hermes's pass, whole packet; the worst 1 MB wall time."""
    print(f"\nlong single tokens (letters and digits) {'':4s}" + " ".join(f"{s // 1024:>7d}KB" for s in TOKEN_SIZES)
          + "   last/first   last CPU")
    tokens = [alnum_token(size) for size in TOKEN_SIZES]
    runs: list[tuple[str, Callable[[str], object]]] = [("guard chain", redact)]
    if host_redactor is not None:
        runs.append(("guard chain + Hermes's pass", lambda t: redact(t, host_redactor)))
    runs.append(("hand-off packet (note)", lambda t: render_packet(
        PacketInputs(session_id="S", created_at=0.0, note=t, last_user_request=t), host_redactor)))
    worst = 0.0
    for label, fn in runs:
        times = [best_of(lambda t=t, fn=fn: fn(t), repeat) for t in tokens]
        worst = max(worst, times[-1][0])
        print(_row(label, times), flush=True)
    if unbounded and host_redactor is not None:
        for t in tokens[:2]:  # 1 MB would take many minutes
            wall, cpu = best_of(lambda t=t: host_redactor(t), 1)
            print(f"  before: Hermes's pass on the whole {len(t) // 1024} KB token: {wall:.2f} s wall, {cpu:.2f} s CPU",
                  flush=True)
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", nargs="*", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-host", action="store_true", help="leave Hermes's pass out")
    parser.add_argument("--unbounded-host", action="store_true",
                        help="also time Hermes's pass on the whole 120 KB and 240 KB tokens (the 'before' figure)")
    args = parser.parse_args(argv)
    host_redactor = None if args.no_host else host.host_redactor()
    redact("warm up: password=hunter22")  # loads and compiles the rule sets
    rules = rule_set.rule_set()
    stats = dict(rules.stats) if rules else {}
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}"
          if hasattr(os, "getloadavg") else f"python {sys.version.split()[0]}")
    print("rule sets: " + ", ".join(f"{k} {v}" for k, v in stats.items()))
    print("Hermes's pass: " + ("none (left out)" if host_redactor is None else "redact_sensitive_text, bounded"))
    worst = worst_cpu = 0.0
    passes: list[tuple[str, Callable[[str], object]]] = [("", redact)]
    if host_redactor is not None:
        passes.append((" +Hermes", lambda t: redact(t, host_redactor)))
    if args.kinds:
        print(f"{'kind':30s} " + " ".join(f"{s // 1024:>7d}KB" for s in SIZES) + "   1MB/256KB   1MB CPU")
    for kind in args.kinds:
        make = KINDS[kind]
        texts = [make(size) for size in SIZES]
        for suffix, fn in passes:
            times = [best_of(lambda text=text, fn=fn: fn(text), args.repeat) for text in texts]
            worst, worst_cpu = max(worst, times[-1][0]), max(worst_cpu, times[-1][1])
            print(_row(kind + suffix, times), flush=True)
    worst = max(worst, long_tokens(host_redactor, args.repeat, args.unbounded_host))
    print(f"slowest 1 MB: {worst:.3f} s wall (target {TARGET_SECONDS:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
