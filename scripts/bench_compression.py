#!/usr/bin/env python3
"""Guarded vs unguarded wall time of one compression, side by side in one process.

    python scripts/bench_compression.py [--pairs 20] [--messages 48]

Run it with the Python of an environment that has hermes-agent and this package
installed (e.g. ``.venvs/hermes-0.19.0/bin/python``). Each pair compresses a fresh
seeded session once with the guard installed and once without, in alternating
order, against the bundled zero-latency fake LLM; the first (import-heavy) pair
is discarded. Prints the median ratio and the spread. No assertion: the target
(<= 1.05) is read off the output.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["HERMES_HOME"] = tempfile.mkdtemp(prefix="session-guard-bench-")
os.environ.pop("HERMES_SESSION_ID", None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--messages", type=int, default=48)
    parser.add_argument("--latency", type=float, default=0.0, help="fake LLM latency per request (seconds)")
    args = parser.parse_args()

    import logging

    logging.disable(logging.WARNING)
    import hermes_session_guard
    from hermes_session_guard import probe
    from hermes_session_guard.fake_llm import FakeLLMServer
    from hermes_session_guard.hostinfo import installed_version

    home = Path(os.environ["HERMES_HOME"])
    guarded: list[float] = []
    plain: list[float] = []
    with FakeLLMServer(latency=args.latency) as llm:
        probe.write_config(home, llm.base_url, plugin_enabled=False, in_place=False)
        db = probe.open_db(home / "state.db")
        base = probe.seed_messages(args.messages)

        def one(sid: str, with_guard: bool) -> float:
            if with_guard:
                hermes_session_guard.install()
            else:
                hermes_session_guard.uninstall()
            messages = [dict(m) for m in base]
            probe.seed_session(db, sid, messages)
            agent = probe.make_agent(db, llm.base_url, sid)
            probe.mark_flushed(agent, messages)
            started = time.perf_counter()
            out, _ = agent._compress_context(messages, "You are a benchmark agent.", approx_tokens=150_000)
            elapsed = time.perf_counter() - started
            assert len(out) < len(messages), "compression made no progress"
            return elapsed

        for i in range(args.pairs + 1):
            order = (True, False) if i % 2 == 0 else (False, True)
            times = {flag: one(f"bench_{i}_{int(flag)}", flag) for flag in order}
            if i == 0:
                continue  # first pair pays for imports and caches
            guarded.append(times[True])
            plain.append(times[False])
        hermes_session_guard.uninstall()

    ratios = [g / p for g, p in zip(guarded, plain, strict=True)]
    print(f"machine: {platform.machine()} {platform.processor() or ''} cpus={os.cpu_count()} "
          f"python={platform.python_version()} hermes={installed_version()}")
    print(f"compression of {args.messages} messages x {len(ratios)} pairs (fake LLM latency {args.latency:g} s)")
    print(f"  unguarded median {statistics.median(plain) * 1000:8.1f} ms")
    print(f"  guarded   median {statistics.median(guarded) * 1000:8.1f} ms  "
          f"(added median {statistics.median([g - p for g, p in zip(guarded, plain, strict=True)]) * 1000:+.1f} ms)")
    q = statistics.quantiles(ratios, n=4)
    print(f"  ratio guarded/unguarded: median {statistics.median(ratios):.3f}  "
          f"(p25 {q[0]:.3f}, p75 {q[2]:.3f}, min {min(ratios):.3f}, max {max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
