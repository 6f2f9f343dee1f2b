"""``hermes-session-guard ...`` and ``hermes session-guard ...``: one parser, one home per command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import compactions, demo, disable, doctor, enable, export, handoff, repair, selftest, snapshots, status

COMMANDS: dict[str, Any] = {
    "selftest": selftest,
    "doctor": doctor,
    "repair": repair,
    "status": status,
    "snapshots": snapshots,
    "handoff": handoff,
    "enable": enable,
    "disable": disable,
    "demo": demo,
    "export": export,
}

HELP = ("Session-stable compression guard: selftest, doctor, repair, status, snapshots, handoff, export, enable, "
        "disable, demo")


def add_subcommands(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="guard_command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(guard_handler=module.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hermes-session-guard", description=HELP)
    add_subcommands(parser)
    return parser


def dispatch(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "guard_handler", None)
    if handler is None:
        (parser or build_parser()).print_help()
        return 2
    return int(handler(args) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return dispatch(args, parser)


def register_cli(ctx: Any) -> None:
    """``hermes session-guard ...`` through Hermes's plugin CLI registration."""

    def handler(args: argparse.Namespace) -> None:
        sys.exit(dispatch(args))

    ctx.register_cli_command("session-guard", HELP, add_subcommands, handler, description=HELP)


def register_slash_commands(ctx: Any) -> None:
    """``/handoff-packet [note]`` and ``/compactions [session id]`` in the CLI, the TUI and gateway
    chats, through Hermes's plugin command registration."""
    ctx.register_command(handoff.SLASH_NAME, handoff.slash_command, description=handoff.SLASH_HELP,
                         args_hint="[note]")
    ctx.register_command(compactions.SLASH_NAME, compactions.slash_command, description=compactions.SLASH_HELP,
                         args_hint="[session id]")


if __name__ == "__main__":
    raise SystemExit(main())
