"""The ``policy`` command line: one module per subcommand under :mod:`interlock.commands`.

A subcommand module exposes ``add_parser(subparsers)`` (which sets ``run`` as the
parser default) and ``run(args) -> int``; it imports what it needs inside
``run`` so that ``policy --help`` and a warm ``policy explain`` stay fast.

Exit codes: 0 ok, 1 a policy or input error (message on stderr), 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

#: Subcommands, in ``--help`` order; each is ``interlock.commands.<name>``.
COMMANDS = (
    "explain", "resolve", "table", "check", "test", "diff", "schema", "plugins", "run", "bench",
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand, or with only ``command`` (so that running one
    imports only its module)."""
    parser = argparse.ArgumentParser(
        prog="policy",
        description="Decide, explain and test how an inference engine runs a model.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS if command is None else (command,):
        importlib.import_module(f"interlock.commands.{name}").add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 after --help
        return exc.code if isinstance(exc.code, int) else 0
    from interlock.core.errors import PolicyError

    try:
        return int(args.run(args))
    except PolicyError as exc:
        print(f"policy: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`policy table | head`); don't let Python complain at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
