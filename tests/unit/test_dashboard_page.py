"""The dashboard's "Compactions" tab (``dashboard_page/index.js``) run in Node with a
stand-in for the dashboard's plugin SDK: it registers under the plugin's name, asks the
guard's route, and shows each record's ids, outcome, counts and times."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import dashboard_plugin

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="Node.js is not installed")
PAGE = Path(dashboard_plugin.__file__).parent / "dashboard_page" / "index.js"

# A minimal SDK: createElement builds a tree, useState keeps state across renders, useEffect
# runs once, fetchJSON answers with the given body (or fails with it when it is a string).
HARNESS = r"""
const fs = require("fs");
// node -e: argv[1] is the first argument (no script path)
const source = fs.readFileSync(process.argv[1], "utf8");
const [answers, typed, click] = [JSON.parse(process.argv[2]), process.argv[3], process.argv[4]];
// one answer for every path, or {"__routes__": {path: answer}} by path without its query
const answerFor = (path) => answers && answers.__routes__ ? answers.__routes__[path.split("?")[0]] : answers;
const fetched = [], state = [];
let slot = 0, effect = null, registered = null;
const SDK = {
  React: {createElement: (type, props, ...children) => ({type, props, children: children.flat()})},
  hooks: {
    useState: (initial) => {
      const k = slot++;
      if (!(k in state)) state[k] = initial;
      return [state[k], (v) => { state[k] = v; }];
    },
    useEffect: (fn) => { effect = fn; },
  },
  components: {},
  fetchJSON: (path) => {
    fetched.push(path);
    const answer = answerFor(path);
    return typeof answer === "string" ? Promise.reject(new Error(answer)) : Promise.resolve(answer);
  },
};
const plugins = {register: (name, page) => { registered = [name, page]; }};
global.window = {__HERMES_PLUGIN_SDK__: SDK, __HERMES_PLUGINS__: plugins};
eval(source);
const render = () => { slot = 0; return registered[1](); };
const text = (n) => n === null || n === undefined ? ""
  : typeof n !== "object" ? String(n) : (n.children || []).map(text).join("|");
const find = (n, cls) => n === null || typeof n !== "object" ? null
  : (n.props && n.props.className === cls) ? n : (n.children || []).map((c) => find(c, cls)).find((c) => c) || null;
(async () => {
  let tree = render();
  if (typed) { tree.children[1].children[0].props.onChange({target: {value: typed}}); render(); }
  effect();
  await new Promise((resolve) => setTimeout(resolve, 0));
  if (click) {
    find(render(), "session-guard-open").props.onClick();
    await new Promise((resolve) => setTimeout(resolve, 0));
  }
  console.log(JSON.stringify({name: registered[0], fetched, text: text(render())}));
})();
"""


def _show(answer: Any, typed: str = "", click: bool = False) -> dict[str, Any]:
    done = subprocess.run([str(NODE), "-e", HARNESS, str(PAGE), json.dumps(answer), typed, "1" if click else ""],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


RECORDS = [
    {"session_id": "S2", "op_id": "7a10afe29bd4", "outcome": "done", "started_at": "2026-11-28T03:00:00.000+00:00",
     "messages_before": 49, "messages_after": 13, "summary_ms": 3702.1, "duration_ms": 4210.5,
     "snapshot_id": "S2.snapshot.20261128T030004.210000Z", "reason": None},
    {"session_id": "S1", "op_id": "963a95d5428a", "outcome": "interrupted",
     "started_at": "2026-11-28T02:00:00.000+00:00",
     "messages_before": 49, "messages_after": None, "summary_ms": None, "duration_ms": None, "snapshot_id": None,
     "reason": "the process running it is gone; it never recorded an outcome"},
]


def test_the_tab_registers_and_lists_every_record() -> None:
    shown = _show({"guard": "on", "compactions": RECORDS})
    assert shown["name"] == dashboard_plugin.PLUGIN_NAME == dashboard_plugin.MANIFEST["name"]
    assert shown["fetched"] == ["/api/plugins/session-guard/compactions"]
    text = shown["text"]
    for expected in ("7a10afe29bd4", "done", "49 -> 13", "3.7 s", "4.2 s", "S2.snapshot.20261128T030004.210000Z",
                     "963a95d5428a", "interrupted", "49 -> -", "never recorded an outcome"):
        assert expected in text, (expected, text)
    assert text.index("7a10afe29bd4") < text.index("963a95d5428a")  # as the route orders them


def test_the_filter_asks_for_one_session() -> None:
    shown = _show({"guard": "on", "compactions": RECORDS[:1]}, typed=" S2 ")
    assert shown["fetched"] == ["/api/plugins/session-guard/compactions?session=S2"]


@pytest.mark.parametrize("answer,expected", [
    ({"guard": "on", "compactions": []}, "No compaction recorded yet."),
    ({"guard": "off", "compactions": []}, "The session guard is not on in this dashboard process."),
    ("401: unauthorized", "Could not load the compactions: 401: unauthorized"),
])
def test_an_empty_list_a_guard_that_is_off_and_an_error_each_say_so(answer: Any, expected: str) -> None:
    assert expected in _show(answer)["text"]


def test_open_shows_the_original_turns_the_route_answers() -> None:
    opened = {"guard": "on", "compaction": RECORDS[0], "first_turn": 4, "last_turn": 5,
              "turns": [{"turn": 4, "role": "assistant", "content": "turn-3: OPENAI_API_KEY=*** on node-7"},
                        {"turn": 5, "role": "user", "content": "turn-4: and then?"}]}
    shown = _show({"__routes__": {"/api/plugins/session-guard/compactions": {"guard": "on", "compactions": RECORDS},
                                  "/api/plugins/session-guard/compaction": opened}}, click=True)
    assert shown["fetched"] == ["/api/plugins/session-guard/compactions",
                                "/api/plugins/session-guard/compaction?session=S2&op=7a10afe29bd4"]
    text = shown["text"]
    for expected in ("Compaction 7a10afe29bd4: the original turns it replaced", "Turns 4-5 of snapshot",
                     "Turn 4 · assistant", "turn-3: OPENAI_API_KEY=*** on node-7", "Turn 5 · user"):
        assert expected in text, (expected, text)


def test_a_compaction_without_a_snapshot_has_nothing_to_open() -> None:
    shown = _show({"guard": "on", "compactions": RECORDS[1:]})
    assert "Open" not in shown["text"].split("|")
