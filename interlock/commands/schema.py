"""``policy schema``: the JSON Schema of the policy file or of the policy tests file."""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "schema",
        help="JSON Schema of the policy file or the tests file",
        description="Print the JSON Schema (draft 2020-12) of a policy file (default) or of a "
        "policy tests file, for editors: the repository keeps them in schemas/ "
        "(policy schema policy > schemas/policy.schema.json).",
    )
    parser.add_argument(
        "kind", nargs="?", choices=("policy", "tests"), default="policy", help="which file format"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from interlock.policy.jsonschema import render

    sys.stdout.write(render(args.kind))
    return 0
