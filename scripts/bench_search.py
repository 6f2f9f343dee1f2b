#!/usr/bin/env python3
"""Search over compacted history: Hermes's own ``search_messages``, guarded vs unguarded,
side by side in one run, and what the guard's search index adds to state.db.

    python scripts/bench_search.py [--sizes 2000 20000] [--chars 400] [--reps 15] [--mode rotate]

For each size one session of that many messages (each with its own marker word) is
seeded once through Hermes's API into a template home, copied into two homes and
compressed once through Hermes's real compression (zero-latency fake LLM): one
with Hermes exactly as shipped (0.13-0.17 rotate: the compacted rows stay in the
ended parent), one guarded (0.13-0.17: the guard keeps the id and the rows in its
snapshot). Then:

* first search: the guarded home's first search also builds the snapshot search
  index (once per compression); timed apart;
* index bytes: state.db pages in use added by that index (WAL checkpointed before
  and after; free pages not counted), against the snapshot's own bytes; pages in
  use of both homes after compression;
* latency: each query through ``SessionDB.search_messages`` on the guarded home
  (the guard's wrapper) and on the unguarded home (Hermes's own function, the
  wrapper's ``__wrapped__``), alternating, ``--reps`` times; median wall time and
  the ratio guarded / unguarded per query (target <= 1.2).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
_TMP = tempfile.mkdtemp(prefix="session-guard-bench-search-")
os.environ["HERMES_HOME"] = str(Path(_TMP) / "default")
os.environ.pop("HERMES_SESSION_ID", None)

QUERIES = [
    ("rare word in a compacted turn", "marker000123", 50),
    ("rare word, dashboard limit", "marker000123", 20),
    ("phrase", '"assistant line 7"', 50),
    ("common word (every message)", "deployment", 50),
    ("prefix", "marker00012*", 50),
    ("no match", "nonexistentword", 50),
]
SID = "20260604_090000_be0c40"


def _messages(n: int, chars: int) -> list[dict]:
    from hermes_session_guard.selftest import probe

    out = probe.seed_messages(n, chars=chars)
    for i, message in enumerate(out):
        message["content"] = f"marker{i:06d} " + message["content"]
    return out


def _checkpoint(path: Path) -> None:
    conn = sqlite3.connect(str(path))
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def _size(path: Path) -> int:
    """Bytes of state.db pages in use (free pages left by deleted rows not counted)."""
    _checkpoint(path)
    conn = sqlite3.connect(str(path))
    try:
        pages = conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]
        return int(pages) * int(conn.execute("PRAGMA page_size").fetchone()[0])
    finally:
        conn.close()


def _snapshot_bytes(path: Path) -> int:
    conn = sqlite3.connect(str(path))
    try:
        row = conn.execute("SELECT COALESCE(SUM(LENGTH(message_json) + LENGTH(COALESCE(content, ''))), 0)"
                           " FROM session_guard_snapshot_messages").fetchone()
        return int(row[0])
    except sqlite3.Error:
        return 0
    finally:
        conn.close()


def _compress(home: Path, base_url: str, guarded: bool) -> tuple[object, str]:
    import hermes_session_guard
    from hermes_session_guard.selftest import probe

    if guarded:
        hermes_session_guard.install()
    else:
        hermes_session_guard.uninstall()
    try:
        db = probe.open_db(home / "state.db")
        messages = db.get_messages_as_conversation(SID)
        agent = probe.make_agent(db, base_url, SID)
        probe.mark_flushed(agent, messages)
        out, _ = agent._compress_context(messages, "sys", approx_tokens=10_000_000)
        agent._flush_messages_to_session_db(out)
        assert len(out) < len(messages), "compression made no progress"
        return db, agent.session_id
    finally:
        hermes_session_guard.install()


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 0.1 else f"{value:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--chars", type=int, default=400)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--mode", choices=("rotate", "in_place"), default="rotate",
                        help="compression.in_place for 0.18.2+ (older releases always rotate)")
    args = parser.parse_args()
    from machine_info import describe

    import hermes_session_guard
    from hermes_session_guard.hostinfo import installed_version
    from hermes_session_guard.seams.legacy import search_index
    from hermes_session_guard.selftest import probe
    from hermes_session_guard.selftest.fake_llm import FakeLLMServer

    print(describe())
    print(f"Hermes {installed_version()}; unguarded compression.in_place: {args.mode} (0.13-0.17 always rotate); "
          f"{args.chars}-character messages; latency = median of {args.reps} alternating pairs")
    in_place = args.mode == "in_place"
    rows = []
    with FakeLLMServer() as llm:
        root = Path(_TMP)
        probe.write_config(Path(os.environ["HERMES_HOME"]), llm.base_url, plugin_enabled=False, in_place=in_place)
        runtime = hermes_session_guard.install()
        for n in args.sizes:
            template = root / f"template-{n}"
            probe.write_config(template, llm.base_url, plugin_enabled=False, in_place=in_place)
            db = probe.open_db(template / "state.db")
            started = time.perf_counter()
            probe.seed_session(db, SID, _messages(n, args.chars))
            db.close()
            _checkpoint(template / "state.db")
            print(f"\n{n} messages seeded in {time.perf_counter() - started:.1f} s")
            homes = {tag: root / f"{tag}-{n}" for tag in ("unguarded", "guarded")}
            for home in homes.values():
                shutil.copytree(template, home)
            db_u, live_u = _compress(homes["unguarded"], llm.base_url, guarded=False)
            db_g, live_g = _compress(homes["guarded"], llm.base_url, guarded=True)
            size_u = _size(homes["unguarded"] / "state.db")
            size_g_before = _size(homes["guarded"] / "state.db")
            store = runtime.store_for(homes["guarded"] / "state.db")
            started = time.perf_counter()
            snapshots = search_index.index_pending(store) if runtime.seam_patched("search_messages") else 0
            first_search = time.perf_counter() - started
            size_g = _size(homes["guarded"] / "state.db")
            print(f"ids after compression: unguarded {live_u}, guarded {live_g}; snapshots indexed: {snapshots} "
                  f"in {first_search * 1000:.0f} ms (once, at the first search after the compression)")
            added, snap = size_g - size_g_before, _snapshot_bytes(homes["guarded"] / "state.db")
            print(f"state.db pages in use after compression: unguarded {size_u / 1e6:.2f} MB, guarded "
                  f"{size_g_before / 1e6:.2f} MB (snapshot text+JSON {snap / 1e6:.2f} MB); the search index adds "
                  f"{added / 1e6:.2f} MB = {added / n:.0f} bytes per compacted message = "
                  f"{added / snap if snap else 0:.2f} x the snapshot's own bytes")
            search = type(db_u).search_messages
            unwrapped = getattr(search, "__wrapped__", search)
            for label, query, limit in QUERIES:
                got_u = unwrapped(db_u, query, limit=limit)
                got_g = db_g.search_messages(query, limit=limit)
                times_u: list[float] = []
                times_g: list[float] = []
                for rep in range(args.reps):
                    order = [(db_g.search_messages, db_g, times_g), (None, db_u, times_u)]
                    for fn, dbx, sink in (order if rep % 2 else order[::-1]):
                        t = time.perf_counter()
                        if fn is None:
                            unwrapped(dbx, query, limit=limit)
                        else:
                            fn(query, limit=limit)
                        sink.append(time.perf_counter() - t)
                mu, mg = _median_ms(times_u), _median_ms(times_g)
                rows.append((n, label, limit, len(got_u), len(got_g), mu, mg, mg / mu if mu else float("nan")))
            db_u.close()
            db_g.close()
    print()
    print("| messages | query | limit | hits unguarded | hits guarded | unguarded ms | guarded ms | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for n, label, limit, hu, hg, mu, mg, ratio in rows:
        print(f"| {n:,} | {label} | {limit} | {hu} | {hg} | {_ms(mu)} | {_ms(mg)} | {ratio:.2f} |")
    shutil.rmtree(_TMP, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
