"""Two processes resuming one session (two CLIs, or a CLI and an API server) take turns:
the second waits for the first, compression included, and answers from the compacted
transcript, never from the history it read when it started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from .api_turns import Reply, contract_violations, echo_last_user, marker
from .test_turn_order_api import HERMES_ORDERS_TURNS
from .waiting import TURN_WAITS, parked_in, wait_for

DRIVER = Path(__file__).with_name("turn_driver.py")
ROOT = Path(__file__).resolve().parents[2]
SID = "20260701_100000_twoproc"


def _launch(home: Path, llm: FakeLLMServer, text: str, work: Path) -> tuple[subprocess.Popen, Path, Path, Path]:
    """The driver of one turn; ``<text>.waiting`` appears once its turn waits for another."""
    ready, go, out = work / f"{text}.ready", work / f"{text}.go", work / f"{text}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, str(DRIVER), "--home", str(home), "--sid", SID, "--text", text,
                             "--base-url", llm.base_url, "--ready", str(ready), "--go", str(go), "--out", str(out),
                             "--waiting", str(work / f"{text}.waiting")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return proc, ready, go, out


def _wait_file(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def _two_processes(home: Path, db: Any, llm: FakeLLMServer, tmp_path: Path) -> list[str]:
    probe.seed_session(db, SID, probe.seed_messages())
    gate = threading.Event()
    llm.configure(summary_gate=gate, reply_fn=echo_last_user)
    sent = [marker(0, "cli"), marker(1, "cli")]
    procs = [_launch(home, llm, text, tmp_path) for text in sent]
    try:
        for proc, ready, _, _ in procs:
            _wait_file(ready, proc)  # both read the session's history now, before any compression
        procs[0][2].touch()
        assert llm.summary_started.wait(60), "the first process never reached the summary call"
        procs[1][2].touch()
        # ordered, the second turn waits for the first; unordered, it runs on its stale history: to
        # its answer, or to a compression of its own (held like the first)
        second, waiting = procs[1][0], tmp_path / f"{sent[1]}.waiting"
        assert wait_for(lambda: waiting.exists() or second.poll() is not None or len(llm.summary_requests()) > 1,
                        timeout=60), "the second turn neither waited nor ran"
        gate.set()
        replies = {}
        for text, (proc, _, _, out) in zip(sent, procs, strict=True):
            proc.wait(180)
            data = json.loads(out.read_text())
            assert "error" not in data, data.get("error")
            replies[text] = Reply(data["final_response"] or "", 200, data["session_id_after"], None)
    finally:
        gate.set()
        for proc, *_ in procs:
            if proc.poll() is None:
                proc.kill()
    return contract_violations(db, SID, sent, replies, llm, compressed=True, head_text="turn-0:")


def test_two_processes_on_one_session_take_turns_through_a_compression(guard: Any, home: Path, db: Any,
                                                                       llm: FakeLLMServer, tmp_path: Path) -> None:
    assert _two_processes(home, db, llm, tmp_path) == []
    assert len(llm.summary_requests()) == 1


def test_without_the_guard_the_second_process_answers_from_stale_history(home: Path, db: Any, llm: FakeLLMServer,
                                                                         tmp_path: Path) -> None:
    """Hermes 0.20+ keeps the promise itself (the seam table's turn rows are not-needed
    there): its durable turn lease makes the second process wait and reload the transcript."""
    probe.write_config(home, llm.base_url, plugin_enabled=False)
    violations = _two_processes(home, db, llm, tmp_path)
    assert violations == [] if HERMES_ORDERS_TURNS else violations != []


def test_a_cli_process_and_the_api_server_take_turns_on_one_session(guard: Any, home: Path, db: Any,
                                                                    llm: FakeLLMServer, tmp_path: Path) -> None:
    """The CLI process's turn compresses (summary held); a request to the API server in
    this process for the same session waits for it across processes, then answers from
    the compacted transcript."""
    from .api_turns import chat_completion, running_api_server, session_chat
    from .test_turn_order_api import HAS_SESSION_CHAT

    probe.seed_session(db, SID, probe.seed_messages())
    gate = threading.Event()
    llm.configure(summary_gate=gate, reply_fn=echo_last_user)
    sent = [marker(0, "cli"), marker(1, "api")]
    proc, ready, go, out = _launch(home, llm, sent[0], tmp_path)
    try:
        with running_api_server(home) as srv:
            _wait_file(ready, proc)
            go.touch()
            assert llm.summary_started.wait(60), "the CLI process never reached the summary call"
            send = session_chat if HAS_SESSION_CHAT else chat_completion
            box: dict[str, Reply] = {}
            api = threading.Thread(target=lambda: box.__setitem__("r", send(srv, SID, sent[1])))
            api.start()
            # it parks on the turn the CLI process holds; unordered, it would run on to its answer
            assert wait_for(lambda: parked_in(TURN_WAITS) or not api.is_alive(), timeout=60)
            assert api.is_alive(), "the API request did not wait for the CLI process's turn"
            gate.set()
            proc.wait(180)
            api.join(180)
        data = json.loads(out.read_text())
        assert "error" not in data, data.get("error")
        replies = {sent[0]: Reply(data["final_response"] or "", 200, data["session_id_after"], None),
                   sent[1]: box["r"]}
    finally:
        gate.set()
        if proc.poll() is None:
            proc.kill()
    assert contract_violations(db, SID, sent, replies, llm, compressed=True, head_text="turn-0:") == []
