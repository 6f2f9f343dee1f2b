"""The installed Hermes release's compression rules, read from its wheel.

``doctor``'s config findings and ``status``'s figures compare a home's config.yaml
against these (defaults, context-length table, threshold functions, the gateway's
hygiene threshold); they import Hermes here, never themselves.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..fail_open import failing_open
from ..hostinfo import installed_version

FALLBACK_HYGIENE_PERCENT = 0.85


@dataclass
class HostRules:
    """What the installed Hermes release decides, read from its wheel."""

    version: str | None
    defaults: dict[str, Any]
    hygiene_percent: float
    minimum_context: int
    context_table: dict[str, int] = field(default_factory=dict)
    summary_ceiling: int = 12_000
    # (context_length, percent) -> effective percent (0.19's small-window floor; identity before it)
    effective_percent: Callable[[int, float], float] = lambda _ctx, pct: pct
    # (context_length, percent) -> threshold in tokens
    threshold_tokens: Callable[[int, float], int] | None = None
    custom_providers: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None
    cached_context: Callable[[str, str], int | None] | None = None

    def threshold(self, context_length: int, percent: float) -> int:
        pct = self.effective_percent(context_length, percent)
        if self.threshold_tokens is not None:
            return int(self.threshold_tokens(context_length, pct))
        return max(int(context_length * pct), self.minimum_context)


def _hygiene_percent_from_source() -> float:
    """``_hyg_threshold_pct = 0.85`` as gateway/run.py sets it (read, not imported)."""
    try:
        spec = importlib.util.find_spec("gateway.run")
        origin = spec.origin if spec else None
        if origin:
            text = Path(origin).read_text(encoding="utf-8", errors="replace")
            match = re.search(r"_hyg_threshold_pct\s*=\s*([0-9.]+)", text)
            if match:
                return float(match.group(1))
    except (ImportError, OSError, ValueError):
        pass
    return FALLBACK_HYGIENE_PERCENT


def load_host_rules() -> HostRules | None:
    """The installed release's rules, or None when Hermes cannot be imported here."""
    with failing_open("importing Hermes's config, model metadata and compressor", "the release's rules are unknown",
                      level=logging.DEBUG, advice=None) as failed:
        hconfig = importlib.import_module("hermes_cli.config")
        metadata = importlib.import_module("agent.model_metadata")
        compressor = importlib.import_module("agent.context_compressor")
    if failed:
        return None
    cls = getattr(compressor, "ContextCompressor", None)
    rules = HostRules(
        version=installed_version(),
        defaults=copy.deepcopy(getattr(hconfig, "DEFAULT_CONFIG", {})),
        hygiene_percent=_hygiene_percent_from_source(),
        minimum_context=int(getattr(metadata, "MINIMUM_CONTEXT_LENGTH", 64_000)),
        context_table=dict(getattr(metadata, "DEFAULT_CONTEXT_LENGTHS", {})),
        summary_ceiling=int(getattr(compressor, "_SUMMARY_TOKENS_CEILING", 12_000)),
    )
    effective = getattr(cls, "_effective_threshold_percent", None)
    if callable(effective):
        rules.effective_percent = lambda ctx, pct: float(effective(ctx, pct))
    compute = getattr(cls, "_compute_threshold_tokens", None)
    if callable(compute):
        rules.threshold_tokens = lambda ctx, pct: int(compute(ctx, pct))
    gcp = getattr(hconfig, "get_compatible_custom_providers", None)
    if callable(gcp):
        rules.custom_providers = lambda cfg: list(gcp(cfg) or [])
    cached = getattr(metadata, "get_cached_context_length", None)
    if callable(cached):
        rules.cached_context = lambda model, url: cached(model, url)
    return rules
