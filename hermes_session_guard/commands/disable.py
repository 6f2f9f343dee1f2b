"""``disable``: move the guard to ``plugins.disabled`` of the home's config.yaml (every release)."""

from __future__ import annotations

import argparse

from .plugin_switch import add_switch_arguments, switch

HELP = "Disable the guard in this home's config.yaml (plugins.disabled; comments kept, old file backed up)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_switch_arguments(p)


def run(args: argparse.Namespace) -> int:
    return switch(args, enable=False)
