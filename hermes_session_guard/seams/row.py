"""One row of the seam table: a Hermes target, the version range it covers, the wrapper
that patches it, what it leans on, its failure policy and its typed behaviour."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..hostinfo import Version
from ..runtime import Runtime
from ..seam_behaviour import Behaviour, Effect, FailurePolicy, SeamKind

Wrapper = Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]


@dataclass(frozen=True)
class SeamRow:
    seam: str
    since: Version
    until: Version
    module: str
    attribute: str
    params: tuple[str, ...]
    wrapper: Callable[[Runtime, SeamRow], Wrapper] | None
    failure_policy: FailurePolicy
    behaviour: Behaviour = field(default_factory=Behaviour)
    note: str = ""
    lazy: bool = False  # patch when Hermes imports the module; never import it for that
    requires: tuple[str, ...] = ()
    kind: SeamKind = SeamKind.WRAP
    # an instance shim: the function that gives host objects their per-instance attribute
    applied_by: Callable[..., Any] | None = None
    # ``observe`` rows (read-only, display) may be patched on a release newer than the table
    effect: Effect = Effect.CHANGES

    def __post_init__(self) -> None:
        # the table is written with plain words; the row holds the typed values
        object.__setattr__(self, "failure_policy", FailurePolicy(self.failure_policy))
        object.__setattr__(self, "behaviour", Behaviour.of(self.behaviour))
        object.__setattr__(self, "kind", SeamKind(self.kind))
        object.__setattr__(self, "effect", Effect(self.effect))

    @property
    def target(self) -> str:
        return f"{self.module}:{self.attribute}"

    @property
    def patches(self) -> bool:
        """The row changes the host: it wraps its target, or shims instances of it."""
        return self.wrapper is not None or self.kind is SeamKind.INSTANCE_SHIM

    def covers(self, version: Version) -> bool:
        return self.since <= version < self.until

    @property
    def range_text(self) -> str:
        return f">={version_text(self.since)},<{version_text(self.until)}"


def version_text(version: Version) -> str:
    return ".".join(map(str, version))


def call_arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    """Argument ``name`` of a wrapped call, passed by keyword or at position ``index``; None if absent."""
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else None


def agent_call(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    """The agent of a method seam (``instance``) or of a module function taking it first (0.21+),
    and the positional arguments after it."""
    if instance is not None:
        return instance, args
    return (args[0], args[1:]) if args else (kwargs.get("agent"), ())


class HostCall:
    """Hermes's own call, made when the guard's logic makes it (at most once): ``ran`` says
    whether it was (an error after that is Hermes's, not the guard's), ``result`` what it returned."""

    def __init__(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.call, self.args, self.kwargs = call, args, kwargs
        self.ran, self.result = False, None

    def __call__(self) -> Any:
        self.ran = True
        self.result = self.call(*self.args, **self.kwargs)
        return self.result
