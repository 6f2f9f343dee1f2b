#!/usr/bin/env python3
"""Drain N messages that arrived during compression: Hermes's own queue vs the guard's inbox.

    python scripts/bench_buffer.py                 # 1,000 messages per arm
    python scripts/bench_buffer.py --messages 200 --rounds 2

Runs the real ``GatewayRunner`` (fake Telegram adapter, loopback fake LLM with no
latency) of the Hermes installed in this Python, twice, side by side:

In each arm a message triggers preflight compression of a 48-message session and
the fake LLM holds the summary call while N follow-ups arrive:

``unguarded``
    guard uninstalled; the N follow-ups are put in Hermes's own unbounded follow-up
    FIFO (``_enqueue_fifo``, the ``/queue`` path: the busy-message path would keep
    one of them on 0.14 and 32 on 0.19).
``guarded``
    guard installed; the N follow-ups arrive through the adapter: each is stored in
    ``session_guard_inbox`` and receipted.

Both arms then drain the queue through the same host recursion (one agent turn per
message). Reported: drain throughput, drain time per answered message, the guard's
added time per message (guarded minus unguarded), and the time spent inside the
guard's own functions (buffering, and drain bookkeeping) measured directly. Target:
the guard adds <= 2 ms per message beyond the agent's own turn. (Hermes 0.14's own
FIFO loses the follow-up that hits its recursion cap, so its arm answers fewer; times
are per answered message.) Exit status 1 if the guarded arm did not answer every
message in order.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ["HERMES_HOME"] = tempfile.mkdtemp(prefix="bench-buffer-")
os.environ.pop("HERMES_SESSION_ID", None)
os.environ.setdefault("GATEWAY_ALLOW_ALL_USERS", "true")

import logging  # noqa: E402

logging.disable(logging.WARNING)

from hermes_session_guard.seams import buffering  # noqa: E402
from hermes_session_guard.selftest import probe  # noqa: E402
from hermes_session_guard.selftest.fake_llm import FakeLLMServer  # noqa: E402

TRIGGER = "bench trigger"


class Timers:
    """Wall time spent inside the guard's gateway functions."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._originals: dict[str, Any] = {}

    def _add(self, name: str, dt: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + dt
        self.calls[name] = self.calls.get(name, 0) + 1

    def install(self) -> None:
        for name in ("on_drain", "on_handler_start", "on_handler_done"):
            fn = getattr(buffering, name)
            self._originals[name] = fn

            def timed(*a: Any, _fn: Any = fn, _name: str = name, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return _fn(*a, **k)
                finally:
                    self._add(_name, time.perf_counter() - t0)

            setattr(buffering, name, functools.wraps(fn)(timed))
        busy = buffering.on_busy_message
        self._originals["on_busy_message"] = busy

        async def timed_busy(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await busy(*a, **k)
            finally:
                self._add("on_busy_message", time.perf_counter() - t0)

        buffering.on_busy_message = timed_busy  # type: ignore[assignment]

    def uninstall(self) -> None:
        for name, fn in self._originals.items():
            setattr(buffering, name, fn)


def last_user(body: dict[str, Any]) -> str:
    for m in reversed(body.get("messages") or []):
        if m.get("role") == "user":
            return str(m.get("content"))
    return ""


async def one_arm(llm: FakeLLMServer, arm: str, n: int) -> dict[str, float]:
    """One chat: a 48-message history, a message that triggers preflight compression
    with the summary call held, ``n`` follow-ups during it, then the drain."""
    import hermes_session_guard
    from hermes_session_guard.selftest.gateway import start_gateway

    home = Path(tempfile.mkdtemp(prefix=f"bench-{arm}-"))
    os.environ["HERMES_HOME"] = str(home)
    probe.write_config(home, llm.base_url, extra={"compression": {"hygiene_hard_message_limit": 10_000_000}})
    if arm == "guarded":
        hermes_session_guard.install()
    else:
        hermes_session_guard.uninstall()
    gate = threading.Event()
    llm.reset()
    llm.configure(reply_fn=lambda body: "re: " + last_user(body))
    gw = await start_gateway()
    await gw.send_text("hi")
    await gw.drain()
    sid = gw.bound_session_id() or ""
    key = gw.session_key()
    tag = f"bench{os.getpid()}{arm}"
    for m in probe.seed_messages(tag=tag):
        gw.runner.session_store.append_to_transcript(sid, m)
    llm.configure(summary_gate=gate)
    since = time.time()
    trigger = asyncio.get_running_loop().create_task(gw.send_text(TRIGGER))
    while not any(r.ts >= since and f"{tag}-1:" in json.dumps(r.body) for r in llm.summary_requests()):
        await asyncio.sleep(0.005)
    t0 = time.perf_counter()
    for k in range(n):
        if arm == "guarded":
            await gw.send_text(f"follow-up {k:05d}")
        else:
            gw.runner._enqueue_fifo(key, gw.event(f"follow-up {k:05d}"), gw.adapter)
    t_queue = time.perf_counter() - t0
    t1 = time.perf_counter()
    gate.set()
    await trigger
    await gw.drain(timeout=3600)
    t_drain = time.perf_counter() - t1
    llm.configure(summary_gate=None)
    answers = [r for r in gw.replies() if r.startswith("re: follow-up")]
    ordered = answers == [f"re: follow-up {k:05d}" for k in range(n)]
    return {"queue_s": t_queue, "drain_s": t_drain, "answered": len(answers), "in_order": float(ordered)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=1, help="unguarded/guarded pairs, interleaved")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    n = args.messages

    from importlib import metadata

    version = metadata.version("hermes-agent")
    results: dict[str, list[dict[str, float]]] = {"unguarded": [], "guarded": []}
    timers = Timers()
    with FakeLLMServer() as llm:
        probe.write_config(Path(os.environ["HERMES_HOME"]), llm.base_url)
        probe.discover_guard()
        # warm-up: imports and first-call costs out of the measurement
        asyncio.run(one_arm(llm, "unguarded", 5))
        asyncio.run(one_arm(llm, "guarded", 5))
        for _ in range(args.rounds):
            results["unguarded"].append(asyncio.run(one_arm(llm, "unguarded", n)))
            timers.install()
            try:
                results["guarded"].append(asyncio.run(one_arm(llm, "guarded", n)))
            finally:
                timers.uninstall()

    def per_msg(arm: str, key: str) -> float:
        """ms per message answered (Hermes's own FIFO may answer fewer than it was given)."""
        return sum(r[key] for r in results[arm]) / max(1.0, sum(r["answered"] for r in results[arm])) * 1000

    drain_u, drain_g = per_msg("unguarded", "drain_s"), per_msg("guarded", "drain_s")
    rounds = args.rounds
    guard_drain_ms = sum(timers.seconds.get(k, 0.0) for k in ("on_drain", "on_handler_start", "on_handler_done"))
    report = {
        "hermes": version,
        "messages": n,
        "rounds": rounds,
        "answered_in_order": {a: all(r["answered"] == n and r["in_order"] for r in results[a]) for a in results},
        "answered": {a: [int(r["answered"]) for r in results[a]] for a in results},
        "drain_ms_per_message": {"unguarded": round(drain_u, 3), "guarded": round(drain_g, 3)},
        "throughput_msgs_per_s": {"unguarded": round(1000 / drain_u, 1), "guarded": round(1000 / drain_g, 1)},
        "guarded_unguarded_ratio": round(drain_g / drain_u, 3),
        "added_ms_per_message": round(drain_g - drain_u, 3),
        "guard_own_ms_per_message": {
            "drain_bookkeeping": round(guard_drain_ms * 1000 / (rounds * n), 3),
            "buffering_incl_durable_insert_and_receipt": round(
                timers.seconds.get("on_busy_message", 0.0) * 1000 / (rounds * n), 3),
        },
        "queue_ms_per_message": {"unguarded": round(per_msg("unguarded", "queue_s"), 3),
                                 "guarded": round(per_msg("guarded", "queue_s"), 3)},
    }
    out = sys.__stdout__  # Hermes wraps sys.stdout for its own quiet mode
    print_ = functools.partial(print, file=out, flush=True)
    if args.json:
        print_(json.dumps(report, indent=2))
    else:
        print_(f"Hermes {version}: drain {n} messages that arrived during compression "
               f"({rounds} round(s), side by side)")
        for arm in ("unguarded", "guarded"):
            print_(f"  {arm:<10} {report['drain_ms_per_message'][arm]:8.3f} ms/message  "
                  f"{report['throughput_msgs_per_s'][arm]:8.1f} msg/s  "
                  f"answered {sum(report['answered'][arm])}/{n * rounds}, "
                  f"all in order: {report['answered_in_order'][arm]}")
        print_(f"  guarded/unguarded ratio {report['guarded_unguarded_ratio']:.3f}; "
              f"added {report['added_ms_per_message']:.3f} ms/message (target <= 2 ms)")
        own = report["guard_own_ms_per_message"]
        print_(f"  inside the guard: drain bookkeeping {own['drain_bookkeeping']:.3f} ms/message; "
              f"buffering (durable insert + receipt) {own['buffering_incl_durable_insert_and_receipt']:.3f} "
              f"ms/message")
    return 0 if report["answered_in_order"]["guarded"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
