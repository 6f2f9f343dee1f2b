#!/usr/bin/env python3
"""Taking a compacted session's old rows out of the live transcript on Hermes 0.13-0.17,
where state.db has no ``active`` column: the ways to do it, side by side in one run.

    python scripts/bench_row_removal.py [--messages 48:14000 200:2000 1000:2000] [--repeat 5]

Run it with the Python of an environment that has hermes-agent 0.13-0.17 installed
(e.g. ``.venvs/hermes-0.14.0/bin/python``). One session per size is seeded once into a
template state.db through Hermes's own ``SessionDB`` (its FTS5 triggers included); every
measurement works on a fresh copy of it in a temporary directory, in this process, and
replaces the session's rows by a compacted transcript of 8 messages:

``delete+copy``  what the guard does there: its verbatim snapshot copy
                 (``GuardStore.write_snapshot``), then Hermes's ``replace_messages``
``re-point``     the old rows moved to another session id (``UPDATE messages SET
                 session_id``, a ``sessions`` row for it) and the compacted rows appended:
                 no copy, but Hermes's FTS update triggers delete and re-insert every
                 row's index entries, and the old turns become a session of Hermes's own
                 (listed, resumable: a snapshot promoted to live), so it is measured, not used
``delete``       Hermes's ``replace_messages`` alone: the floor of any way that keeps the id
                 (the rows must leave the session, and Hermes's delete triggers re-tokenise them)
``rotate``       what Hermes does unguarded: end the session, start a child with the
                 compacted rows (the old rows stay where they are)

Prints per size and way the median CPU time, wall time and bytes written (``/proc/self/io``
``write_bytes`` from a checkpointed copy to the checkpoint after, Linux only), and the
ratio to ``delete``. No assertion: docs/performance.md reads the figures off the output.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["HERMES_HOME"] = tempfile.mkdtemp(prefix="session-guard-rows-")
sys.path.insert(0, str(Path(__file__).resolve().parent))

SID = "20260701_090000_rows01"
KEPT = 8


def _compacted(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    summary = {"role": "user", "content": "[CONTEXT COMPACTION] summary of the earlier turns"}
    return [summary, *[dict(m) for m in messages[-(KEPT - 1):]]]


def _delete_and_copy(db: Any, path: Path, messages: list[dict[str, Any]]) -> None:
    from hermes_session_guard.store import GuardStore

    store = GuardStore(path)
    try:
        store.write_snapshot(snapshot_id=f"{SID}.snapshot.1", session_id=SID, messages=messages)
    finally:
        store.close()
    db.replace_messages(SID, _compacted(messages))


def _re_point(db: Any, path: Path, messages: list[dict[str, Any]]) -> None:
    moved = f"{SID}.snapshot.1"
    db.create_session(session_id=moved, source="cli", model="fake-model")
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute("UPDATE messages SET session_id = ? WHERE session_id = ?", (moved, SID))
    finally:
        conn.close()
    for m in _compacted(messages):
        db.append_message(session_id=SID, role=m["role"], content=m["content"])


def _delete(db: Any, path: Path, messages: list[dict[str, Any]]) -> None:
    db.replace_messages(SID, _compacted(messages))


def _rotate(db: Any, path: Path, messages: list[dict[str, Any]]) -> None:
    db.end_session(SID, "compression")
    child = f"{SID}_child"
    db.create_session(session_id=child, source="cli", model="fake-model", parent_session_id=SID)
    for m in _compacted(messages):
        db.append_message(session_id=child, role=m["role"], content=m["content"])


WAYS: dict[str, Callable[[Any, Path, list[dict[str, Any]]], None]] = {
    "delete+copy": _delete_and_copy, "re-point": _re_point, "delete": _delete, "rotate": _rotate,
}


def _measure(template: Path, work: Path, way: Callable[..., None],
             messages: list[dict[str, Any]]) -> tuple[float, float, int | None]:
    from machine_info import checkpoint, write_bytes

    from hermes_session_guard.selftest import probe

    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    path = work / "state.db"
    shutil.copy(template, path)
    db = probe.open_db(path)
    try:
        checkpoint(path)
        written = write_bytes()
        cpu, started = time.process_time(), time.perf_counter()
        way(db, path, messages)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        checkpoint(path)
        after = write_bytes()
    finally:
        db.close()
    return cpu, wall, None if written is None or after is None else after - written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", nargs="+", default=["48:14000", "200:2000", "1000:2000"],
                        help="session sizes: N:CHARS")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import logging

    logging.disable(logging.WARNING)
    from machine_info import checkpoint, describe, load_average

    from hermes_session_guard.selftest import probe

    print(describe())
    root = Path(tempfile.mkdtemp(prefix="session-guard-rows-work-"))
    try:
        for size in args.messages:
            n_text, _, chars_text = size.partition(":")
            messages = probe.seed_messages(int(n_text), chars=int(chars_text or probe.MESSAGE_CHARS))
            template = root / f"template-{n_text}.db"
            db = probe.open_db(template)
            probe.seed_session(db, SID, messages)
            db.close()
            checkpoint(template)
            results: dict[str, list[tuple[float, float, int | None]]] = {name: [] for name in WAYS}
            for i in range(args.repeat):
                order = list(WAYS) if i % 2 == 0 else list(reversed(WAYS))
                for name in order:
                    results[name].append(_measure(template, root / "work", WAYS[name], messages))
            floor = statistics.median(r[0] for r in results["delete"])
            print(f"{n_text} messages x {int(chars_text or probe.MESSAGE_CHARS):,} chars, {args.repeat} runs each "
                  f"(medians; ratio = CPU / CPU of delete):")
            for name, runs in results.items():
                cpu = statistics.median(r[0] for r in runs)
                wall = statistics.median(r[1] for r in runs)
                sizes = [r[2] for r in runs if r[2] is not None]
                written = f"{statistics.median(sizes) / 1e6:7.2f} MB" if sizes else "    n/a"
                print(f"  {name:12s} cpu {cpu * 1000:8.1f} ms  wall {wall * 1000:8.1f} ms  written {written}  "
                      f"ratio {cpu / floor if floor else float('nan'):5.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
