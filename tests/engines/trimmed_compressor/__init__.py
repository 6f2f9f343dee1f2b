"""Test context engine (1): a subclass of Hermes's built-in ``ContextCompressor``
that changes one step: ``_generate_summary`` appends a closing line to the summary
Hermes's own model call wrote. Everything else (the summary prefix, head/tail
protection, token accounting, boundary callbacks) is the built-in's."""

from __future__ import annotations

from typing import Any

from agent.context_compressor import ContextCompressor

ENGINE_NAME = "trimmed-compressor"
CLOSING_LINE = "(summary kept short by trimmed-compressor)"


class TrimmedCompressor(ContextCompressor):
    #: Tests set this (on the class: 0.18.2+ deep-copy the engine per agent) to a
    #: callable run inside the changed step, while the compression is in flight.
    observer: Any = None

    @property
    def name(self) -> str:
        return ENGINE_NAME

    def _generate_summary(self, turns_to_summarize: Any, *args: Any, **kwargs: Any) -> Any:
        observer = type(self).observer
        if observer is not None:
            observer(self)
        summary = super()._generate_summary(turns_to_summarize, *args, **kwargs)
        return f"{summary}\n{CLOSING_LINE}" if isinstance(summary, str) and summary else summary


def register(ctx: Any) -> None:
    ctx.register_context_engine(TrimmedCompressor(model="", quiet_mode=True, config_context_length=128_000))
