#!/usr/bin/env python3
"""Guarded vs unguarded time and bytes written of one compression, side by side in one process.

    python scripts/bench_compression.py [--pairs 20] [--messages 48 200:2000 1000:2000] [--latency S]
                                        [--mode rotate] [--own] [--journal wal]

Run it with the Python of an environment that has hermes-agent and this package
installed (e.g. ``.venvs/hermes-0.19.0/bin/python``). Each pair compresses a fresh
seeded session once with the guard installed and once without, in alternating
order, against the bundled zero-latency fake LLM; the first (import-heavy) pair
is discarded. Prints, per session size, the medians and the spread of the
guarded/unguarded ratio of wall time and of the process's CPU time (less
sensitive to other load on a shared machine), with the machine and its load
average before and after. ``N:CHARS`` sizes a session of N messages of CHARS characters
(``--chars`` otherwise, else the probe's 14,000).

Bytes: on Linux, the process's ``write_bytes`` (``/proc/self/io``: pages dirtied in the
page cache for a file, the WAL and state.db alike) from a checkpointed state.db to the
checkpoint after the compression, so each side pays for the pages its writes reach in
state.db itself. Printed as the median and minimum per side; ``n/a`` elsewhere. No
assertion: the targets are read off the output (docs/performance.md).

``--own``: also the guard's own CPU time per guarded compression, told apart from
Hermes's inside the same call (``guard_clock.py``): not a difference of two noisy runs.
Printed twice: over the pairs (the guard installed again before each guarded run, so
each pays for its first store read and caches) and over as many compressions more with
the guard installed once, as a running agent has it.

``--journal wal``: state.db is in WAL mode before Hermes opens it, as on an install
upgraded from 0.19 or earlier. Hermes 0.20+ keeps a file it finds in WAL, and chooses WAL
itself on an SQLite without the WAL-reset bug (3.51.3+); on an older SQLite it creates a
new state.db in the rollback journal (``hermes``, the default: Hermes decides). The mode
in use is printed.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

os.environ["HERMES_HOME"] = tempfile.mkdtemp(prefix="session-guard-bench-")
os.environ.pop("HERMES_SESSION_ID", None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--messages", nargs="+", default=["48", "200"],
                        help="session sizes: N messages, or N:CHARS")
    parser.add_argument("--chars", type=int, default=None, help="characters per message (default: probe's 14,000)")
    parser.add_argument("--latency", type=float, default=0.0, help="fake LLM latency per request (seconds)")
    parser.add_argument("--mode", choices=("rotate", "in_place", "default"), default="rotate",
                        help="compression.in_place for the unguarded host (0.18.2+; the guard keeps the id either "
                             "way): rotate (false), in_place (true) or Hermes's default")
    parser.add_argument("--own", action="store_true", help="also the guard's own CPU time per compression")
    parser.add_argument("--journal", choices=("hermes", "wal"), default="hermes",
                        help="state.db's journal mode: Hermes's choice, or WAL set before Hermes opens it")
    args = parser.parse_args()

    import logging

    logging.disable(logging.WARNING)
    from guard_clock import GUARD, OwnClock, caller_kind, instrument
    from machine_info import checkpoint, describe, load_average, write_bytes

    import hermes_session_guard
    from hermes_session_guard.selftest import probe
    from hermes_session_guard.selftest.fake_llm import FakeLLMServer

    print(describe())
    clock = OwnClock() if args.own else None
    caller = GUARD  # whose the caller's _compress_context call is (guard_clock.caller_kind)
    if clock is not None:
        from hermes_session_guard.hostinfo import installed_version

        instrument(clock, installed_version() or "0")
        caller = caller_kind(installed_version() or "0")
    home = Path(os.environ["HERMES_HOME"])
    with FakeLLMServer(latency=args.latency) as llm:
        in_place = {"rotate": False, "in_place": True, "default": None}[args.mode]
        probe.write_config(home, llm.base_url, plugin_enabled=False, in_place=in_place)
        if args.journal == "wal":
            with closing(sqlite3.connect(home / "state.db")) as conn:
                conn.execute("PRAGMA journal_mode=WAL")
        db = probe.open_db(home / "state.db")
        with closing(sqlite3.connect(home / "state.db")) as conn:
            print(f"state.db journal mode: {conn.execute('PRAGMA journal_mode').fetchone()[0]}")
        for size in args.messages:
            n_text, _, chars_text = size.partition(":")
            n = int(n_text)
            chars = {"chars": int(chars_text)} if chars_text else {} if args.chars is None else {"chars": args.chars}
            base = probe.seed_messages(n, **chars)

            own: list[float] = []

            def one(sid: str, with_guard: bool, base: list[dict] = base,
                    own: list[float] = own) -> tuple[float, float, int | None]:
                if with_guard:
                    hermes_session_guard.install()
                else:
                    hermes_session_guard.uninstall()
                messages = [dict(m) for m in base]
                probe.seed_session(db, sid, messages)
                agent = probe.make_agent(db, llm.base_url, sid)
                probe.mark_flushed(agent, messages)
                checkpoint(home / "state.db")
                written = write_bytes()
                compress = agent._compress_context
                if clock is not None and with_guard:
                    compress = clock.timed(caller, compress)
                    clock.take()
                cpu, started = time.process_time(), time.perf_counter()
                out, _ = compress(messages, "You are a benchmark agent.", approx_tokens=150_000)
                elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
                if clock is not None and with_guard:
                    own.append(clock.take()[GUARD])
                checkpoint(home / "state.db")
                after = write_bytes()
                assert len(out) < len(messages), "compression made no progress"
                return elapsed, cpu, None if written is None or after is None else after - written

            guarded: list[tuple[float, float, int | None]] = []
            plain: list[tuple[float, float, int | None]] = []
            for i in range(args.pairs + 1):
                order = (True, False) if i % 2 == 0 else (False, True)
                times = {flag: one(f"bench_{n}_{i}_{int(flag)}", flag) for flag in order}
                if i == 0:
                    own.clear()
                    continue  # first pair pays for imports and caches
                guarded.append(times[True])
                plain.append(times[False])
            report(f"{n} x {chars.get('chars', probe.MESSAGE_CHARS):,} chars", args.latency, guarded, plain,
                   args.mode)
            if own:
                pairs_own = list(own)
                own.clear()
                hermes_session_guard.install()
                for i in range(args.pairs + 1):  # the first pays for the install, as in the pairs
                    one(f"bench_{n}_{i}_once", True)
                for label, times in (("", pairs_own), (", installed once", own[1:])):
                    q = [x * 1000 for x in statistics.quantiles(times, n=4)]
                    print(f"  guard's own cpu{label}: median {statistics.median(times) * 1000:.1f} ms per compression"
                          f" (p25 {q[0]:.1f}, p75 {q[2]:.1f}, min {min(times) * 1000:.1f}; guard_clock.py)")
        hermes_session_guard.uninstall()
    print(f"load average after: {load_average()}")
    return 0


def report(size: str, latency: float, guarded: list[tuple[float, float, int | None]],
           plain: list[tuple[float, float, int | None]], mode: str) -> None:
    print(f"compression of {size} x {len(guarded)} pairs (fake LLM latency {latency:g} s, "
          f"unguarded compression.in_place: {mode})")
    for k, what in ((0, "wall"), (1, "cpu ")):
        g, p = [x[k] for x in guarded], [x[k] for x in plain]
        ratios = [a / b for a, b in zip(g, p, strict=True)]
        q = statistics.quantiles(ratios, n=4)
        added = statistics.median([a - b for a, b in zip(g, p, strict=True)])
        print(f"  {what}: unguarded median {statistics.median(p) * 1000:7.1f} ms, guarded median "
              f"{statistics.median(g) * 1000:7.1f} ms (added {added * 1000:+.1f} ms); ratio median "
              f"{statistics.median(ratios):.3f} (p25 {q[0]:.3f}, p75 {q[2]:.3f}, min {min(ratios):.3f}, "
              f"max {max(ratios):.3f})")
    g_bytes, p_bytes = [x[2] for x in guarded if x[2] is not None], [x[2] for x in plain if x[2] is not None]
    if not g_bytes or not p_bytes:
        print("  bytes: n/a (no /proc/self/io)")
        return
    g_med, p_med = statistics.median(g_bytes), statistics.median(p_bytes)
    print(f"  bytes: unguarded median {p_med / 1e6:6.2f} MB (min {min(p_bytes) / 1e6:.2f}), guarded median "
          f"{g_med / 1e6:6.2f} MB (min {min(g_bytes) / 1e6:.2f}); ratio of medians "
          f"{g_med / p_med if p_med else float('inf'):.2f}, of minimums "
          f"{min(g_bytes) / min(p_bytes) if min(p_bytes) else float('inf'):.2f}")


if __name__ == "__main__":
    sys.exit(main())
