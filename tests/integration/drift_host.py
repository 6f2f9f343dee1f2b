"""A Hermes changed the way upstream changes releases, made cheaply from the release installed
in this venv, never touching it.

:func:`make_host` creates a virtualenv in a test's tmp dir (``--without-pip``) whose own
site-packages holds copies of only the Hermes top-level modules a case edits (``hermes_cli``
always, for the version), edited there; a ``.pth`` file then adds the release venv's
site-packages after them (``site.addsitedir``, so its own ``.pth`` files, the guard's editable
install among them, run too). Python finds the copies first; everything else is the release's
own files. ``sys.prefix`` is the new venv, so the guard's per-install record lands there.

:func:`run` runs Python in that venv; :data:`COMPACT` is a script that compacts one seeded
session (guarded or not) and prints the outcome as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RELABEL = "0.23.5"

Edit = Callable[[str], str]


def release_site() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def make_host(tmp: Path, edits: dict[str, Edit], version: str = RELABEL) -> Path:
    """A venv at ``tmp/venv`` running the installed Hermes with ``edits`` (path under
    site-packages -> text edit) applied to copies, and ``hermes_cli.__version__`` set to
    ``version``. Returns its python."""
    return make_venv(tmp / "venv", edits, version)


def make_venv(venv: Path, edits: dict[str, Edit], version: str = RELABEL) -> Path:
    """:func:`make_host` at the path ``venv`` (which must not exist yet)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    source = release_site()
    # hermes_bootstrap moves its own directory to the front of sys.path: its copy keeps the copies first
    tops = {"hermes_cli", "hermes_bootstrap.py",
            *(path.split("/", 1)[0] for path in edits if (source / path.split("/", 1)[0]).exists())}
    tops = {top for top in tops if (source / top).exists()}
    for top in sorted(tops):
        origin = source / top
        if origin.is_dir():
            shutil.copytree(origin, site / top, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source / top, site / top)
    edits = {"hermes_cli/__init__.py": lambda text: text + f"\n__version__ = {version!r}\n", **edits}
    for path, edit in edits.items():
        target = site / path
        before = target.read_text(encoding="utf-8") if target.exists() else ""  # "": a new module
        after = edit(before)
        assert after != before, f"the edit of {path} changed nothing"
        target.write_text(after, encoding="utf-8")
    (site / "zz_release_site.pth").write_text(f"import site; site.addsitedir({str(source)!r})\n", encoding="utf-8")
    # the release's console scripts (hermes, hermes-session-guard, ...), run by this venv's python
    release_python = Path(sys.executable)
    for script in sorted(release_python.parent.iterdir()):
        target = venv / "bin" / script.name
        if target.exists() or not script.is_file():
            continue
        with open(script, "rb") as fh:
            first = fh.readline()
        if first.startswith(b"#!") and first[2:].strip() == str(release_python).encode():
            rest = script.read_bytes()[len(first):]
            target.write_bytes(f"#!{python}\n".encode() + rest)
            target.chmod(0o755)
    return python


def replace_once(old: str, new: str) -> Edit:
    def edit(text: str) -> str:
        assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
        return text.replace(old, new)

    return edit


def replace_all(old: str, new: str) -> Edit:
    def edit(text: str) -> str:
        assert old in text, f"{old!r} not found"
        return text.replace(old, new)

    return edit


def everywhere(top: str, old: str, new: str) -> dict[str, Edit]:
    """Rename ``old`` to ``new`` in every module of the release's package ``top`` that names it."""
    base = release_site()
    return {str(path.relative_to(base)): replace_all(old, new) for path in sorted((base / top).rglob("*.py"))
            if old in path.read_text(encoding="utf-8")}


def add_trailing_keyword(function: str, name: str) -> Edit:
    """Add a keyword parameter ``name=None`` at the end of ``def function(...)``'s parameters."""
    def edit(text: str) -> str:
        start = text.index(f"def {function}(")
        end = text.index("\n) ->", start)
        head = text[:end].rstrip()
        return head + (f" {name}=None," if head.endswith(",") else f", {name}=None") + text[end:]

    return edit


def move_out(function: str, module: str, new_module: str) -> dict[str, Edit]:
    """Move ``function`` of package module ``module`` (a/b.py) to ``new_module``, re-exported under its old name."""
    old_dotted, new_dotted = module[:-3].replace("/", "."), new_module[:-3].replace("/", ".")
    moved = f"_{function}_before_the_move"

    def old(text: str) -> str:
        text = replace_once(f"def {function}(", f"def {moved}(")(text)
        return text + f"\nfrom {new_dotted} import {function}  # moved; the old name re-exported\n"

    def new(text: str) -> str:
        return (f"from typing import Any\n\n\ndef {function}(agent: Any, messages: list, system_message: str, "
                f"**kwargs: Any) -> Any:\n    from {old_dotted} import {moved}\n\n"
                f"    return {moved}(agent, messages, system_message, **kwargs)\n")

    return {module: old, new_module: new}


def refuse_foreign_writes() -> dict[str, Edit]:
    """``SessionDB._execute_write`` (same signature) refuses a write callback from code outside
    the Hermes distribution: rows written under another holder."""
    base = release_site()
    tops = set()
    for info in base.glob("hermes_agent*.dist-info"):
        tops |= set((info / "top_level.txt").read_text(encoding="utf-8").split())

    def edit(text: str) -> str:
        line = next(line for line in text.splitlines() if line.strip() == "result = fn(self._conn)")
        pad = line[: len(line) - len(line.lstrip())]
        guard = (f"{pad}if (getattr(fn, '__module__', None) or '').split('.')[0] not in {sorted(tops)!r} "
                 f"and getattr(fn, '__module__', None):\n"
                 f"{pad}    raise RuntimeError('write refused: rows written under another holder')\n")
        return replace_once(line + "\n", guard + line + "\n")(text)

    return {"hermes_state.py": edit}


def run(python: Path, args: list[str], home: Path, timeout: float = 600,
        **env: str) -> subprocess.CompletedProcess[str]:
    child = dict(os.environ, HERMES_HOME=str(home), **env)
    child.pop("PYTHONPATH", None)
    child.pop("HERMES_SESSION_ID", None)
    return subprocess.run([str(python), *args], env=child, capture_output=True, text=True, timeout=timeout)


def selftest(python: Path, home: Path) -> tuple[int, dict[str, Any], str]:
    """``hermes-session-guard selftest --json`` in the changed host: exit code, report, stderr."""
    proc = run(python, ["-c", "from hermes_session_guard.commands.cli import main; raise SystemExit(main())",
                        "selftest", "--json"], home)
    try:
        report = json.loads(proc.stdout[proc.stdout.index("{"):])
    except ValueError:
        report = {}
    return proc.returncode, report, proc.stdout[-3000:] + proc.stderr[-3000:]


# Compact one seeded 48-message session through the agent (guarded when the home enables the
# guard) and print what came of it: the id kept, the live rows, the summary's tag, snapshots,
# the seams' states and the warnings the guard logged.
COMPACT = r'''
import json, logging, os, sys
from pathlib import Path
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

guarded = sys.argv[1] in ("guarded", "status")
home = Path(os.environ["HERMES_HOME"])
warnings = []
class Keep(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING and record.name.startswith("hermes_session_guard"):
            warnings.append(record.getMessage())
logging.getLogger("hermes_session_guard").addHandler(Keep())
with FakeLLMServer() as llm:
    probe.write_config(home, llm.base_url, plugin_enabled=guarded)
    runtime = None
    if guarded:
        probe.discover_guard()
        from hermes_session_guard.runtime import current_runtime
        runtime = current_runtime()
    if sys.argv[1] == "status":  # what install() did, no compaction
        print("DRIFT_RESULT " + json.dumps({"seams": {s.name: s.state for s in runtime.seams},
                                            "warnings": warnings}))
        raise SystemExit(0)
    sid = "20261201_100000_drift01"
    db = probe.open_db(home / "state.db")
    messages = probe.seed_messages()
    probe.seed_session(db, sid, messages)
    agent = probe.make_agent(db, llm.base_url, sid)
    probe.mark_flushed(agent, messages)
    error = ""
    try:
        out, _ = agent._compress_context(messages, "You are a test agent.", approx_tokens=150_000)
    except Exception as exc:
        out, error = messages, f"{type(exc).__name__}: {exc}"
    live = probe.live_messages(home / "state.db", sid)
    sessions = [r["id"] for r in probe.sessions_table(home / "state.db")]
    snaps = runtime.store_for(home / "state.db").list_snapshots(sid) if runtime else []
    print("DRIFT_RESULT " + json.dumps({
        "id_kept": agent.session_id == sid and sessions == [sid],
        "compacted": len(out) < len(messages), "rows": len(live), "returned": len(out),
        "summary": any("is_compressed_summary" in m for m in out if isinstance(m, dict)),
        "snapshots": len(snaps), "error": error,
        "seams": {s.name: s.state for s in runtime.seams} if runtime else {},
        "warnings": warnings,
        "origins": {name: getattr(sys.modules.get(name), "__file__", None) or ""
                    for name in ("hermes_cli", "agent", "gateway", "hermes_state")},
    }))
'''


def compact(python: Path, home: Path, mode: str) -> dict[str, Any]:
    """``mode``: ``guarded``, ``plain`` (the guard not enabled) or ``status`` (install only)."""
    home.mkdir(parents=True, exist_ok=True)
    proc = run(python, ["-c", COMPACT, mode], home)
    for line in proc.stdout.splitlines():
        if line.startswith("DRIFT_RESULT "):
            found: dict[str, Any] = json.loads(line.split(" ", 1)[1])
            return found
    raise AssertionError(f"no result (exit {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-4000:]}")


# -- the drift cases ---------------------------------------------------------------------------

# The promises selftest verifies (seams/verification.py PROMISES), in its order.
PROMISES = ("compaction", "summary tags", "buffered delivery")
# Each case: its edits (made when called: they read the release's files) and the promises
# selftest verifies after it on 0.20.1 and 0.22.2.
CASES: dict[str, tuple[Callable[[], dict[str, Edit]], tuple[str, ...]]] = {
    "a_version_only": (dict, PROMISES),
    "b_trailing_keyword": (lambda: {"agent/conversation_compression.py":
                                    add_trailing_keyword("compress_context", "drift_reason")}, PROMISES),
    "c_moved_and_reexported": (lambda: move_out("compress_context", "agent/conversation_compression.py",
                                                "agent/compaction_entry.py"), PROMISES),
    "d_renamed_throughout": (lambda: everywhere("gateway", "_promote_queued_event", "_promote_next_queued_event"),
                             ("compaction", "summary tags")),
    "e_commit_refuses_foreign_rows": (refuse_foreign_writes, ()),
}

# The host suite runs on a changed install as a pseudo-release ``<release>+<change>`` of
# scripts/matrix.py: the release's venv, changed by one case, verified by selftest.
PSEUDO_CHANGES = {"relabelled": "a_version_only", "trailing-kw": "b_trailing_keyword",
                  "moved": "c_moved_and_reexported", "renamed": "d_renamed_throughout"}


def pseudo_case(pseudo: str) -> str:
    """The drift case of a pseudo-release name such as ``0.22.2+relabelled``."""
    _, _, change = pseudo.partition("+")
    if change not in PSEUDO_CHANGES:
        raise SystemExit(f"error: unknown change {change!r} in {pseudo!r}; choose from {', '.join(PSEUDO_CHANGES)}")
    return PSEUDO_CHANGES[change]


def prepare(pseudo: str, venv: Path) -> int:
    """Make ``venv`` afresh: this release's install changed by ``pseudo``'s case; then run
    ``selftest`` there against an enabled home, so the install's verification record exists.
    Prints selftest's verdict per promise; returns its exit code."""
    import tempfile

    from hermes_session_guard.selftest import probe

    case = pseudo_case(pseudo)
    if venv.exists():
        shutil.rmtree(venv)
    python = make_venv(venv, CASES[case][0]())
    with tempfile.TemporaryDirectory(prefix="hsg-drift-home-") as tmp:
        home = Path(tmp) / "home"
        probe.write_config(home, "http://127.0.0.1:9/v1", plugin_enabled=True)
        code, report, tail = selftest(python, home)
    verification = report.get("verification", {})
    for promise in verification.get("promises", []):
        state = "verified" if promise.get("verified") else "NOT verified"
        print(f"{pseudo}: {promise.get('name')}: {state} ({str(promise.get('why', ''))[:300]})")
    print(f"{pseudo}: selftest exit {code}; record {verification.get('recorded') or 'NOT written'}")
    if not verification.get("recorded"):
        print(tail)
    return code


if __name__ == "__main__":  # python -m tests.integration.drift_host PSEUDO_RELEASE VENV (scripts/matrix.py)
    raise SystemExit(prepare(sys.argv[1], Path(sys.argv[2])))
