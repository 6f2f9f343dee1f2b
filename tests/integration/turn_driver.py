"""One process resuming a session and running one turn on it (as a second CLI would).

    python turn_driver.py --home H --sid S --text T --base-url URL --ready R --go G --out OUT.json [--waiting W]

It reads the session's history when it starts (as a CLI does on resume), lets Hermes's
plugin discovery load the guard, signals ``R``, waits for ``G``, then runs the turn with
that history and writes the answer and the ids to ``OUT.json``. ``W`` appears once the
turn waits for another turn of the session (seen in this process's stacks).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import traceback
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--home", "--sid", "--text", "--base-url", "--ready", "--go", "--out"):
        p.add_argument(name, required=True)
    p.add_argument("--waiting")
    args = p.parse_args()
    os.environ["HERMES_HOME"] = args.home
    os.environ.pop("HERMES_SESSION_ID", None)
    out: dict = {}
    try:
        from hermes_session_guard import current_runtime
        from hermes_session_guard.selftest import probe

        probe.discover_guard()
        db = probe.open_db(Path(args.home) / "state.db")
        history = db.get_messages_as_conversation(args.sid)
        agent = probe.make_agent(db, args.base_url, args.sid)
        probe.mark_flushed(agent, history)
        from tests.integration.conftest import anchor_on_real_usage

        anchor_on_real_usage(agent, history)  # a resumed CLI's last response priced its history (0.21+)
        if args.waiting:
            _watch_for_the_turn_wait(Path(args.waiting))
        Path(args.ready).touch()
        deadline = time.monotonic() + 120
        while not Path(args.go).exists():
            if time.monotonic() > deadline:
                raise TimeoutError("no go signal")
            time.sleep(0.02)
        result = agent.run_conversation(args.text, conversation_history=history)
        out = {"guard_loaded": current_runtime() is not None, "final_response": result.get("final_response"),
               "session_id_after": agent.session_id, "history": len(history)}
    except Exception:
        out = {"error": traceback.format_exc()}
    Path(args.out).write_text(json.dumps(out), encoding="utf-8")
    return 0 if "error" not in out else 1


def _watch_for_the_turn_wait(flag: Path) -> None:
    from tests.integration.waiting import TURN_WAITS, parked_in

    def watch() -> None:
        while not parked_in(TURN_WAITS):
            time.sleep(0.02)
        flag.touch()

    threading.Thread(target=watch, daemon=True).start()


if __name__ == "__main__":
    raise SystemExit(main())
