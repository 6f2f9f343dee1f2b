#!/usr/bin/env python3
"""Benchmarks for one-compression-per-session, against the Hermes installed here.

    PYTHONPATH=. python scripts/bench_lock.py [--quick]

Prints, each measured side by side in this one run:

1. uncontended lock acquire+release (in-process lock + the lease table this
   host uses): p50 / p99 in ms              (target: p99 <= 1 ms)
2. parallelism: wall time of 13 compressions of 13 distinct sessions at once,
   with a 1 s fake summary latency, over the time of one   (target <= 1.3x)
   - the guard alone: the whole guarded operation (lock, generation check,
     snapshot, persistence through SessionDB) around a host stand-in that just
     waits 1 s, so only the guard's own serialisation can show
   - the real host, guarded and unguarded, so the guard's share is visible
3. one compression of the standard 48-message session, guarded over unguarded
   wall time (median of alternating runs)                  (target <= 1.05)
   - with an instant fake LLM (the guard's whole cost, worst case) and with a
     1 s summary latency (closer to production, where summaries take 30-55 s)

Nothing here asserts; CI keeps the numbers as a log.
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

HOME = Path(tempfile.mkdtemp(prefix="session-guard-bench-"))
os.environ["HERMES_HOME"] = str(HOME)  # before any Hermes import
os.environ.pop("HERMES_SESSION_ID", None)

import hermes_session_guard  # noqa: E402
from hermes_session_guard import host  # noqa: E402
from hermes_session_guard.hostinfo import installed_version, parse_version  # noqa: E402
from hermes_session_guard.locks.session_lock import GuardLeases, LockGrant, SessionLocks  # noqa: E402
from hermes_session_guard.selftest import probe  # noqa: E402
from hermes_session_guard.selftest.fake_llm import FakeLLMServer  # noqa: E402
from hermes_session_guard.store import GuardStore  # noqa: E402

SYSTEM = "You are a benchmark agent."
_counter = 0


def _sid() -> str:
    global _counter
    _counter += 1
    return f"20260528_1612{_counter % 100:02d}_be{_counter:04x}"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


# -- 1. uncontended lock ----------------------------------------------------------------
def bench_lock(rounds: int) -> list[tuple[str, float, float]]:
    out = []
    tables: list[tuple[str, Any]] = [("guard lease (session_guard_locks)", GuardLeases(GuardStore(HOME / "state.db")))]
    db = probe.open_db(HOME / "state.db")
    agent_like = type("A", (), {"_session_db": db})()
    native = host.native_leases(agent_like)
    if native is not None:
        tables.append(("native lease (compression_locks)", native))
    tables.append(("in-process only", None))
    for name, table in tables:
        locks = SessionLocks()
        times = []
        for i in range(rounds + 50):
            t0 = time.perf_counter()
            grant = locks.acquire("20260528_155201_68dc5996", f"op{i}", wait_seconds=0, lease_seconds=300,
                                  lease=table)
            assert isinstance(grant, LockGrant)
            grant.release()
            if i >= 50:
                times.append(time.perf_counter() - t0)
        locks.close()
        out.append((name, pct(times, 50) * 1000, pct(times, 99) * 1000))
    return out


# -- compressions ---------------------------------------------------------------------
def _agent(db: Any, llm: FakeLLMServer, n: int, chars: int) -> tuple[Any, list[dict[str, Any]]]:
    sid = _sid()
    messages = probe.seed_messages(n, chars, tag=sid[-6:])
    probe.seed_session(db, sid, messages)
    agent = probe.make_agent(db, llm.base_url, sid)
    if hasattr(agent, "compression_in_place"):
        agent.compression_in_place = True
    probe.mark_flushed(agent, messages)
    return agent, messages


def _compress(agent: Any, messages: list[dict[str, Any]]) -> float:
    t0 = time.perf_counter()
    out, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    elapsed = time.perf_counter() - t0
    if len(out) >= len(messages):
        raise RuntimeError("benchmark compression made no progress")
    return elapsed


def _set_guard(on: bool) -> None:
    if on:
        hermes_session_guard.install()
    else:
        hermes_session_guard.uninstall()


def bench_parallel(llm: FakeLLMServer, guarded: bool, n: int, chars: int, shared_db: Any) -> tuple[float, float]:
    """One compression alone (median of three), then 13 at once in 13 threads of this
    process; each session in its own state.db (13 agent profiles) unless ``shared_db``."""
    _set_guard(guarded)
    llm.configure(summary_latency=1.0)
    dbs = [shared_db or probe.open_db(HOME / f"profile-{_sid()}" / "state.db") for _ in range(16)]
    one = statistics.median(_compress(*_agent(dbs[i], llm, n, chars)) for i in range(3))
    prepared = [_agent(dbs[3 + i], llm, n, chars) for i in range(13)]
    barrier = threading.Barrier(13)
    errors: list[BaseException] = []

    def run(agent: Any, messages: list[dict[str, Any]]) -> None:
        try:
            barrier.wait(30)
            _compress(agent, messages)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=p) for p in prepared]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    thirteen = time.perf_counter() - t0
    if errors:
        raise errors[0]
    llm.configure(summary_latency=0.0)
    return one, thirteen


class _StandInAgent:
    """What the guard touches on an agent, with no Hermes agent behind it."""

    def __init__(self, db: Any, sid: str) -> None:
        self.session_id = sid
        self._session_db = db
        self._cached_system_prompt = SYSTEM
        self._last_flushed_db_idx = 0


def bench_guard_alone(shared_db: Any | None) -> tuple[float, float]:
    """13 guarded operations at once around a host stand-in that waits 1 s, vs one."""
    from hermes_session_guard.seam_behaviour import FailurePolicy, LockMode
    from hermes_session_guard.seams.compression import LockPolicy, guarded_compression
    from hermes_session_guard.seams.table import select_row

    _set_guard(True)
    runtime = hermes_session_guard.current_runtime()
    row = select_row("compression", parse_version(installed_version() or "0"))
    assert runtime is not None and row is not None
    policy = LockPolicy(row.behaviour.lock or LockMode.GUARD, row.behaviour.lock_failure or FailurePolicy.CLOSED)

    def prepared() -> tuple[Any, list[dict[str, Any]]]:
        db = shared_db or probe.open_db(HOME / f"profile-{_sid()}" / "state.db")
        sid = _sid()
        messages = probe.seed_messages(48, 1_400, tag=sid[-6:])
        probe.seed_session(db, sid, messages)
        return _StandInAgent(db, sid), messages

    def run(agent: Any, messages: list[dict[str, Any]]) -> float:
        def host() -> tuple[list[dict[str, Any]], str]:
            time.sleep(1.0)
            return [*messages[:3], {"role": "user", "content": "[CONTEXT COMPACTION] summary"}, *messages[-4:]], SYSTEM

        t0 = time.perf_counter()
        out, _ = guarded_compression(runtime, row.behaviour.strategy, agent, messages, host,
                                     system_message=SYSTEM, lock=policy)
        if len(out) >= len(messages):
            raise RuntimeError("stand-in compression was not applied")
        return time.perf_counter() - t0

    one = statistics.median(run(*prepared()) for _ in range(3))
    batch = [prepared() for _ in range(13)]
    barrier = threading.Barrier(13)
    errors: list[BaseException] = []

    def worker(agent: Any, messages: list[dict[str, Any]]) -> None:
        try:
            barrier.wait(30)
            run(agent, messages)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=b) for b in batch]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return one, time.perf_counter() - t0


def bench_overhead(db: Any, llm: FakeLLMServer, latency: float, rounds: int) -> tuple[float, float]:
    llm.configure(summary_latency=latency)
    guarded, unguarded = [], []
    for i in range(rounds + 1):
        for on in (True, False) if i % 2 == 0 else (False, True):
            _set_guard(on)
            agent, messages = _agent(db, llm, probe.SEED_MESSAGES, probe.MESSAGE_CHARS)
            took = _compress(agent, messages)
            if i > 0:  # the first round warms imports and caches
                (guarded if on else unguarded).append(took)
    llm.configure(summary_latency=0.0)
    return statistics.median(guarded), statistics.median(unguarded)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (smoke run)")
    args = parser.parse_args()
    version = installed_version()
    if version is None:
        print("hermes-agent is not installed in this environment", file=sys.stderr)
        return 2
    lock_rounds = 300 if args.quick else 2000
    overhead_rounds = 3 if args.quick else 9
    parallel_rounds = 1 if args.quick else 3
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"Hermes {version}, python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load:.2f}")

    print("\n1. uncontended acquire+release (target p99 <= 1 ms)")
    for name, p50, p99 in bench_lock(lock_rounds):
        print(f"   {name:<36} p50 {p50:.3f} ms   p99 {p99:.3f} ms   {'OK' if p99 <= 1.0 else 'OVER'}")

    with FakeLLMServer() as llm:
        probe.write_config(HOME, llm.base_url, plugin_enabled=False)
        db = probe.open_db(HOME / "state.db")
        _set_guard(True)
        _compress(*_agent(db, llm, probe.SEED_MESSAGES, probe.MESSAGE_CHARS))  # warm-up

        print("\n2. 13 distinct sessions at once vs one, 1 s summary latency (target <= 1.3x)")
        print("   a) the guard alone, around a host stand-in that waits 1 s")
        for label, shared in (("own state.db each   ", None), ("one shared state.db ", db)):
            alone = [bench_guard_alone(shared) for _ in range(parallel_rounds)]
            one = statistics.median(r[0] for r in alone)
            thirteen = statistics.median(r[1] for r in alone)
            ratio = statistics.median(r[1] / r[0] for r in alone)
            print(f"      {label} one {one:.2f} s   13 {thirteen:.2f} s   ratio {ratio:.2f}  "
                  f"{'OK' if ratio <= 1.3 else 'OVER'}")
        print("   b) the real host; unguarded = the host's own ceiling (its CPU work shares the GIL)")
        cases = (("48 x 1.4K chars, own state.db each ", 48, 1_400, None),
                 ("48 x 1.4K chars, one shared state.db", 48, 1_400, db),
                 ("48 x 14K chars, own state.db each  ", probe.SEED_MESSAGES, probe.MESSAGE_CHARS, None))
        for label, n, chars, shared in cases:
            runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            for _ in range(parallel_rounds):
                for guarded in (True, False):
                    runs[guarded].append(bench_parallel(llm, guarded, n, chars, shared))
            for guarded in (True, False):
                one = statistics.median(r[0] for r in runs[guarded])
                thirteen = statistics.median(r[1] for r in runs[guarded])
                ratio = statistics.median(r[1] / r[0] for r in runs[guarded])
                verdict = ("OK" if ratio <= 1.3 else "OVER") if guarded else "(reference)"
                print(f"      {label} {'guarded  ' if guarded else 'unguarded'} one {one:.2f} s   "
                      f"13 {thirteen:.2f} s   ratio {ratio:.2f}  {verdict}")

        print("\n3. one compression of 48 x 14K-char messages, guarded / unguarded (target <= 1.05)")
        for latency in (0.0, 1.0):
            g, u = bench_overhead(db, llm, latency, overhead_rounds)
            ratio = g / u
            print(f"   summary latency {latency:.0f} s: guarded {g * 1000:.0f} ms  unguarded {u * 1000:.0f} ms  "
                  f"ratio {ratio:.3f}  {'OK' if ratio <= 1.05 else 'OVER'}")
        _set_guard(False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
