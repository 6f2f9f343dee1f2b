"""Context engines the tests install as real Hermes plugins.

Each folder here is a directory plugin (``plugin.yaml`` + ``__init__.py`` whose
``register(ctx)`` calls ``ctx.register_context_engine``), the form every release
from 0.13.0 to 0.19.0 discovers under ``<HERMES_HOME>/plugins/<name>/``.
:func:`install` copies one into a home and selects it in config.yaml
(``context.engine``, and the plugin listed in ``plugins.enabled`` beside the guard).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

HERE = Path(__file__).parent

#: engine name (what config.yaml selects) -> plugin folder
ENGINES: dict[str, str] = {
    "trimmed-compressor": "trimmed_compressor",  # subclass of Hermes's compressor, one step changed
    "digest-engine": "digest_engine",  # written from scratch, its own summary format
    "ledger-engine": "ledger_engine",  # per-session store keyed by session id (LCM pattern)
}


def install(home: Path, engine: str) -> Path:
    """Copy ``engine``'s plugin into ``home/plugins/`` and select it in ``home/config.yaml``
    (which must exist, e.g. from ``probe.write_config``)."""
    target = home / "plugins" / engine
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(HERE / ENGINES[engine], target, ignore=shutil.ignore_patterns("__pycache__"))
    path = home / "config.yaml"
    cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    plugins = cfg.setdefault("plugins", {})
    enabled = list(plugins.get("enabled") or [])
    plugins["enabled"] = [*enabled, engine] if engine not in enabled else enabled
    cfg.setdefault("context", {})["engine"] = engine
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return target
