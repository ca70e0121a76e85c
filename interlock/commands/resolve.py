"""``policy resolve``: the decision document as JSON, for machines."""

from __future__ import annotations

import argparse
import sys

from interlock.commands.common import add_decision_command, refused_exit, resolve_args


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = add_decision_command(
        subparsers, "resolve", "the decision as JSON",
        "The decision, provenance, trace and policy stamp for ARCH as one JSON document (the "
        "same as `policy explain --json`).",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from interlock.policy.explain import render_json

    resolution = resolve_args(args)
    sys.stdout.write(render_json(resolution))
    return refused_exit(resolution)
