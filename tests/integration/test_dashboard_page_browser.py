"""The dashboard's "Compactions" tab in a real browser, against Hermes's own dashboard.

A conversation is compacted under the guard (one of the turns it replaces carries an API
key), ``enable`` writes the dashboard plugin, and Hermes's dashboard is started on
127.0.0.1 the way ``hermes dashboard`` starts it (``web_server.start_server``, a process of
its own, the built frontend the release ships). Headless Debian Chromium then loads the tab
and opens the compaction: driven through chromedriver (Debian's ``chromium-driver``, the W3C
WebDriver protocol over the stdlib) it clicks the compaction's "Open"; without chromedriver it
loads the address "Open" stands for (``?session=<id>&op=<op id>``). The test reads the
rendered DOM: the tab lists the compaction, and the opened compaction shows the original
turns it replaced, the key masked. The guard's route answers only with the dashboard's
session token (401 without it), and nothing of those turns reaches the guard's logs. A
screenshot of the page is left under the test's temporary directory (``tab.png``).

Releases whose wheel ships no built dashboard frontend (0.20.1, 0.22.2) or whose
dashboard does not import (0.15.2) skip; without Chromium the test skips and says so
(``.ci/run`` installs Debian's ``chromium`` and ``chromium-driver``).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from .conftest import dashboard_unavailable, new_agent
from .test_home_check_commands import run_cli

ROOT = Path(__file__).resolve().parents[2]
SID = "20260604_100000_b0a5e1"
KEY = "sk-proj-Zq8vT3kLmN4pR7sX2wY9bC1dF6gH0jK5"
REPLACED_TURN = 9  # 1-based turn 10 of probe.seed_messages(): inside the span a compaction replaces
CHROMIUM = shutil.which("chromium") or next((p for p in ("/usr/bin/chromium",) if os.path.exists(p)), None)
CHROMEDRIVER = shutil.which("chromedriver")  # Debian's chromium-driver: clicks "Open" (else the address opens it)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]
SERVE = """
import sys
from hermes_cli import web_server
web_server.start_server(host="127.0.0.1", port=int(sys.argv[1]), open_browser=False)
"""


@pytest.fixture(autouse=True)
def _browser_and_dashboard_here() -> None:
    import hermes_cli

    if not (Path(hermes_cli.__file__).parent / "web_dist" / "index.html").is_file():
        pytest.skip("this release's wheel ships no built dashboard frontend (hermes_cli/web_dist)")
    why = dashboard_unavailable()
    if why:
        pytest.skip(why)
    if CHROMIUM is None:
        pytest.skip("no Chromium to render the page: install Debian's `chromium` (.ci/run does)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", "replace")


def _dashboard(home: Path, port: int) -> subprocess.Popen[str]:
    env = dict(os.environ, HERMES_HOME=str(home), PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    env.pop("HERMES_SESSION_ID", None)
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(port)], env=env, cwd=str(home), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the dashboard exited: {(proc.stdout.read() if proc.stdout else '')[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise AssertionError("the dashboard did not listen within 120 s")


def _chromium(url: str, profile: Path, *extra: str) -> str:
    done = subprocess.run([str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1400,1800",
                           "--virtual-time-budget=15000", *extra, url],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


class _WebDriver:
    """The W3C WebDriver protocol over the stdlib: chromedriver on 127.0.0.1 driving Chromium."""

    def __init__(self, profile: Path) -> None:
        port = _free_port()
        self.proc = subprocess.Popen([str(CHROMEDRIVER), f"--port={port}"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                self._call("GET", "/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        options = {"binary": str(CHROMIUM), "args": [*CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                                     "--window-size=1400,1800"]}
        created = self._call("POST", "/session", {"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "goog:chromeOptions": options}}})
        self.session = f"/session/{created['sessionId']}"

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read())["value"]

    def go(self, url: str) -> None:
        self._call("POST", f"{self.session}/url", {"url": url})

    def wait_for(self, css: str, seconds: float = 60) -> str:
        """The first element matching ``css`` (its WebDriver id) once the page has rendered it."""
        deadline = time.monotonic() + seconds
        while True:
            found = self._call("POST", f"{self.session}/elements", {"using": "css selector", "value": css})
            if found:
                return str(next(iter(found[0].values())))
            assert time.monotonic() < deadline, f"no {css} on the page after {seconds:.0f} s"
            time.sleep(0.3)

    def click(self, element: str) -> None:
        self._call("POST", f"{self.session}/element/{element}/click", {})

    def dom(self) -> str:
        return str(self._call("GET", f"{self.session}/source"))

    def screenshot(self, path: Path) -> None:
        import base64

        path.write_bytes(base64.b64decode(self._call("GET", f"{self.session}/screenshot")))

    def close(self) -> None:
        try:
            self._call("DELETE", self.session)
        finally:
            self.proc.kill()
            self.proc.wait(30)


def _clicked_open(base: str, op: str, profile: Path, shot: Path) -> str:
    """The tab loaded, its compaction's "Open" clicked, the opened turns rendered: the DOM."""
    driver = _WebDriver(profile)
    try:
        driver.go(f"{base}/session-guard")
        driver.click(driver.wait_for(f'button.session-guard-open[data-op="{op}"]'))
        driver.wait_for("section.session-guard-originals li[data-turn]")
        driver.screenshot(shot)
        return driver.dom()
    finally:
        driver.close()


def _text(dom: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", dom))


def test_the_tab_opens_a_compaction_to_its_original_turns_with_secrets_masked(
        guard: Any, db: Any, llm: FakeLLMServer, home: Path, tmp_path: Path) -> None:
    messages = probe.seed_messages()
    messages[REPLACED_TURN]["content"] = f"Deploy with OPENAI_API_KEY={KEY} on node-7. " + \
        messages[REPLACED_TURN]["content"]
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, "in_place")
    probe.mark_flushed(agent, messages)
    agent._compress_context(messages, "You are a test agent.", approx_tokens=150_000)
    (op,) = [c["op_id"] for c in guard.store_for(home / "state.db").compressions(SID)]
    enabled = run_cli(["enable", "--json"], home)
    assert enabled.returncode == 0, enabled.stderr

    port = _free_port()
    proc = _dashboard(home, port)
    try:
        base = f"http://127.0.0.1:{port}"
        route = f"{base}/api/plugins/session-guard/compaction?session={SID}&op={op}"
        assert _get(route)[0] == 401  # the dashboard's own auth guards the guard's route
        page = tmp_path / "chromium"
        shot = tmp_path / "tab.png"
        if CHROMEDRIVER:  # the person's way: the tab, then "Open" on the compaction
            dom = _clicked_open(base, op, page, shot)
        else:  # the address "Open" stands for
            url = f"{base}/session-guard?session={SID}&op={op}"
            dom = _chromium(url, page, "--dump-dom")
            _chromium(url, page, f"--screenshot={shot}")
    finally:
        proc.kill()
        served_log = proc.communicate(timeout=30)[0] or ""  # the dashboard process's own output
    text = _text(dom)
    assert "session-guard-compactions" in dom and op in text, text[-3000:]  # the tab lists the compaction
    opened = dom[dom.index("session-guard-originals"):]
    shown = _text(opened)
    assert f"Compaction {op}: the original turns it replaced" in shown, shown[:2000]
    turns = [int(t) for t in re.findall(r'data-turn="(\d+)"', opened)]
    assert turns and REPLACED_TURN + 1 in turns, turns  # 1-based turns of the snapshot
    assert "turn-9:" in shown and "node-7" in shown, shown[:3000]
    assert re.search(r"OPENAI_API_KEY=(\[REDACTED\]|\*\*\*)", shown), shown[:3000]  # the guard's mask or Hermes's
    assert KEY not in dom  # masked as in hand-off packets
    assert "turn-46:" not in shown  # a kept turn is not among those the compaction replaced
    assert shot.is_file() and shot.stat().st_size > 10_000
    # nothing of the opened turns in a log: the guard's audit log (which names the compaction),
    # Hermes's logs under the home, the dashboard process's output
    audit = (home / "logs" / "session_guard.jsonl").read_text(errors="replace")
    assert op in audit
    logs = "".join(p.read_text(errors="replace") for p in (home / "logs").iterdir() if p.is_file()) + served_log
    assert KEY not in logs and "turn-9:" not in logs and "deployment plan" not in logs
    print(json.dumps({"screenshot": str(shot), "turns": [turns[0], turns[-1]], "op": op,
                      "opened_by": "click" if CHROMEDRIVER else "address"}))
