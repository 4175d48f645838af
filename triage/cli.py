"""`triage`: the command line. One pipeline, several doors.

Subcommands live in their own modules and register themselves through ``register(subparsers)``;
a module is imported only to build the parser, and its heavy imports happen inside the handler,
so `triage replay` starts fast and never imports torch or the server stack.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# (module, ...) in the order shown by --help. Each module defines `register(subparsers) -> None`
# and sets `func` on its parser: `func(args) -> int` (the exit code).
_COMMAND_MODULES = (
    "triage.commands.replay",
    "triage.commands.diagnose",
    "triage.simulate.cli",
    "triage.contract.cli",
    "triage.commands.flush",
    "triage.commands.serve",
    "triage.commands.watch",
)

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="triage",
        description="Diagnose CUDA out-of-memory crashes: platform or training code?",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # a command not shipped in this build
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    from triage.errors import TriageError

    try:
        return int(func(args))
    except TriageError as exc:
        print(f"triage {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
