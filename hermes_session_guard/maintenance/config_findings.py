"""The home's compression configuration checked against the running Hermes release's own rules.

Why a session keeps compressing, or why a compression takes 30-55 s or times out,
is mostly configuration (the operator's side of the bug report): the auxiliary
compression model is unset or has a smaller window than the main model's
threshold, ``auxiliary.compression.timeout`` is still Hermes's 120 s default,
a custom provider has no ``context_length``, compression was switched off, or
the thresholds leave no room for a compaction to get under them.

The rules come from the installed wheel, not from copies: ``DEFAULT_CONFIG``
(hermes_cli/config.py), the threshold arithmetic of
``agent.context_compressor.ContextCompressor`` (with 0.19's small-window floor
where the release has it), ``MINIMUM_CONTEXT_LENGTH`` and the offline context
table of ``agent.model_metadata``, custom providers as
``get_compatible_custom_providers`` lists them, and the gateway's session
hygiene percentage as ``gateway/run.py`` sets it. Nothing here calls a network:
a context window is taken from the config, Hermes's on-disk context cache or its
built-in table, and is "unknown" otherwise.

Every finding is a warning with a signature, the config key, a one-line fix and
the config lines to paste. ``doctor`` prints them; they fail it only with ``--strict``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ConfigError, OptionFallback, parse_config, read_config_file
from ..fail_open import failing_open
from ..host.rules import HostRules, load_host_rules

RECOMMENDED_TIMEOUT = 300  # seconds; the value Hermes's own PR raised the default to, and seed 001's advice
# A compaction that ends above this share of the threshold leaves no room for the next turns.
ROOM_FRACTION = 0.9

# The lines seed 001 recommends, per signature (YAML to merge into config.yaml).
SEED_LINES: dict[str, str] = {
    "compression_disabled": "compression:\n  enabled: true",
    "aux_compression_model_unset": (
        "auxiliary:\n  compression:\n    provider: <provider>\n    model: <model whose window is at least the main "
        "model's>\n    context_length: <that model's window in tokens>\n    timeout: 300"
    ),
    "aux_compression_window_too_small": (
        "auxiliary:\n  compression:\n    model: <model whose window is at least the main model's>\n"
        "    context_length: <that model's window in tokens>"
    ),
    "aux_compression_window_unknown": "auxiliary:\n  compression:\n    context_length: <the model's window in tokens>",
    "aux_compression_timeout_low": "auxiliary:\n  compression:\n    timeout: 300   # 300 or 600 for large summaries",
    "custom_provider_no_context_length": (
        "custom_providers:\n  - name: <name>\n    base_url: <url>\n    models:\n      <model>:\n"
        "        context_length: <the model's real window in tokens>"
    ),
    "threshold_above_hygiene": "compression:\n  threshold: 0.50",
    "protected_exceeds_budget": "compression:\n  protect_first_n: 3\n  protect_last_n: 20",
    "guard_option_invalid": "session_guard:\n  <section>:\n    <option>: <a valid value, or remove the line>",
    "turns_isolated": "plugins:\n  enabled: [session-guard]   # and no isolation: key\ndashboard:\n"
                      "  turn_isolation: false",
    "audit_path_outside_home": "session_guard:\n  audit:\n    path: logs/session_guard.jsonl",
}
_OFF = {"", "none", "off", "false", "no", "0", "disabled"}


@dataclass(frozen=True)
class ConfigFinding:
    signature: str
    key: str
    detail: str
    fix: str
    config_lines: str

    def as_dict(self) -> dict[str, Any]:
        return {"signature": self.signature, "key": self.key, "detail": self.detail, "fix": self.fix,
                "config_lines": self.config_lines, "severity": "warning"}


# -- reading the config -----------------------------------------------------------------
def merge_defaults(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge_defaults(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def read_config(home: Path) -> dict[str, Any]:
    """The home's config.yaml as a dict ({} when absent). Raises ValueError naming the file."""
    path = home / "config.yaml"
    try:
        data = read_config_file(path)
    except ConfigError as exc:
        raise ValueError(str(exc).split(": ", 1)[-1]) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a mapping at the top level")
    return data


def config_section(cfg: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    node: Any = cfg
    for key in keys:
        node = node.get(key) if isinstance(node, Mapping) else None
    return dict(node) if isinstance(node, Mapping) else {}


def _int(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def option_float(value: Any, default: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _truthy(value: Any) -> bool:
    """As the gateway reads ``compression.enabled``."""
    return str(value).lower() in {"true", "1", "yes"}


@dataclass
class ModelView:
    model: str
    base_url: str
    provider: str
    context_length: int | None
    source: str  # where the window came from


def _table_context(rules: HostRules, model: str) -> int | None:
    lower = model.lower()
    for name, length in sorted(rules.context_table.items(), key=lambda kv: len(kv[0]), reverse=True):
        if name in lower:
            return int(length)
    return None


def _custom_context(providers: list[dict[str, Any]], model: str, base_url: str) -> int | None:
    url = (base_url or "").rstrip("/")
    for entry in providers:
        if not isinstance(entry, dict) or (entry.get("base_url") or "").rstrip("/") != url or not url:
            continue
        models = entry.get("models")
        per_model = models.get(model) if isinstance(models, dict) else None
        if isinstance(per_model, dict) and _int(per_model.get("context_length")):
            return _int(per_model.get("context_length"))
        if _int(entry.get("context_length")) and (not model or entry.get("model") in (None, "", model)):
            return _int(entry.get("context_length"))
    return None


def _window(rules: HostRules, providers: list[dict[str, Any]], model: str, base_url: str,
            explicit: Any) -> tuple[int | None, str]:
    if _int(explicit):
        return _int(explicit), "config"
    found = _custom_context(providers, model, base_url)
    if found:
        return found, "custom_providers"
    if rules.cached_context is not None and model and base_url:
        with failing_open("Hermes's context cache", "the window is looked up in the model table", advice=None,
                          level=logging.DEBUG) as failed:
            cached = rules.cached_context(model, base_url)
        if failed:
            cached = None
        if _int(cached):
            return _int(cached), "Hermes context cache"
    table = _table_context(rules, model) if model else None
    if table:
        return table, "Hermes model table"
    return None, "unknown"


def main_model(cfg: dict[str, Any], rules: HostRules, providers: list[dict[str, Any]]) -> ModelView:
    raw = cfg.get("model")
    if isinstance(raw, str):
        model, base_url, provider, explicit = raw, "", "", None
    else:
        section = config_section(cfg, "model")
        model = str(section.get("default") or section.get("model") or "")
        base_url, provider = str(section.get("base_url") or ""), str(section.get("provider") or "")
        explicit = section.get("context_length")
    ctx, source = _window(rules, providers, model, base_url, explicit)
    return ModelView(model, base_url, provider, ctx, source)


def _finding(signature: str, key: str, detail: str, fix: str) -> ConfigFinding:
    return ConfigFinding(signature, key, detail, fix, SEED_LINES[signature])


def _default_lines(fallback: OptionFallback) -> str:
    """The YAML that sets the option back to its default (or the line to delete, for an unknown one)."""
    import yaml

    parts = fallback.key.split(".")
    if fallback.unknown:
        return f"# remove {fallback.key} from config.yaml"
    node: Any = fallback.as_dict()["default"]
    for part in reversed(parts):
        node = {part: node}
    return yaml.safe_dump(node, sort_keys=False, width=200).rstrip("\n")


def isolation_settings(cfg: Mapping[str, Any]) -> list[str]:
    """The config.yaml settings that make Hermes run turns in a process of their own."""
    found = []
    plugins = cfg.get("plugins")
    isolation = plugins.get("isolation") if isinstance(plugins, dict) else None
    if isolation is not None and str(isolation).strip().lower() not in _OFF:
        found.append(f"plugins.isolation: {isolation}")
    dashboard = cfg.get("dashboard")
    turn_isolation = dashboard.get("turn_isolation") if isinstance(dashboard, dict) else None
    if turn_isolation is not None and str(turn_isolation).strip().lower() not in _OFF:
        found.append(f"dashboard.turn_isolation: {turn_isolation}")
    return found


def isolation_findings(raw: Mapping[str, Any]) -> list[ConfigFinding]:
    """Settings that run turns in a process that does not load plugins, so not the guard."""
    return [_finding(
        "turns_isolated", setting.split(":", 1)[0],
        f"{setting}: Hermes runs turns in a process of their own that does not load plugins; the guard cannot see "
        "those turns or their compactions (no kept id, no buffering, no snapshot, no record)",
        "remove the setting (turns then run in the process that loads the guard) and restart Hermes",
    ) for setting in isolation_settings(raw)]


def guard_option_findings(raw: Mapping[str, Any]) -> list[ConfigFinding]:
    """One finding per ``session_guard`` option that runs on its default because its value
    is unusable (``enabled`` and a non-mapping section are refused by the home check)."""
    try:
        parsed = parse_config(raw.get("session_guard"))
    except ConfigError:
        return []
    fallbacks = parsed.fallbacks
    out = []
    if Path(parsed.audit.path).is_absolute():  # allowed and documented, but outside the home's protections
        out.append(_finding("audit_path_outside_home", "session_guard.audit.path",
                            f"audit.path {parsed.audit.path} is outside HERMES_HOME: the audit log is written "
                            "there (no link followed at its name, created 0600), but whose it is and who else "
                            "can write its directory is not checked",
                            "keep it only if that directory is the service's own; else remove the option"))
    for fb in fallbacks:
        fix = (f"remove {fb.key} (or correct its name)" if fb.unknown
               else f"set {fb.key} to a valid value ({fb.problem}) or remove it to keep the default")
        out.append(ConfigFinding("guard_option_invalid", fb.key, fb.describe() + "; every other option applies",
                                 fix, _default_lines(fb)))
    return out


def check_config(raw: Mapping[str, Any], rules: HostRules) -> list[ConfigFinding]:
    """Every configuration finding for one config.yaml (raw, as on disk) under ``rules``."""
    cfg = merge_defaults(rules.defaults, raw)
    out: list[ConfigFinding] = []
    comp = config_section(cfg, "compression")
    aux = config_section(cfg, "auxiliary", "compression")
    providers: list[dict[str, Any]] = []
    if rules.custom_providers is not None:
        with failing_open("Hermes's custom providers", "config.yaml's custom_providers list is read as written",
                          advice=None, level=logging.DEBUG):
            providers = rules.custom_providers(cfg)
    if not providers and isinstance(cfg.get("custom_providers"), list):
        providers = [p for p in cfg["custom_providers"] if isinstance(p, dict)]
    main = main_model(cfg, rules, providers)

    enabled = _truthy(comp.get("enabled", True))
    if not enabled:
        out.append(_finding(
            "compression_disabled", "compression.enabled",
            "compression.enabled is false: neither the agent nor the gateway's session hygiene compresses; a long "
            "session runs into the provider's context limit (errors, lost tool calls) instead of a compaction",
            "set compression.enabled: true (start a fresh session at project boundaries instead of disabling it)",
        ))

    percent = option_float(comp.get("threshold"), 0.5)
    threshold_tokens = rules.threshold(main.context_length, percent) if main.context_length else None
    effective = rules.effective_percent(main.context_length or 0, percent) if main.context_length else percent

    # -- auxiliary compression model ---------------------------------------------------
    aux_model = str(aux.get("model") or "").strip()
    if aux_model.lower() == "auto":
        aux_model = ""
    aux_provider = str(aux.get("provider") or "auto")
    if enabled and not aux_model:
        out.append(_finding(
            "aux_compression_model_unset", "auxiliary.compression.model",
            f"auxiliary.compression.model is unset (provider {aux_provider}): Hermes picks the summary model by "
            "auto-detection, so whether its window fits a threshold-sized middle is unknown",
            "set auxiliary.compression.model (and provider, context_length) to a stable model whose context "
            "window is at least the main model's",
        ))
    elif enabled:
        aux_url = str(aux.get("base_url") or "") or (main.base_url if aux_provider in ("auto", "main", "") else "")
        aux_ctx, aux_source = _window(rules, providers, aux_model, aux_url, aux.get("context_length"))
        if aux_ctx is None and aux_model == main.model:
            aux_ctx, aux_source = main.context_length, f"same as the main model ({main.source})"
        if aux_ctx is None:
            out.append(_finding(
                "aux_compression_window_unknown", "auxiliary.compression.context_length",
                f"the context window of auxiliary compression model {aux_model} is not in config.yaml, Hermes's "
                "context cache or its model table; Hermes will probe or guess it",
                "set auxiliary.compression.context_length to the model's real window in tokens",
            ))
        elif threshold_tokens is not None and aux_ctx < threshold_tokens:
            out.append(_finding(
                "aux_compression_window_too_small", "auxiliary.compression.model",
                f"auxiliary compression model {aux_model} has a {aux_ctx:,}-token window ({aux_source}), below the "
                f"main model's compression threshold of {threshold_tokens:,} tokens ({main.model}: "
                f"{main.context_length:,} x {effective:.0%}); summaries of a full middle fail or get cut",
                "set auxiliary.compression.model to a model whose window is at least the main model's, and its "
                "auxiliary.compression.context_length",
            ))

    timeout = option_float(aux.get("timeout"), 0.0)
    if enabled and timeout < RECOMMENDED_TIMEOUT:
        default = config_section(rules.defaults, "auxiliary", "compression").get("timeout")
        said = "Hermes's default " if config_section(raw, "auxiliary", "compression").get("timeout") is None else ""
        out.append(_finding(
            "aux_compression_timeout_low", "auxiliary.compression.timeout",
            f"auxiliary.compression.timeout is {said}{timeout:g} s (release default {default}); large compression "
            f"passes take 30-55 s and more and time out below {RECOMMENDED_TIMEOUT} s",
            f"set auxiliary.compression.timeout: {RECOMMENDED_TIMEOUT} (or 600 for large sessions / slow local models)",
        ))

    # -- custom providers --------------------------------------------------------------
    for i, entry in enumerate(providers):
        models = entry["models"] if isinstance(entry.get("models"), dict) else {}
        has = _int(entry.get("context_length")) or any(
            isinstance(m, dict) and _int(m.get("context_length")) for m in models.values())
        if not has:
            name = entry.get("name") or entry.get("base_url") or f"#{i}"
            out.append(_finding(
                "custom_provider_no_context_length", f"custom_providers[{i}].models.<model>.context_length",
                f"custom provider {name} ({entry.get('base_url') or 'no base_url'}) has no context_length: Hermes "
                "probes or falls back to a default window, so it compresses too often or too late",
                f"set custom_providers[{i}].models.<model>.context_length for {name} (its real window in tokens)",
            ))
    if main.provider == "custom" and main.base_url and main.source in ("unknown", "Hermes model table") \
            and not _custom_context(providers, main.model, main.base_url):
        out.append(_finding(
            "custom_provider_no_context_length", "model.context_length",
            f"main model {main.model or '?'} runs on a custom endpoint ({main.base_url}) without model.context_length"
            + (f"; Hermes would guess {main.context_length:,} from its model table" if main.context_length else ""),
            "set model.context_length to the endpoint's real window in tokens",
        ))

    # -- thresholds that leave no room ---------------------------------------------------
    if enabled and effective >= rules.hygiene_percent:
        out.append(_finding(
            "threshold_above_hygiene", "compression.threshold",
            f"compression.threshold {percent:g} (effective {effective:.0%}) is at or above the gateway's session "
            f"hygiene threshold ({rules.hygiene_percent:.0%}): gateway sessions are compressed by hygiene before "
            "each turn instead of by the agent",
            f"set compression.threshold below {rules.hygiene_percent:g} (Hermes's default is "
            f"{config_section(rules.defaults, 'compression').get('threshold', 0.5)})",
        ))
    first, last = _int(comp.get("protect_first_n")) or 0, _int(comp.get("protect_last_n")) or 0
    hard = _int(comp.get("hygiene_hard_message_limit"))
    if enabled and hard and first + last + 1 >= hard:
        out.append(_finding(
            "protected_exceeds_budget", "compression.protect_last_n",
            f"protect_first_n {first} + protect_last_n {last} messages leave nothing to summarise below the "
            f"gateway's hygiene_hard_message_limit of {hard}: a forced compaction cannot shrink the session",
            "lower compression.protect_first_n / compression.protect_last_n (or raise "
            "compression.hygiene_hard_message_limit)",
        ))
    elif enabled and threshold_tokens and main.context_length:
        ratio = max(0.10, min(option_float(comp.get("target_ratio"), 0.2), 0.80))  # clamped as ContextCompressor does
        tail = int(threshold_tokens * ratio)
        summary = min(int(main.context_length * 0.05), rules.summary_ceiling)
        if tail + summary >= ROOM_FRACTION * threshold_tokens:
            out.append(_finding(
                "protected_exceeds_budget", "compression.target_ratio",
                f"protected tail ({tail:,} tokens) + summary budget ({summary:,}) leave under "
                f"{1 - ROOM_FRACTION:.0%} of the {threshold_tokens:,}-token threshold for new turns: every compaction "
                "ends next to the threshold and the next turns compress again",
                "lower compression.target_ratio (Hermes's default is "
                f"{config_section(rules.defaults, 'compression').get('target_ratio', 0.2)})",
            ))
    return out + isolation_findings(raw) + guard_option_findings(raw)


def diagnose_config(home: Path, rules: HostRules | None = None) -> dict[str, Any]:
    """The config findings of ``home`` as doctor reports them (JSON-ready)."""
    rules = rules if rules is not None else load_host_rules()
    if rules is None:
        return {"checked": False, "reason": "hermes-agent is not importable here; configuration not checked",
                "findings": []}
    try:
        raw = read_config(home)
    except (OSError, ValueError) as exc:
        return {"checked": False, "reason": str(exc), "findings": []}
    findings = check_config(raw, rules)
    return {"checked": True, "hermes_version": rules.version, "hygiene_percent": rules.hygiene_percent,
            "config": str(home / "config.yaml"), "findings": [f.as_dict() for f in findings]}
