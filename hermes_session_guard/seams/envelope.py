"""The one place a seam's failure policy is applied: every wrapper the table installs runs
inside :func:`enveloped`, which handles an unexpected error of the guard's own code by the
row's ``failure_policy`` (ADR 0008).

The wrapper gets Hermes's call as its ``wrapped``, through a :class:`Hermes` that records
whether it ran, what it returned and what it raised. An exception that came out of Hermes's
call passes through untouched, whatever the policy. Any other ``Exception`` is the guard's:

* ``open``: one ERROR line (:func:`~hermes_session_guard.fail_open.report`, the guard's one
  shape), then Hermes's result: the one its call already returned, or its call made now,
  unguarded, if the wrapper had not made it yet. Hermes is never called twice.
* ``closed``: one ERROR line (``failing closed``) and the error propagates: the guarded
  action is refused.

A wrapper whose refusal is more than an error (the compression seam skips the compression or
steps aside; ``wire`` refuses only a request that carries the guard's keys) names it with
:func:`fails_as` (``refuse=``), which then says the one line itself. ``fails_as`` also gives
the consequence the line names. A ``BaseException`` that is not an ``Exception``
(``KeyboardInterrupt``, ``asyncio.CancelledError``) is never intercepted.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..fail_open import report
from ..seam_behaviour import FailurePolicy
from .row import SeamRow, Wrapper

W = TypeVar("W", bound=Callable[..., Any])


class Hermes:
    """Hermes's own call, handed to a wrapper as its ``wrapped``: calling it calls Hermes
    (an async call: the coroutine that awaits it), and the envelope learns whether it
    ran, its result and the exception it raised."""

    __slots__ = ("call", "is_async", "ran", "result", "raised")

    def __init__(self, call: Callable[..., Any], is_async: bool) -> None:
        self.call, self.is_async = call, is_async
        self.ran, self.result = False, None
        self.raised: BaseException | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.is_async:
            return self._awaited(args, kwargs)
        self.ran = True
        try:
            self.result = self.call(*args, **kwargs)
        except BaseException as exc:  # Hermes's own error: recorded so the envelope lets it pass, then raised
            self.raised = exc
            raise
        return self.result

    async def _awaited(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.ran = True
        try:
            self.result = await self.call(*args, **kwargs)
        except BaseException as exc:  # as in __call__
            self.raised = exc
            raise
        return self.result


def unguarded(wrapped: Any) -> Any:
    """Hermes's own callable behind a wrapper's ``wrapped`` (for reading its signature)."""
    return wrapped.call if isinstance(wrapped, Hermes) else wrapped


Refusal = Callable[[Exception, Hermes, Any, tuple[Any, ...], dict[str, Any]], Any]


@dataclass(frozen=True)
class Failure:
    """What a guard error inside one wrapper means: the consequence its line names, the
    refusal that replaces the policy's default (it says its own line), whether repeats of
    one error are said at DEBUG (a hot path), and the command the line points at."""

    consequence: str
    refuse: Refusal | None = None
    once: bool = False
    advice: str = "selftest"


_FAILURE = "session_guard_failure"
_CALL_NOW = object()  # failed(): Hermes's call was not made yet; make it now, unguarded
_DEFAULT = {FailurePolicy.OPEN: "Hermes runs this call as it would without the guard",
            FailurePolicy.CLOSED: "this call is refused"}


def fails_as(consequence: str, *, refuse: Refusal | None = None, once: bool = False,
             advice: str = "selftest") -> Callable[[W], W]:
    """Name what a guard error in the decorated wrapper means (see the module docstring)."""

    def mark(wrapper: W) -> W:
        vars(wrapper)[_FAILURE] = Failure(consequence, refuse, once, advice)
        return wrapper

    return mark


def _failure_of(row: SeamRow, inner: Any) -> Failure:
    said = getattr(inner, "__dict__", {}).get(_FAILURE)
    if isinstance(said, Failure):
        return said
    return Failure(_DEFAULT.get(row.failure_policy, _DEFAULT[FailurePolicy.OPEN]))


def enveloped(row: SeamRow, inner: Wrapper) -> Wrapper:
    """``inner`` (a row's wrapper) with the row's failure policy applied around it."""
    failure = _failure_of(row, inner)

    def failed(exc: Exception, hermes: Hermes, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Called outside the ``except`` clause, so Hermes's exceptions keep their own context."""
        if hermes.raised is not None:
            raise hermes.raised  # Hermes's error (or one the guard raised while it propagated): Hermes's
        if failure.refuse is not None:
            return failure.refuse(exc, hermes, instance, args, kwargs)
        if row.failure_policy is FailurePolicy.CLOSED:
            report(row, exc, failure.consequence, once=failure.once, advice=failure.advice, failing="closed")
            raise exc
        report(row, exc, failure.consequence, once=failure.once, advice=failure.advice)
        return hermes.result if hermes.ran else _CALL_NOW

    if inspect.iscoroutinefunction(inner):

        async def async_envelope(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            hermes = Hermes(wrapped, is_async=True)
            try:
                return await inner(hermes, instance, args, kwargs)
            except Exception as exc:  # noqa: BLE001  # the envelope: decided in failed(), outside the clause
                error = exc
            fallback = failed(error, hermes, instance, args, kwargs)
            return await wrapped(*args, **kwargs) if fallback is _CALL_NOW else fallback

        return async_envelope

    def envelope(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        hermes = Hermes(wrapped, is_async=False)
        try:
            return inner(hermes, instance, args, kwargs)
        except Exception as exc:  # noqa: BLE001  # the envelope: decided in failed(), outside the clause
            error = exc
        fallback = failed(error, hermes, instance, args, kwargs)
        return wrapped(*args, **kwargs) if fallback is _CALL_NOW else fallback

    return envelope
