"""``policy schema``: the JSON Schema of the policy file, the policy tests file or a measurement
evidence record."""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "schema",
        help="JSON Schema of the policy file, the tests file or an evidence record",
        description="Print the JSON Schema (draft 2020-12) of a policy file (default), of a "
        "policy tests file or of a measurement evidence record (policy measure --record), for "
        "editors and tools: the repository keeps them in schemas/ "
        "(policy schema policy > schemas/policy.schema.json).",
    )
    parser.add_argument(
        "kind", nargs="?", choices=("policy", "tests", "evidence"), default="policy",
        help="which file format",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from interlock.policy.jsonschema import render

    sys.stdout.write(render(args.kind))
    return 0
