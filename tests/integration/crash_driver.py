"""One agent process that dies (SIGKILL) at a chosen phase of a guarded compression.

Launched by ``test_crash_recovery.py``::

    python crash_driver.py --home H --sid S --tag T --base-url URL --out RESULT.json \\
        --kill-at PHASE [--reached FILE] [--grow N] [--in-place | --rotate]

It loads session ``S`` from ``H/state.db`` the way a gateway or the CLI resumes a
chat (Hermes's own plugin discovery loads the guard from ``H/config.yaml``), then
runs one turn whose preflight crosses the compression threshold. ``--grow N``
first appends ``N`` more turns to the stored conversation (through Hermes's own
``SessionDB.append_message``), so a restarted process has something to compress
again even after the crashed one compacted.

The kill is installed here, in test code, never in the package: a pluggy hook
implementation or a wrapt patch calls ``os.kill(os.getpid(), SIGKILL)`` when the
phase is reached, after writing the phase name to ``--reached``. Phases:

``before_summary``
    the guard's ``session_guard_before_compression`` hook (lock held, phase row
    written, summary not requested yet);
``between_writes``
    the pre-compression snapshot and the live transcript: whichever of the two
    writes comes second is entered and not run (0.14 writes the snapshot, then
    ``SessionDB.replace_messages``; 0.18.2-0.19 write the snapshot, or its reference to
    Hermes's rows, when the context engine returns, before the host's
    ``archive_and_compact``; native mode, 0.20+, writes the reference inside that
    call's transaction, so the kill lands there, before its commit);
``before_release``
    both writes done, the compression lock about to be released (the guard's grant, or
    in native mode, 0.20+, Hermes's own ``release_compression_lock``);
``none``
    no kill (a restart). ``during_summary`` also installs nothing: the parent
    kills the process while the fake LLM holds the summary call.

The result (ids, answer, history length) goes to ``RESULT.json`` when the process
survives.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Any

from compression_driver import add_mode_arguments, run_and_report  # the sibling driver script

PHASES = ("before_summary", "during_summary", "between_writes", "before_release", "none")


def _die(reached: str | None, phase: str) -> None:
    if reached:
        Path(reached).write_text(phase, encoding="utf-8")
    os.kill(os.getpid(), signal.SIGKILL)


def install_kill(phase: str, reached: str | None) -> None:
    """Arrange for this process to SIGKILL itself when ``phase`` is reached."""
    if phase == "before_summary":
        from hermes_session_guard.hooks.manager import get_plugin_manager
        from hermes_session_guard.hooks.specs import hookimpl

        class KillBeforeSummary:
            @hookimpl
            def session_guard_before_compression(self, session_id: str, op_id: str, messages: list[Any]) -> None:
                _die(reached, phase)

        get_plugin_manager().register(KillBeforeSummary(), name="crash-test-kill")
        return
    if phase not in ("between_writes", "before_release"):
        return

    import wrapt

    written: set[str] = set()
    entered: set[str] = set()

    def write(kind: str, other: str) -> Any:
        def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            # native mode (0.20+): the reference is written inside Hermes's archive_and_compact
            # transaction (it rides its commit): killed there, before its commit
            if phase == "between_writes" and (other in written or other in entered):
                _die(reached, phase)
            entered.add(kind)
            result = wrapped(*args, **kwargs)
            written.add(kind)
            return result

        return wrapper

    wrapt.wrap_function_wrapper("hermes_session_guard.store", "GuardStore.write_snapshot", write("snapshot", "live"))
    # 0.19 and native mode (0.20+) may reference Hermes's rows instead of copying them
    wrapt.wrap_function_wrapper("hermes_session_guard.store", "GuardStore.write_snapshot_reference",
                                write("snapshot", "live"))
    import hermes_state

    for live_write in ("replace_messages", "archive_and_compact"):  # 0.14 / 0.18+
        if hasattr(hermes_state.SessionDB, live_write):
            wrapt.wrap_function_wrapper(hermes_state, f"SessionDB.{live_write}", write("live", "snapshot"))

    if phase == "before_release":
        def release(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            if {"snapshot", "live"} <= written:
                _die(reached, phase)
            return wrapped(*args, **kwargs)

        wrapt.wrap_function_wrapper("hermes_session_guard.locks.session_lock", "LockGrant.release", release)
        from tests.integration.conftest import HOST_NATIVE_MODE

        if HOST_NATIVE_MODE:  # Hermes's own lease, released by Hermes (0.16-0.19: the guard's grant holds it)
            wrapt.wrap_function_wrapper(hermes_state, "SessionDB.release_compression_lock", release)


def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["HERMES_HOME"] = args.home  # before the first Hermes import
    os.environ.pop("HERMES_SESSION_ID", None)
    from hermes_session_guard import current_runtime
    from hermes_session_guard.selftest import probe

    probe.discover_guard()
    runtime = current_runtime()
    db = probe.open_db(Path(args.home) / "state.db")
    for m in probe.seed_messages(args.grow, tag=f"{args.tag}-grow") if args.grow else []:
        db.append_message(session_id=args.sid, role=m["role"], content=m["content"])
    history = db.get_messages_as_conversation(args.sid)
    agent = probe.make_agent(db, args.base_url, args.sid)
    if args.in_place is not None and hasattr(agent, "compression_in_place"):
        agent.compression_in_place = args.in_place
    probe.mark_flushed(agent, history)
    from tests.integration.conftest import anchor_on_real_usage

    anchor_on_real_usage(agent, history)  # a resumed process's last response priced its history (0.21+)
    install_kill(args.kill_at, args.reached)
    result = agent.run_conversation(f"{args.tag}-next: question from {args.tag}", conversation_history=history)
    return {
        "pid": os.getpid(),
        "guard_loaded": runtime is not None,
        "session_id_before": args.sid,
        "session_id_after": agent.session_id,
        "env_session_id": os.environ.get("HERMES_SESSION_ID"),
        "history": len(history),
        "final_response": result.get("final_response"),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--home", required=True)
    p.add_argument("--sid", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--base-url", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--kill-at", choices=PHASES, default="none")
    p.add_argument("--reached")
    p.add_argument("--grow", type=int, default=0)
    add_mode_arguments(p)
    return run_and_report(run, p.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
