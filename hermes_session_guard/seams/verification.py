"""Verification per install: on a Hermes release outside the seam table, the seams that change
what Hermes does are patched only once ``selftest`` has verified them on that install.

``selftest`` runs its live probe in a sandbox process in **trial** mode (:data:`TRIAL_ENV`
names the probe's temporary home; nothing else turns it on): there the seams of every
:data:`PROMISES` entry get the rows :mod:`.capabilities` chooses. Each promise whose probe
checks pass, with every one of its seams patched (or not needed), is **verified**;
``selftest`` writes them, with the rows used, to one small JSON record for the install
(:func:`record_path`: beside the Python environment that runs Hermes, so every home and
profile using it is covered), keyed by the Hermes version, the guard version and a
fingerprint of the Hermes code those seams patch or lean on (:func:`fingerprint`).

Every later process on that install reads the record in ``install()``: when it matches, the
verified seams get the rows recorded (and nothing else that changes behaviour); when it is
missing or was made for other code (``hermes update``, an edited module), only the read-only
and display seams are patched, as without a record, and the one warning line says to run
``selftest`` again. Seams no probe check covers (:data:`UNCHECKED`) stay off on such releases.
ADR 0026 records the choices (where the record lives, who owns it, what the fingerprint covers).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..fail_open import failing_open
from ..file_modes import LinkRefused
from ..files import atomic_write_bytes
from ..hostinfo import GUARD_VERSION
from . import capabilities
from .row import SeamRow
from .table import fallback_rows, rows_for

log = logging.getLogger("hermes_session_guard")

TRIAL_ENV = "HERMES_SESSION_GUARD_TRIAL"  # the probe's temporary HERMES_HOME: trial mode in that process only
TRIAL_HOME_PREFIX = "session-guard-selftest-"
RECORD_NAME = "hermes-session-guard-verified.json"
RECORD_MODE = 0o644  # read by the service user that runs Hermes; holds versions, digests, names, a time


@dataclass(frozen=True)
class Promise:
    """A promise the live probe verifies: the probe checks that decide it (``parts``: a
    ``PROBE_CHECKS`` entry's name; ``checks``: a check's own name) and the seams that keep it."""

    name: str
    parts: tuple[str, ...]
    seams: tuple[str, ...]
    checks: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()


PROMISES: tuple[Promise, ...] = (
    Promise("compaction", ("id stable across compression", "snapshot", "audit", "lock", "doctor"),
            ("compression", "native_lock_reentry", "host_commit", "compaction_commit", "engine_compress_shim"),
            checks=("compression seam patched",)),
    Promise("summary tags", ("summary tagged and stripped",),
            ("summary_strip", "transcript_load", "resume_load", "wire", "request_tools", "system_prompt",
             "tool_session"), needs=("compaction",)),
    Promise("buffered delivery", ("buffered delivery",),
            ("gateway_turn", "gateway_message", "busy_message", "buffer_drain", "buffer_replay", "platform_delivery",
             "delivery_send_shim", "delivery_edit_shim", "delivery_draft_shim", "delivery_platform_send_shim"),
            needs=("compaction",)),
)
COMPACTION = PROMISES[0].name
# Seams that change what Hermes does and that no probe check covers yet: off on a release outside the table.
UNCHECKED: tuple[str, ...] = (
    "turn_order", "turn_history", "api_session_chat_turns", "api_session_chat_stream_turns",
    "api_chat_completions_turns", "api_responses_turns", "api_runs_turns", "tui_busy_interrupt",
    "cli_busy_interrupt", "tui_prompt_enqueue", "tui_prompt_drain", "toolset_keys", "agent_toolsets",
)
UNCHECKED_REASON = "no live probe check covers it yet"


def checked_seams() -> list[str]:
    return [seam for promise in PROMISES for seam in promise.seams]


# -- the fingerprint ------------------------------------------------------------------------

def guard_version() -> str:
    return GUARD_VERSION


def module_file(name: str) -> Path | None:
    """The source file of Hermes module ``name``, found without importing it (a top-level
    spec, then the package's search path); ``None`` when there is none."""
    top, _, rest = name.partition(".")
    with failing_open(f"locating {top}", "the module counts as absent", level=logging.DEBUG, advice=None) as failed:
        spec = importlib.util.find_spec(top)
    if failed or spec is None:
        return None
    if not rest:
        return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    for location in spec.submodule_search_locations or []:
        base = Path(location, *rest.split("."))
        for candidate in (base.with_name(base.name + ".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def fingerprinted_modules() -> list[str]:
    """Every Hermes module a row of a verified seam targets or leans on (all ranges)."""
    names: set[str] = set()
    for seam in checked_seams():
        for row in rows_for(seam):
            names.add(row.module)
            names.update(required.partition(":")[0] for required in row.requires)
    return sorted(name for name in names if name)


def fingerprint(host_version: str) -> str:
    """A digest of the Hermes code the verified seams patch: the version, this guard's version
    and the bytes of every module in :func:`fingerprinted_modules` (absent ones as absent).
    Stable across processes and homes; any edit to one of those files changes it."""
    digest = hashlib.sha256(f"hermes {host_version}\nguard {guard_version()}\n".encode())
    for name in fingerprinted_modules():
        path = module_file(name)
        content = b"absent"
        if path is not None:
            with failing_open(f"reading {path}", "counted as absent", level=logging.DEBUG, advice=None):
                content = hashlib.sha256(path.read_bytes()).hexdigest().encode()
        digest.update(name.encode() + b"\0" + content + b"\n")
    return digest.hexdigest()


# -- the record -------------------------------------------------------------------------------

def record_path() -> Path:
    """The install's record: in the Python environment Hermes runs from (``sys.prefix``)."""
    return Path(sys.prefix) / RECORD_NAME


def read_record(path: Path | None = None) -> dict[str, Any] | None:
    """The record, or ``None`` when there is none (or it is a link, or unreadable)."""
    path = path or record_path()
    with failing_open(f"reading {path}", "the install counts as not verified", level=logging.DEBUG,
                      advice=None) as failed:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise LinkRefused(f"{path} is a symbolic link; not read")
        found = json.loads(path.read_text(encoding="utf-8"))
    if failed or not isinstance(found, dict):
        return None
    return found


def write_record(record: dict[str, Any], path: Path | None = None) -> Path:
    """Write the record atomically (a fresh temporary file renamed over it: a link at the name
    is replaced, never followed), mode 0644, owned by the owner of its directory when run as
    root. Raises OSError when the environment is not writable."""
    path = path or record_path()
    parent = os.lstat(path.parent)
    if stat.S_ISLNK(parent.st_mode) or not stat.S_ISDIR(parent.st_mode):
        raise LinkRefused(f"{path.parent} is not a directory (a link?); nothing written")
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISLNK(os.lstat(path).st_mode):
            os.unlink(path)  # the link itself goes; what it points at is never touched
    # the directory counts as the "home" of the shared writer: a new record takes its owner as root
    atomic_write_bytes(path, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode(), mode=RECORD_MODE,
                       home=path.parent)
    return path


# -- what one process does -----------------------------------------------------------------

TRIAL, VERIFIED, UNVERIFIED = "trial", "verified", "unverified"


@dataclass
class Plan:
    """How this process treats the seams that change behaviour on a release outside the table."""

    mode: str
    rows: dict[str, str] = field(default_factory=dict)  # verified: seam -> the row's range, as recorded
    verified_at: str = ""
    problem: str = ""  # unverified: why
    _caps: capabilities.Capabilities | None = None

    def caps(self) -> capabilities.Capabilities:
        if self._caps is None:
            self._caps = capabilities.detect()
        return self._caps

    def candidates(self, seam: str) -> tuple[list[SeamRow], str] | None:
        """The rows ``seam`` may get and the reason to give, or ``None`` when it stays off."""
        if self.mode == TRIAL and seam in checked_seams():
            rows = capabilities.choose_rows(seam, fallback_rows(seam), self.caps())
            return rows, f"trial for selftest: row chosen by capabilities ({self.caps().describe()})"
        if self.mode == VERIFIED and seam in self.rows:
            rows = [row for row in rows_for(seam) if row.range_text == self.rows[seam]]
            return rows, f"verified on this install by selftest at {self.verified_at}"
        return None

    def note(self) -> str:
        if self.mode == VERIFIED:
            return f" Verified on this install by selftest at {self.verified_at}: {len(self.rows)} seams."
        if self.mode == TRIAL:
            return " Trial for selftest (this sandbox process only)."
        return (" Compaction is NOT protected here until `hermes-session-guard selftest` verifies this install "
                f"(run it again after `hermes update`): {self.problem}.")


def _trial_requested() -> bool:
    wanted = os.environ.get(TRIAL_ENV, "")
    home = os.environ.get("HERMES_HOME", "")
    return bool(wanted) and wanted == home and Path(home).name.startswith(TRIAL_HOME_PREFIX)


def plan_for(host_version: str) -> Plan:
    """This process's plan on a release outside the table."""
    if _trial_requested():
        return Plan(TRIAL)
    record = read_record()
    if record is None:
        return Plan(UNVERIFIED, problem=f"no verification recorded at {record_path()}")
    if record.get("hermes_version") != host_version or record.get("fingerprint") != fingerprint(host_version):
        return Plan(UNVERIFIED, problem=f"the verification recorded at {record.get('verified_at', '?')} was made "
                                        f"for other Hermes code (Hermes {record.get('hermes_version', '?')})")
    rows = record.get("rows")
    at = str(record.get("verified_at", "?"))
    if not isinstance(rows, dict) or not rows:
        return Plan(UNVERIFIED, problem=f"selftest at {at} verified no promise on this code")
    return Plan(VERIFIED, rows={str(k): str(v) for k, v in rows.items()}, verified_at=at)


# -- what selftest makes of the probe --------------------------------------------------------

@dataclass(frozen=True)
class PromiseResult:
    name: str
    verified: bool
    why: str


def evaluate(probe: dict[str, Any]) -> list[PromiseResult]:
    """Per promise (and for the seams no check covers): verified or not, and why."""
    checks: list[dict[str, Any]] = probe.get("checks", [])
    seams = {s.get("name"): s for s in probe.get("seams", [])}
    results: dict[str, PromiseResult] = {}
    for promise in PROMISES:
        mine = [c for c in checks if c.get("part") in promise.parts or c.get("name") in promise.checks]
        failed = [c for c in mine if not c.get("ok")]
        off = [f"{name} {seams[name].get('state')} ({seams[name].get('reason')})" for name in promise.seams
               if name in seams and seams[name].get("state") not in ("patched", "not-needed")]
        missing = [name for name in promise.needs if not results.get(name, PromiseResult(name, False, "")).verified]
        if not mine:
            why = "the live probe did not reach its checks" + (f": {probe['error']}" if probe.get("error") else "")
        elif failed:
            why = "; ".join(f"{c['name']}: {c.get('detail') or 'failed'}" for c in failed)
        elif off:
            why = "seams not patched: " + "; ".join(off)
        elif missing:
            why = f"needs {', '.join(missing)}"
        else:
            why = f"{len(mine)} checks passed with {len(promise.seams)} seams"
        results[promise.name] = PromiseResult(promise.name, bool(mine) and not failed and not off and not missing,
                                              why)
    return list(results.values())


def unchecked_result() -> PromiseResult:
    return PromiseResult("turn order and CLI/TUI holds", False,
                         f"{UNCHECKED_REASON} ({', '.join(UNCHECKED)}); left off on this release")


def record_for(probe: dict[str, Any], results: list[PromiseResult]) -> dict[str, Any]:
    """The record for the promises verified (their seams' rows as the probe applied them)."""
    verified = [r.name for r in results if r.verified]
    seams = {s.get("name"): s for s in probe.get("seams", [])}
    rows = {name: str(seams[name].get("row", "")) for p in PROMISES if p.name in verified for name in p.seams
            if name in seams and seams[name].get("row")}
    return {"hermes_version": probe.get("host_version"), "guard_version": guard_version(),
            "fingerprint": probe.get("fingerprint"), "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "promises": verified, "rows": rows, "capabilities": probe.get("capabilities", "")}
