"""The ``session_guard:`` section of Hermes's config.yaml, validated.

Every option has a default, so an absent section means "guard on, defaults".
A bad value of any option but ``enabled`` (wrong type, out of bounds, not finite,
an unknown key, a sub-section that is not a mapping) does not switch the guard
off: that option keeps its default and the problem is recorded in
``GuardConfig.fallbacks`` (logged as a WARNING by ``install``, reported by
``doctor`` and ``selftest``). Only ``enabled: false`` switches the guard off; a
bad ``enabled`` value, a ``session_guard:`` that is not a mapping and a
config.yaml that cannot be read raise :class:`ConfigError` naming the dotted key,
which callers turn into one log line and a disabled guard, never a crash of the host.
"""

from __future__ import annotations

import os
import reprlib
import stat
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A ``session_guard`` option is invalid. ``key`` is the dotted path."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"session_guard.{key}: {message}")
        self.key = f"session_guard.{key}"


@dataclass(frozen=True)
class OptionFallback:
    """One option of config.yaml that could not be used: the guard runs with its default.

    ``key`` is the dotted path (``session_guard.lock.wait_seconds``), ``value`` the
    offending value as written (shortened), ``default`` the value used instead
    (``None`` for an unknown key, which is ignored)."""

    key: str
    value: str
    problem: str
    default: Any = None
    unknown: bool = False

    def describe(self) -> str:
        if self.unknown:
            return f"{self.key} = {self.value} ignored: {self.problem}"
        return f"{self.key} = {self.value} is invalid ({self.problem}); using the default {_show(self.default)}"

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "problem": self.problem,
                "default": None if self.unknown else _plain(self.default), "unknown": self.unknown}


_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxdict, _SHOW.maxlist, _SHOW.maxstring, _SHOW.maxother = 2, 4, 4, 200, 200


def _show(value: Any) -> str:
    """``value`` for a message, at most 60 characters: built from a bounded view
    (:mod:`reprlib`), so a huge or deeply shared value (YAML aliases) is never
    rendered whole."""
    text = _SHOW.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _plain(value: Any) -> Any:
    if is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    return value


_INTERNAL = {"internal": True}


@dataclass(frozen=True)
class LockConfig:
    wait_seconds: float = 2.0
    lease_seconds: float = 30.0  # kept alive while held; a crashed holder on this machine is taken over at once


@dataclass(frozen=True)
class TurnsConfig:
    """Turns of one session run one at a time, in arrival order (see turn_lock)."""

    enabled: bool = True
    wait_seconds: float = 120.0  # how long a turn waits for the turns/compression before it
    lease_seconds: float = 60.0  # cross-process turn lease (refreshed while the turn runs)


@dataclass(frozen=True)
class BufferConfig:
    enabled: bool = True
    max_messages: int = 0  # 0 = unbounded; above it a message is refused (told to the sender), never dropped
    receipt: bool = True
    receipt_text: str = "Queued while I compact the conversation; I will answer in order."
    overflow_text: str = (
        "Not queued: {waiting} messages are already waiting while I compact the conversation "
        "(limit {limit}). Please send it again after I have answered them."
    )


@dataclass(frozen=True)
class SummariesConfig:
    visible: str = "false"  # "false" | "tagged"
    recall_header: bool = True


@dataclass(frozen=True)
class RecallConfig:
    enabled: bool = True  # offer session_guard_recall (and its system-prompt rule) to compacted sessions
    max_chars: int = 8000


@dataclass(frozen=True)
class HandoffConfig:
    enabled: bool = False
    after_compressions: int = 3
    max_auto_handoffs: int = 1
    mode: str = "prompt_user"  # "prompt_user" | "fresh_session"
    artifact_dir: str = "handoffs"


@dataclass(frozen=True)
class AuditConfig:
    path: str = "logs/session_guard.jsonl"


@dataclass(frozen=True)
class EventsConfig:
    chat_status: bool = True  # a status line in the chat when a platform gateway's session compacts
    # /v1/chat/completions streams: the guard's `event: hermes.tool.progress` records (which the
    # `openai` SDK yields as chunks without choices) instead of an SSE comment line. Opt-in.
    chat_completions_records: bool = False


@dataclass(frozen=True)
class GuardConfig:
    enabled: bool = True
    lock: LockConfig = field(default_factory=LockConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    summaries: SummariesConfig = field(default_factory=SummariesConfig)
    recall: RecallConfig = field(default_factory=RecallConfig)
    handoff: HandoffConfig = field(default_factory=HandoffConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    turns: TurnsConfig = field(default_factory=TurnsConfig)
    events: EventsConfig = field(default_factory=EventsConfig)
    # Options config.yaml set to an unusable value, each replaced by its default (not an option itself).
    fallbacks: tuple[OptionFallback, ...] = field(default=(), compare=False, repr=False, metadata=_INTERNAL)


_CHOICES: dict[str, tuple[str, ...]] = {
    "summaries.visible": ("false", "tagged"),
    "handoff.mode": ("prompt_user", "fresh_session"),
}
_TEMPLATES: dict[str, tuple[str, ...]] = {
    "buffer.overflow_text": ("waiting", "limit"),
}
_MINIMUMS: dict[str, float] = {
    "lock.wait_seconds": 0,
    "lock.lease_seconds": 1,
    "turns.wait_seconds": 0,
    "turns.lease_seconds": 5,
    "buffer.max_messages": 0,
    "recall.max_chars": 200,
    "handoff.after_compressions": 1,
    "handoff.max_auto_handoffs": 0,
}


# Upper bounds: a value above them is a typo or an attempt to switch a limit off by
# "infinity", and would overflow the clocks and timeouts it feeds (a wait of 1e10 s
# overflows threading's timeout). Numbers without an entry here are bounded by
# _DEFAULT_MAXIMUM; every number must be finite (NaN and infinities are refused).
_MAXIMUMS: dict[str, float] = {
    "lock.wait_seconds": 600,
    "lock.lease_seconds": 3600,
    "buffer.max_messages": 100_000,
    "recall.max_chars": 1_000_000,
    "handoff.after_compressions": 10_000,
    "handoff.max_auto_handoffs": 10_000,
}
_DEFAULT_MAXIMUM = 1_000_000_000


def numeric_problem(key: str, value: float) -> str | None:
    """Why a numeric option's value is unusable (None if it is fine)."""
    import math

    if not math.isfinite(value):
        return "must be a finite number (not NaN or infinity)"
    if key in _MINIMUMS and value < _MINIMUMS[key]:
        return f"must be >= {_MINIMUMS[key]:g}"
    limit = _MAXIMUMS.get(key, _DEFAULT_MAXIMUM)
    if value > limit:
        return f"must be <= {limit:g}"
    return None


def relative_path_problem(value: str) -> str | None:
    """Why ``value`` cannot name a directory inside ``HERMES_HOME`` (``None`` if it can).

    Checked with both POSIX and Windows rules, so a config file moved between
    machines cannot smuggle in ``C:\\...``, ``\\\\server\\share`` or ``..``."""
    from pathlib import PurePosixPath, PureWindowsPath

    if not value.strip():
        return "must not be empty"
    if "\x00" in value:
        return "must not contain NUL"
    for pure in (PurePosixPath(value), PureWindowsPath(value)):
        if pure.is_absolute() or pure.anchor:
            return "must be relative to HERMES_HOME, not an absolute path"
        if ".." in pure.parts:
            return "must stay inside HERMES_HOME (no '..')"
    return None


def audit_path_problem(value: str) -> str | None:
    """Why ``value`` cannot name the audit log (``None`` if it can): a path relative to
    ``HERMES_HOME`` without ``..`` (checked like :func:`relative_path_problem`), or an
    absolute path on this machine (documented; ``doctor`` reports it, since the home's
    protections do not reach it)."""
    if value.strip() and "\x00" not in value and Path(value).is_absolute():
        return None
    return relative_path_problem(value)


def _coerce(key: str, expected: type, value: Any) -> Any:
    if expected is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, f"expected true or false, got {_show(value)}")
    if expected is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected a whole number, got {_show(value)}")
    elif expected is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(key, f"expected a number, got {_show(value)}")
        value = float(value)
    elif expected is str:
        if key == "summaries.visible" and isinstance(value, bool):
            value = "tagged" if value else "false"
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {_show(value)}")
    if key in _CHOICES and value not in _CHOICES[key]:
        raise ConfigError(key, f"must be one of {', '.join(_CHOICES[key])}; got {_show(value)}")
    if key in _TEMPLATES:
        try:
            value.format(**{name: 1 for name in _TEMPLATES[key]})
        except (KeyError, IndexError, ValueError) as exc:
            fields_ = ", ".join("{" + n + "}" for n in _TEMPLATES[key])
            raise ConfigError(key, f"may only use the placeholders {fields_} ({exc}); got {_show(value)}") from None
    # the numbers' bounds, and the one path option (the keys of these checks and of the templates are apart)
    problem = numeric_problem(key, value) if expected in (int, float) else None
    if key == "handoff.artifact_dir":
        problem = relative_path_problem(value)
    elif key == "audit.path":
        problem = audit_path_problem(value)
    if problem:
        raise ConfigError(key, f"{problem}; got {_show(value)}")
    return value


def _options(cls: type) -> dict[str, Any]:
    return {f.name: f for f in fields(cls) if not f.metadata.get("internal")}


def _build(cls: type, raw: Any, prefix: str, fallbacks: list[OptionFallback]) -> Any:
    """``cls`` from ``raw``; an unusable value keeps its default and is added to ``fallbacks``.
    Only the top-level ``enabled`` (and a top level that is not a mapping) raises."""
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        where = prefix.rstrip(".") or "(section)"
        problem = f"expected a mapping, got {type(raw).__name__}"
        if not prefix:
            raise ConfigError(where, problem)
        fallbacks.append(OptionFallback(f"session_guard.{where}", _show(raw), problem, cls()))
        return cls()
    known = _options(cls)
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        key = f"{prefix}{name}"
        f = known.get(name) if isinstance(name, str) else None
        if f is None:
            fallbacks.append(OptionFallback(f"session_guard.{key}", _show(value),
                                            f"unknown option (known: {', '.join(known)})", unknown=True))
            continue
        default = f.default if f.default is not MISSING else f.default_factory()
        if is_dataclass(default):
            kwargs[name] = _build(type(default), value, f"{key}.", fallbacks)
            continue
        try:
            kwargs[name] = _coerce(key, type(default), value)
        except ConfigError as exc:
            if key == "enabled":  # the one switch: a guess either way could betray the user's intent
                raise
            problem = str(exc).split(": ", 1)[-1].rsplit("; got ", 1)[0].rsplit(", got ", 1)[0]
            fallbacks.append(OptionFallback(exc.key, _show(value), problem, default))
    return cls(**kwargs)


def parse_config(raw: Any) -> GuardConfig:
    """Validate the raw ``session_guard`` mapping (``None`` means defaults). Unusable
    options keep their defaults and are listed in the result's ``fallbacks``."""
    fallbacks: list[OptionFallback] = []
    config: GuardConfig = _build(GuardConfig, raw, "", fallbacks)
    return replace(config, fallbacks=tuple(fallbacks)) if fallbacks else config


# config.yaml is read only when it is a regular file of at most MAX_CONFIG_BYTES (a FIFO
# or a device would block or never end; Hermes's own, comments included, is a few KB),
# and parsed only when its aliases expand to at most MAX_YAML_NODES nodes (a "billion
# laughs" document is a few lines that expand to billions).
MAX_CONFIG_BYTES = 256 * 1024
MAX_YAML_NODES = 100_000


def read_config_bytes(path: Path, *, follow: bool = True) -> tuple[bytes, os.stat_result] | None:
    """The bytes of ``path`` and its ``fstat`` (``None`` when there is no file), opened
    without blocking (a FIFO is refused at once, never waited on) and without following
    a link when ``follow`` is false. Raises :class:`ConfigError` (key ``(file)``)."""
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError("(file)", f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError("(file)", f"{path} is not a regular file (a FIFO, device or directory); "
                                        "config.yaml must be a plain file")
        if st.st_size > MAX_CONFIG_BYTES:
            raise ConfigError("(file)", f"{path} is {st.st_size} bytes, more than the {MAX_CONFIG_BYTES} a "
                                        "config.yaml may have here")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_CONFIG_BYTES and (chunk := os.read(fd, 1 << 16)):
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_CONFIG_BYTES:
            raise ConfigError("(file)", f"{path} grew past the {MAX_CONFIG_BYTES} bytes a config.yaml may have here")
    except OSError as exc:
        raise ConfigError("(file)", f"cannot read {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    return b"".join(chunks), st


def _expanded_nodes(node: Any) -> int:
    """How many nodes ``node`` stands for once every alias is expanded, counted without
    expanding (each node's count computed once); stops past :data:`MAX_YAML_NODES`."""
    counts: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(node, False)]
    while stack:
        current, done = stack.pop()
        key = id(current)
        if key in counts and not done:
            continue
        value = current.value if isinstance(current.value, list) else []
        children = [c for pair in value for c in (pair if isinstance(pair, tuple) else (pair,))]
        if done:
            counts[key] = min(MAX_YAML_NODES + 1, 1 + sum(counts.get(id(c), 0) for c in children))
            continue
        counts[key] = 0  # in progress: a recursive alias counts as nothing more
        stack.append((current, True))
        stack.extend((c, False) for c in children if id(c) not in counts)
    return counts[id(node)]


def load_yaml(text: str, path: Path) -> Any:
    """``text`` (a config.yaml) as PyYAML's safe loader builds it, refused (:class:`ConfigError`,
    key ``(file)``) when it is not valid YAML or its aliases expand past :data:`MAX_YAML_NODES`."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        if node is not None and _expanded_nodes(node) > MAX_YAML_NODES:
            raise ConfigError("(file)", f"{path} expands to more than {MAX_YAML_NODES} values through YAML "
                                        "aliases (&anchor / *alias); refused")
        return loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError("(file)", f"{path} is not valid YAML ({problem}{where})") from exc
    finally:
        loader.dispose()


def read_config_file(path: Path) -> Any:
    """config.yaml at ``path`` parsed (``None`` when absent), within the bounds above."""
    found = read_config_bytes(path)
    if found is None:
        return None
    try:
        text = found[0].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError("(file)", f"{path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                                    f"{exc.start}); save it as UTF-8") from exc
    return load_yaml(text.removeprefix("\ufeff"), path)


def load_config(hermes_home: Any) -> GuardConfig:
    """Read ``session_guard:`` from ``<hermes_home>/config.yaml``."""
    data = read_config_file(Path(hermes_home) / "config.yaml")
    if not isinstance(data, dict):
        return GuardConfig()
    return parse_config(data.get("session_guard"))
