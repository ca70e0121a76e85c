"""``policy test``: run declarative policy test cases, report each, and measure rule coverage."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from interlock.commands.common import add_policy_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "test",
        help="run policy test cases (policies.tests.yaml)",
        description="Run the cases of policy tests files against the policy (--policy, else "
        "$INTERLOCK_POLICY, else the shipped one). Without FILES, the tests file beside the "
        "policy: X.tests.yaml for X.yaml. Prints each case, 'N passed, M failed' and rule "
        "coverage; exit 1 when a case fails or coverage is below --min-coverage.",
    )
    parser.add_argument("files", nargs="*", metavar="FILE", help="policy tests files")
    add_policy_args(parser)
    parser.add_argument(
        "--min-coverage",
        type=_percent,
        default=0.0,
        metavar="PCT",
        help="fail when fewer than PCT %% of the rules decided a field in some case",
    )
    parser.set_defaults(run=run)


def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage 0-100, got {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"expected a percentage 0-100, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    from interlock.commands.common import load
    from interlock.core.errors import PolicyError
    from interlock.core.terminal import use_color
    from interlock.plugins.capabilities import capability_stage
    from interlock.policy.loader import policy_paths
    from interlock.policy.policytest import render_result, render_summary, run_cases
    from interlock.policy.testfile import load_tests, tests_path_for

    policy = load(args)
    paths = [Path(f) for f in args.files]
    if not paths:
        name, path = policy_paths(args.policy)[-1]
        default = tests_path_for(path)
        if not default.is_file():
            raise PolicyError(f"no tests file beside the policy {name}: expected {default}")
        paths = [_relative(default)]
    cases = [case for path in paths for case in load_tests(path).cases]
    results = run_cases(policy, cases, capabilities=capability_stage())
    color = use_color(sys.stdout)
    for result in results.results:
        print("\n".join(render_result(result, color=color)))
    print("\n".join(render_summary(results)))
    below = results.coverage() < args.min_coverage
    if below:
        print(
            f"policy: error: rule coverage {results.coverage():.1f} % is below "
            f"--min-coverage {args.min_coverage:g} %",
            file=sys.stderr,
        )
    return 1 if results.failed or below else 0


def _relative(path: Path) -> Path:
    """``path`` relative to the current directory when it is below it (shorter locations)."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path
