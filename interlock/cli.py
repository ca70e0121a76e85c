"""The ``policy`` command line: one module per subcommand under :mod:`interlock.commands`.

A subcommand module exposes ``add_parser(subparsers)`` (which sets ``run`` as the
parser default) and ``run(args) -> int``; it imports what it needs inside
``run`` so that ``policy --help`` and a warm ``policy explain`` stay fast.

Every command gets the same outcome handling here, whatever it is:

- exit codes (:data:`interlock.core.errors.EXIT_CODES`): 0 ok, 1 a policy or
  input error, 2 usage, 3 a plugin error, 4 a model or runtime error, 70 a
  bug (traceback on stderr, and a line asking for a report), 130 Ctrl-C;
- an error is one message on stderr, ``policy: error: ...``; with ``--json``
  (or ``--format json``) stdout also gets one document,
  ``{"error": {"kind", "message", "location"}}``;
- human-facing output goes through :class:`interlock.core.terminal.EscapingWriter`,
  so text read from files or plugins cannot drive the terminal.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from interlock.core.env import Settings
from interlock.core.errors import EXIT_CODES, InterlockError, LocatedError, error_kind
from interlock.core.terminal import EscapingWriter, one_line

#: Subcommands, in ``--help`` order; each is ``interlock.commands.<name>``.
COMMANDS = (
    "explain", "resolve", "table", "check", "test", "diff", "conformance", "schema", "plugins",
    "run", "serve", "measure", "vllm", "log", "impact", "model",
)
#: Subcommands that were renamed: the old word is refused naming the new one (exit 2).
RENAMED = {"bench": "measure"}
REPORT = (
    "policy: internal error: this is a bug in interlock, not in your input; please report it "
    "to the interlock maintainers with the command you ran and the traceback above"
)


class UsageError(InterlockError):
    """The command line itself is wrong (argparse's complaint)."""

    kind = "usage"

    def __init__(self, message: str, parser: argparse.ArgumentParser) -> None:
        super().__init__(message)
        self.parser = parser


class _Formatter(argparse.HelpFormatter):
    """argparse's help layout, sized without importing :mod:`shutil` (argparse builds a
    formatter for every ``add_argument``; ``shutil`` alone is ~4 ms of a warm explain)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_columns() - 2)


def _columns() -> int:
    """The terminal's width as :func:`shutil.get_terminal_size` finds it: ``$COLUMNS``, else
    the terminal on standard output, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    stream = sys.__stdout__
    if columns <= 0 and stream is not None:
        try:
            columns = os.get_terminal_size(stream.fileno()).columns
        except (ValueError, OSError):  # closed, detached, or not a terminal
            columns = 0
    return columns if columns > 0 else 80


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is raised (to be reported like any other error)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand, or with only ``command`` (so that running one
    imports only its module)."""
    from interlock import __version__

    parser = _Parser(
        prog="policy",
        description="Decide, explain and test how an inference engine runs a model.",
    )
    parser.add_argument(
        "--version", action="version", version=f"policy (interlock) {__version__}"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS if command is None else (command,):
        importlib.import_module(f"interlock.commands.{name}").add_parser(subparsers)
    return parser


def _unrecognized(
    exc: UsageError, parser: argparse.ArgumentParser, argv: Sequence[str]
) -> UsageError:
    """argparse reports an unknown option of a subcommand on the top-level parser, with the
    top-level usage; say it for the subcommand, with its closest option."""
    prefix = "unrecognized arguments: "
    message = str(exc)
    if not message.startswith(prefix) or not argv or argv[0] not in COMMANDS:
        return exc
    from interlock.core.suggest import did_you_mean

    sub = _subparser(parser, list(argv))
    options = [o for action in sub._actions for o in action.option_strings]
    hints = []
    for word in message[len(prefix) :].split():
        if word.startswith("-"):
            near = did_you_mean(word.split("=")[0], options)
            if near is not None:
                hints.append(f"{word.split('=')[0]}: did you mean {near}?")
    return UsageError(message + ("; " + "; ".join(hints) if hints else ""), sub)


def _renamed(argv: Sequence[str]) -> UsageError:
    """A renamed subcommand, refused with the command line under its new name."""
    import shlex

    new = RENAMED[argv[0]]
    parser = build_parser(new)
    again = shlex.join(["policy", new, *argv[1:]])
    return UsageError(
        f"`policy {argv[0]}` is now `policy {new}` (bench/ holds the project's own benchmark "
        f"scripts); run: {again}", _subparser(parser, [new]),
    )


def _subparser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The deepest subcommand parser ``argv`` names (``vllm args`` has two levels)."""
    current = parser
    for word in argv:
        choices = next(
            (a.choices for a in current._actions if isinstance(a, argparse._SubParsersAction)),
            None,
        )
        if not isinstance(choices, dict) or word not in choices:
            break
        current = choices[word]
    return current


def _wants_json(argv: Sequence[str], args: argparse.Namespace | None) -> bool:
    if args is not None:
        return bool(getattr(args, "json", False)) or getattr(args, "format", None) == "json"
    return (
        "--json" in argv
        or "--format=json" in argv
        or any(a == "--format" and b == "json" for a, b in zip(argv, argv[1:], strict=False))
    )


def _location(exc: BaseException) -> Any:
    location = getattr(exc, "location", None)
    return location() if callable(location) else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapingWriter(stdout), EscapingWriter(stderr)
    try:
        return _main(argv)
    finally:
        sys.stdout.flush()
        sys.stdout, sys.stderr = stdout, stderr


def _main(argv: list[str]) -> int:
    args = None
    try:
        if argv and argv[0] in RENAMED:
            raise _renamed(argv)
        parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help and --version exit 0 through argparse
            return exc.code if isinstance(exc.code, int) else 0
        except UsageError as exc:
            raise _unrecognized(exc, parser, argv) from None
        # The command's boundary: the environment it uses is read here, once, and handed to
        # it (a record's log, the run's settings), never read again after its decision.
        args.settings = Settings.read()
        return int(args.run(args))
    except KeyboardInterrupt as exc:
        print("policy: interrupted", file=sys.stderr)
        return _fail(argv, args, "interrupted", "interrupted (Ctrl-C)", None, exc)
    except BrokenPipeError:
        # The reader went away (`policy table | head`); don't let Python complain at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:
        kind = error_kind(exc)
        if kind is None:
            import traceback

            traceback.print_exc(file=sys.stderr)
            print(REPORT, file=sys.stderr)
            message = f"internal error: {type(exc).__name__}: {exc}"
            return _fail(argv, args, "internal", message, None)
        if isinstance(exc, UsageError):
            exc.parser.print_usage(sys.stderr)
            print(f"{exc.parser.prog}: error: {one_line(str(exc))}", file=sys.stderr)
        else:
            print(f"policy: error: {_one_paragraph(exc)}", file=sys.stderr)
        return _fail(argv, args, kind, str(exc), _location(exc), exc)


def _one_paragraph(exc: Exception) -> str:
    """The error as printed: a :class:`LocatedError` keeps its lines (each one already shows
    the line breaks of the values it quotes); any other error is one line, so a model
    directory named ``m\\nengine: verified`` cannot print a line of its own."""
    return str(exc) if isinstance(exc, LocatedError) else one_line(str(exc))


def _fail(
    argv: Sequence[str],
    args: argparse.Namespace | None,
    kind: str,
    message: str,
    where: Any,
    exc: BaseException | None = None,
) -> int:
    if _wants_json(argv, args):
        # ``details``: what a command had done when it failed (e.g. run's partial outputs);
        # an error's own detail lines (a tuple) are in ``message`` already.
        details = getattr(exc, "details", None)
        extra = details if isinstance(details, dict) else {}
        error = {"kind": kind, "message": message, "location": where, **extra}
        sys.stdout.write(json.dumps({"error": error}, indent=2) + "\n")
    return EXIT_CODES[kind]


if __name__ == "__main__":
    sys.exit(main())
