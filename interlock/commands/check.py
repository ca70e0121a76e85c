"""``policy check``: validate and lint policies, as ``file:line:col: severity: code: message``."""

from __future__ import annotations

import argparse
import sys

from interlock.commands.common import add_policy_args, write_json


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "check",
        help="validate and lint a policy",
        description="Validate policy files (everything the loader refuses, duplicate rule ids, "
        "unknown decision values and runners) and lint them over their finite domain "
        "(cudagraph modes no runner serves, unknown architectures, dead and shadowed rules, "
        "near-miss name lists, missing refs, vague reasons). Exit 0 without errors, 1 with "
        "errors (or warnings under --strict).",
    )
    add_policy_args(parser)
    parser.add_argument("--strict", action="store_true", help="fail on warnings too")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from interlock.plugins.checks import lint_paths
    from interlock.policy.lint import summary

    findings = lint_paths(args.policy)
    errors, warnings, failed = summary(findings, strict=args.strict)
    if args.json:
        doc = {
            "ok": not failed,
            "errors": errors,
            "warnings": warnings,
            "strict": args.strict,
            "findings": [f.to_dict() for f in findings],
        }
        write_json(doc)
    else:
        for finding in findings:
            print(finding)
        print(f"{errors} error(s), {warnings} warning(s)", file=sys.stderr)
    return 1 if failed else 0
