"""``policy diff OLD NEW``: every decision that changes between two policies, grouped by change.

OLD and NEW are policy files, or git revisions: ``git:REV`` is the repository's
``policies.yaml`` at REV, ``git:REV:path`` another file (relative to the
repository root). The repository is the one holding the current directory.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from interlock.commands.common import write_json
from interlock.core.errors import PolicyError

GIT_PREFIX = "git:"
DEFAULT_GIT_PATH = "policies.yaml"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "diff",
        help="what changes between two policies, exhaustively",
        description="Resolve both policies on every context of their common finite domain "
        "(catalog architectures x platforms x device archs they mention, plus one unnamed per "
        "platform, x feature values x env states) and print the decisions that differ, grouped "
        "by change, with the rule that decided each side. Prints nothing when they agree.",
    )
    parser.add_argument("old", metavar="OLD", help="policy file, git:REV or git:REV:path")
    parser.add_argument("new", metavar="NEW", help="policy file, git:REV or git:REV:path")
    parser.add_argument("--json", action="store_true", help="print the changes as JSON")
    parser.add_argument(
        "--exit-code", action="store_true", help="exit 1 when the policies differ (for CI)"
    )
    parser.add_argument(
        "--fields",
        type=_fields,
        metavar="F,...",
        help="compare only these decision fields (default: all)",
    )
    parser.set_defaults(run=run)


def _fields(text: str) -> list[str]:
    from interlock.core.fields import DECISION_FIELDS

    names = [part.strip() for part in text.split(",") if part.strip()]
    for name in names:
        if name not in DECISION_FIELDS:
            raise argparse.ArgumentTypeError(
                f"unknown decision field {name!r}; allowed: {', '.join(DECISION_FIELDS)}"
            )
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of decision fields")
    return names


def run(args: argparse.Namespace) -> int:
    from interlock.core.fields import DECISION_FIELDS
    from interlock.policy.diff import diff_policies, render_text, to_json
    from interlock.policy.loader import load_policy_sources

    old = load_policy_sources([read_policy_arg(args.old)])
    new = load_policy_sources([read_policy_arg(args.new)])
    diff = diff_policies(old, new, args.fields or DECISION_FIELDS)
    if args.json:
        write_json(to_json(diff, old, new))
    else:
        sys.stdout.write(render_text(diff))
    return 1 if args.exit_code and not diff.equal else 0


def read_policy_arg(spec: str) -> tuple[str, bytes]:
    """``(display name, content)`` of a policy file or a ``git:REV[:path]`` revision."""
    if not spec.startswith(GIT_PREFIX):
        from interlock.policy.source import read_source

        return spec, read_source(Path(spec), spec)
    rev, _, path = spec[len(GIT_PREFIX) :].partition(":")
    if not rev:
        raise PolicyError(f"{spec!r}: expected git:REV or git:REV:path, e.g. git:HEAD~1")
    path = path or DEFAULT_GIT_PATH
    return f"{rev}:{path}", _git_show(rev, path, spec)


def _git_show(rev: str, path: str, spec: str) -> bytes:
    from interlock.policy.source import MAX_FILE_BYTES

    try:
        done = subprocess.run(
            ["git", "show", f"{rev}:{path}"],
            capture_output=True,
            check=False,
        )
    except FileNotFoundError:
        raise PolicyError(f"{spec}: git is not installed") from None
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
        raise PolicyError(f"{spec}: git show {rev}:{path} failed: {message}")
    if len(done.stdout) > MAX_FILE_BYTES:
        raise PolicyError(f"policy file is larger than the {MAX_FILE_BYTES} byte limit", file=spec)
    return done.stdout
