#!/usr/bin/env python3
"""Peak RSS added by the guard in a gateway process serving 13 sessions.

    python scripts/bench_gateway_rss.py [--sessions 13] [--history 48] [--rounds 2]

Runs the same workload in fresh subprocesses, guarded and unguarded: a
real GatewayRunner with a fake Telegram adapter, ``--sessions`` chats each given
``--history`` big messages, then one message per chat at once so every session is
compressed by preflight. Each round runs both, in alternating order. Prints each
process's peak RSS and the difference of the medians (target: the guard adds <= 10 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import asyncio, json, os, resource, sys, time, logging
logging.disable(logging.WARNING)
from pathlib import Path
guarded, sessions, history = sys.argv[1] == "1", int(sys.argv[2]), int(sys.argv[3])
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer
import hermes_session_guard
home = Path(os.environ["HERMES_HOME"])
with FakeLLMServer() as llm:
    probe.write_config(home, llm.base_url, plugin_enabled=False, in_place=False)
    from hermes_session_guard.selftest.gateway import start_gateway
    if guarded:
        hermes_session_guard.install()

    async def main():
        gw = await start_gateway()
        sources = [gw.source(user_id=f"u{i}", chat_id=f"c{i}") for i in range(sessions)]
        llm.configure(prompt_tokens=500)
        for src in sources:
            await gw.send_text("hello", source=src)
        await gw.drain()
        for i, src in enumerate(sources):
            sid = gw.bound_session_id(src)
            for m in probe.seed_messages(history, tag=f"c{i}"):
                gw.runner.session_store.append_to_transcript(sid, m)
        started = time.perf_counter()
        for src in sources:
            await gw.send_text("next question", source=src)
        await gw.drain(timeout=600)
        return time.perf_counter() - started, [gw.bound_session_id(s) for s in sources]

    secs, bound = asyncio.run(main())
    summaries = len(llm.summary_requests())
rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("RESULT " + json.dumps({"rss_mb": rss_kb / 1024, "seconds": secs, "bound": bound, "summaries": summaries}))
"""


def run(guarded: bool, sessions: int, history: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="session-guard-rss-") as home:
        env = dict(os.environ, HERMES_HOME=home, GATEWAY_ALLOW_ALL_USERS="true")
        proc = subprocess.run([sys.executable, "-c", CHILD, "1" if guarded else "0", str(sessions), str(history)],
                              env=env, capture_output=True, text=True, timeout=1200)
        for line in proc.stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        raise SystemExit(f"workload failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=13)
    parser.add_argument("--history", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from machine_info import describe, load_average

    print(describe())
    print(f"gateway, {args.sessions} sessions x {args.history} messages, each compressed once; "
          f"{args.rounds} round(s), order alternating")
    peaks: dict[bool, list[float]] = {False: [], True: []}
    for i in range(args.rounds):
        for guarded in ((False, True) if i % 2 == 0 else (True, False)):
            r = run(guarded, args.sessions, args.history)
            peaks[guarded].append(r["rss_mb"])
            print(f"  {'guarded' if guarded else 'unguarded':<9} peak RSS {r['rss_mb']:7.1f} MB  "
                  f"({r['seconds']:.1f} s, {r['summaries']} summary calls)", flush=True)
    plain, guarded_mb = statistics.median(peaks[False]), statistics.median(peaks[True])
    print(f"  median peak RSS: unguarded {plain:.1f} MB, guarded {guarded_mb:.1f} MB; "
          f"added by the guard {guarded_mb - plain:+.1f} MB")
    print(f"load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
