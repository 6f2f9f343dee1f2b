"""One agent process of the multi-process compression run.

Launched by ``test_multi_process_compression.py`` (and usable by hand)::

    python compression_driver.py --home H --sid S --tag T --base-url URL \\
        --ready READY_FILE --go GO_FILE --out RESULT.json [--in-place | --rotate]

It loads session ``S`` from ``H/state.db`` the way a gateway resumes a chat, lets
Hermes's own plugin discovery load the guard (config.yaml in ``H``), signals that
it is ready, waits for the go file, then runs one turn whose preflight crosses
the compression threshold. The result (ids before and after, the answer, every
compression log line with its ``[session]`` tag) goes to ``RESULT.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hermes_session_guard.selftest.probe import root_log_records, session_tag


@contextmanager
def capture_compression_records() -> Iterator[list[dict[str, Any]]]:
    """Capture Hermes's ``context compression`` lines and the guard's own lines, each
    with the ``[session]`` tag Hermes's log record factory put on it and its thread."""
    out: list[dict[str, Any]] = []
    with root_log_records() as records:
        try:
            yield out
        finally:
            for rec in records:
                msg = rec.getMessage()
                if "context compression" in msg or rec.name == "hermes_session_guard":
                    tag = session_tag(rec).strip("[]") or None
                    out.append({"message": msg, "tag": tag, "thread": rec.threadName, "logger": rec.name})


def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["HERMES_HOME"] = args.home  # before the first Hermes import
    os.environ.pop("HERMES_SESSION_ID", None)
    from hermes_session_guard import current_runtime
    from hermes_session_guard.selftest import probe

    probe.discover_guard()
    runtime = current_runtime()
    db = probe.open_db(Path(args.home) / "state.db")
    history = db.get_messages_as_conversation(args.sid)
    agent = probe.make_agent(db, args.base_url, args.sid)
    if args.in_place is not None and hasattr(agent, "compression_in_place"):
        agent.compression_in_place = args.in_place
    probe.mark_flushed(agent, history)
    from tests.integration.conftest import anchor_on_real_usage

    anchor_on_real_usage(agent, history)  # a resumed process's last response priced its history (0.21+)

    Path(args.ready).touch()
    deadline = time.monotonic() + args.timeout
    while not Path(args.go).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no go signal")
        time.sleep(0.02)

    crossed_at = time.time()
    with capture_compression_records() as records:
        result = agent.run_conversation(f"{args.tag}-next: question from {args.tag}", conversation_history=history)
    return {
        "pid": os.getpid(),
        "guard_loaded": runtime is not None,
        "session_id_before": args.sid,
        "session_id_after": agent.session_id,
        "env_session_id": os.environ.get("HERMES_SESSION_ID"),
        "history": len(history),
        "final_response": result.get("final_response"),
        "crossed_at": crossed_at,
        "finished_at": time.time(),
        "records": records,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--home", required=True)
    p.add_argument("--sid", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--base-url", required=True)
    p.add_argument("--ready", required=True)
    p.add_argument("--go", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--timeout", type=float, default=120.0)
    add_mode_arguments(p)
    return run_and_report(run, p.parse_args())


def add_mode_arguments(p: argparse.ArgumentParser) -> None:
    """``--in-place`` / ``--rotate``: Hermes's ``compression.in_place`` (0.18+); neither = its default."""
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--in-place", dest="in_place", action="store_true", default=None)
    mode.add_argument("--rotate", dest="in_place", action="store_false")


def run_and_report(run: Callable[[argparse.Namespace], dict[str, Any]], args: argparse.Namespace) -> int:
    """Run one driver and write its report (or the error) as JSON to ``args.out``."""
    try:
        report = run(args)
        code = 0
    except Exception as exc:
        report = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        code = 1
    Path(args.out).write_text(json.dumps(report, default=str), encoding="utf-8")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
