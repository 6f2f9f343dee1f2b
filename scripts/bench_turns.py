#!/usr/bin/env python3
"""Benchmarks for the per-session turn order, against the Hermes installed here.

    PYTHONPATH=. python scripts/bench_turns.py [--runs 20] [--summary-latency 0.5]

Prints, guarded and unguarded side by side in this one run:

1. a turn queued behind a compression: how long after the compressing turn's answer
   the queued turn's answer comes, minus what the same turn costs alone on the
   compacted transcript: the guard's hand-over overhead (median of ``--runs``)
   (target <= 50 ms). Unguarded, the queued turn does not wait: it answers from the
   pre-compression transcript (shown for reference, with how often that happened).
2. 20 concurrent turns on 20 sessions over one turn alone (wall-time ratio), guarded
   and unguarded, and guarded/unguarded (target <= 1.3: the guard does not serialise
   different sessions).

Real ``AIAgent.run_conversation`` calls on a real SessionDB against the stdlib fake
LLM. Nothing here asserts; the machine is shared, so read medians, not single runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HOME = Path(tempfile.mkdtemp(prefix="session-guard-bench-turns-"))
os.environ["HERMES_HOME"] = str(HOME)  # before any Hermes import
os.environ.pop("HERMES_SESSION_ID", None)

import hermes_session_guard  # noqa: E402
from hermes_session_guard.hostinfo import installed_version  # noqa: E402
from hermes_session_guard.selftest import probe  # noqa: E402
from hermes_session_guard.selftest.fake_llm import FakeLLMServer  # noqa: E402

_counter = 0


def _sid() -> str:
    global _counter
    _counter += 1
    return f"20260801_1200{_counter % 100:02d}_bt{_counter:04x}"


def _agent(db: Any, llm: FakeLLMServer, sid: str, history: list[Any]) -> Any:
    agent = probe.make_agent(db, llm.base_url, sid)
    probe.mark_flushed(agent, history)
    return agent


def _turn(db: Any, llm: FakeLLMServer, sid: str, text: str, history: list[Any]) -> tuple[float, Any]:
    result = _agent(db, llm, sid, history).run_conversation(text, conversation_history=history)
    return time.perf_counter(), result


def _run(agent: Any, text: str, history: list[Any], out: dict[str, float], key: str) -> None:
    agent.run_conversation(text, conversation_history=history)
    out[key] = time.perf_counter()


def queued_behind_compression(db: Any, llm: FakeLLMServer, *, sequential: bool) -> tuple[float, int]:
    """A turn for a session whose turn is compressing. Returns (ms from the compressing
    turn's answer to the second turn's answer, summary calls made). ``sequential``: the
    caller itself sends the second turn only once the first is answered, on the session
    id and transcript it then has (the best any host can do: the baseline). Both
    agents are built before the first turn starts, so no variant pays for building one."""
    sid = _sid()
    probe.seed_session(db, sid, probe.seed_messages())
    history = db.get_messages_as_conversation(sid)
    first, second = _agent(db, llm, sid, history), _agent(db, llm, sid, history)
    llm.reset(behaviour=False)
    out: dict[str, float] = {}
    if sequential:
        _run(first, "first-q", list(history), out, "a")
        # a client that follows the id it was given back (hosts that rotate move the session)
        second.session_id = first.session_id
        live = db.get_messages_as_conversation(first.session_id)
        probe.mark_flushed(second, live)
        _run(second, "second-q", live, out, "b")
    else:
        a = threading.Thread(target=_run, args=(first, "first-q", list(history), out, "a"))
        a.start()
        llm.summary_started.wait(60)
        b = threading.Thread(target=_run, args=(second, "second-q", list(history), out, "b"))
        b.start()
        a.join()
        b.join()
    summaries = len(llm.summary_requests())
    llm.summary_started.clear()
    return (out["b"] - out["a"]) * 1000, summaries


def concurrent_sessions(db: Any, llm: FakeLLMServer, n: int) -> float:
    """Wall time of ``n`` turns on ``n`` sessions at once over one turn alone."""
    sids = [_sid() for _ in range(n + 1)]
    for sid in sids:
        probe.seed_session(db, sid, probe.seed_messages(4, chars=200))
    hist = {sid: db.get_messages_as_conversation(sid) for sid in sids}
    started = time.perf_counter()
    _turn(db, llm, sids[0], "one", hist[sids[0]])
    one = time.perf_counter() - started
    threads = [threading.Thread(target=_turn, args=(db, llm, sid, "many", hist[sid])) for sid in sids[1:]]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return (time.perf_counter() - started) / one


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--summary-latency", type=float, default=0.5)
    p.add_argument("--turn-latency", type=float, default=0.3, help="fake LLM latency for part 2")
    p.add_argument("--sessions", type=int, default=20)
    args = p.parse_args()
    print(f"Hermes {installed_version()}  home {HOME}  runs {args.runs}")
    with FakeLLMServer(summary_latency=args.summary_latency) as llm:
        probe.write_config(HOME, llm.base_url)
        probe.discover_guard()
        db = probe.open_db(HOME / "state.db")
        variants = {"guarded, arrives mid-compression": (True, False),
                    "unguarded, arrives mid-compression": (False, False),
                    "unguarded, sent after the answer": (False, True)}
        after: dict[str, list[float]] = {name: [] for name in variants}
        twice: dict[str, int] = dict.fromkeys(variants, 0)
        for i in range(args.runs):
            names = list(variants) if i % 2 == 0 else list(reversed(variants))
            for name in names:
                guarded, sequential = variants[name]
                hermes_session_guard.uninstall()
                if guarded:
                    hermes_session_guard.install()
                ms_after, summaries = queued_behind_compression(db, llm, sequential=sequential)
                after[name].append(ms_after)
                twice[name] += summaries > 1
        print(f"\n1. a second turn for a session whose turn is compressing (summary {args.summary_latency:.1f}s): "
              f"its answer after the compressing turn's, median of {args.runs}")
        for name in variants:
            print(f"   {name:36s} {statistics.median(after[name]):9.1f} ms   p90 "
                  f"{sorted(after[name])[max(0, int(len(after[name]) * 0.9) - 1)]:9.1f} ms   "
                  f"compressed twice {twice[name]}/{args.runs}")
        guarded = statistics.median(after["guarded, arrives mid-compression"])
        baseline = statistics.median(after["unguarded, sent after the answer"])
        print(f"   guard overhead (guarded - unguarded sent after the answer): {guarded - baseline:.1f} ms "
              "(target <= 50). Unguarded mid-compression the turn does not wait: it answers from the "
              "pre-compression history.")
        llm.configure(summary_latency=0.0, latency=args.turn_latency)
        ratios: dict[str, list[float]] = {"guarded": [], "unguarded": []}
        for i in range(3):
            for label in (("guarded", "unguarded") if i % 2 == 0 else ("unguarded", "guarded")):
                hermes_session_guard.uninstall()
                if label == "guarded":
                    hermes_session_guard.install()
                ratios[label].append(concurrent_sessions(db, llm, args.sessions))
        g, u = statistics.median(ratios["guarded"]), statistics.median(ratios["unguarded"])
        print(f"\n2. {args.sessions} concurrent turns on {args.sessions} sessions over one turn "
              f"(LLM latency {args.turn_latency}s), median of 3")
        print(f"   guarded {g:5.2f}x   unguarded {u:5.2f}x   guarded/unguarded {g / u:5.2f} (target <= 1.3)")
        db.close()
    hermes_session_guard.uninstall()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
