#!/usr/bin/env python3
"""Snapshot cost against session size: time and bytes written to state.db, guarded
vs unguarded, side by side in one process.

    python scripts/bench_snapshot_cost.py [--sizes 200 2000 20000] [--chars 400]

For each size a session of that many messages is compressed once without the guard
and once with it (fresh state.db each, zero-latency fake LLM). Bytes written are what
the process wrote through write(2) during the compression and the end-of-turn
flush (Linux ``/proc/self/io``; state.db WAL writes dominate). "beyond snapshot" divides the guarded
growth minus the snapshot's own bytes by the unguarded growth (target <= 1.1).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ["HERMES_HOME"] = tempfile.mkdtemp(prefix="session-guard-bench-")
os.environ.pop("HERMES_SESSION_ID", None)


def _written() -> int:
    """Bytes this process has written through write(2) so far (Linux /proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no wchar line")


def _snapshot_bytes(path: Path) -> int:
    import sqlite3

    conn = sqlite3.connect(str(path))
    try:
        row = conn.execute(
            "SELECT COALESCE(SUM(LENGTH(message_json) + LENGTH(COALESCE(content, ''))), 0)"
            " FROM session_guard_snapshot_messages"
        ).fetchone()
    finally:
        conn.close()
    return int(row[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200, 2000, 20000])
    parser.add_argument("--chars", type=int, default=400, help="characters per message")
    args = parser.parse_args()

    import logging

    logging.disable(logging.WARNING)
    import hermes_session_guard
    from hermes_session_guard import probe
    from hermes_session_guard.fake_llm import FakeLLMServer
    from hermes_session_guard.hostinfo import installed_version

    root = Path(os.environ["HERMES_HOME"])
    print(f"machine: {platform.machine()} cpus={os.cpu_count()} python={platform.python_version()} "
          f"hermes={installed_version()}")
    print(f"{'messages':>8} {'unguarded ms':>13} {'guarded ms':>11} {'time x':>7} "
          f"{'unguarded B':>12} {'guarded B':>11} {'snapshot B':>11} {'beyond snapshot x':>18}")
    with FakeLLMServer() as llm:
        for n in [48, *args.sizes]:  # the first size only warms imports and caches
            results = {}
            for with_guard in (False, True):
                home = root / f"{n}-{int(with_guard)}"
                os.environ["HERMES_HOME"] = str(home)
                probe.write_config(home, llm.base_url, plugin_enabled=False, in_place=False)
                if with_guard:
                    hermes_session_guard.install()
                else:
                    hermes_session_guard.uninstall()
                db = probe.open_db(home / "state.db")
                messages = probe.seed_messages(n, chars=args.chars)
                probe.seed_session(db, f"s{n}", messages)
                agent = probe.make_agent(db, llm.base_url, f"s{n}")
                probe.mark_flushed(agent, messages)
                before = _written()
                started = time.perf_counter()
                out, _ = agent._compress_context(messages, "sys", approx_tokens=10_000_000)
                # the unguarded host defers the child's rows to the end-of-turn flush: include it
                agent._flush_messages_to_session_db(out)
                elapsed = time.perf_counter() - started
                assert len(out) < len(messages)
                grown = _written() - before
                snap = _snapshot_bytes(home / "state.db") if with_guard else 0
                results[with_guard] = (elapsed, grown, snap)
                db.close()
            if n == 48:
                continue
            (tu, bu, _), (tg, bg, sg) = results[False], results[True]
            beyond = (bg - sg) / bu if bu > 0 else float("nan")
            print(f"{n:>8} {tu * 1000:>13.1f} {tg * 1000:>11.1f} {tg / tu:>7.2f} {bu:>12} {bg:>11} {sg:>11} "
                  f"{beyond:>18.2f}")
    hermes_session_guard.uninstall()
    return 0


if __name__ == "__main__":
    sys.exit(main())
