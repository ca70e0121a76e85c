"""``policy table``: the decision for every catalog architecture on every platform."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from interlock.commands.common import (
    add_engine_args,
    add_env_args,
    add_policy_args,
    engine_of,
    env_of,
    load,
)
from interlock.core.platform import PLATFORM_NAMES
from interlock.policy.model import Policy


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "table",
        help="decision matrix: catalog architectures x platforms",
        description="The decision (policy stages and runner capabilities) for every catalog "
        "architecture on each platform, with no device arch and no features. When the policy "
        "has config conditions, one row per distinct truth assignment of its config "
        "predicates (and one with no model config), as `policy diff` enumerates them. The "
        "process environment is not applied; pass --env to apply a binding; "
        "--engine-version gives the engine version.",
    )
    parser.add_argument(
        "--platform",
        action="append",
        metavar="P",
        help=f"platform to include; repeatable (default: {', '.join(PLATFORM_NAMES)} and any a "
        "rule names)",
    )
    parser.add_argument("--format", choices=("text", "csv", "json"), default="text")
    add_env_args(parser)
    add_engine_args(parser)
    add_policy_args(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from interlock.core.errors import PolicyError
    from interlock.plugins.capabilities import capability_stage
    from interlock.policy.context import Context
    from interlock.policy.domain import Domain
    from interlock.policy.explain import TableError, render_table
    from interlock.policy.resolution import resolve

    policy = load(args)
    env, _ = env_of(args, policy, process=False)
    engine, sources = engine_of(args)
    platforms = args.platform or _platforms(policy)
    domain = Domain.of(policy)
    stage = capability_stage()
    rows: list[Any] = []
    for arch in policy.catalog:
        for platform in platforms:
            for config in domain.config_states:
                context = Context(
                    arch, platform, env=env, engine=engine, sources=sources,
                    config=None if config is None else dict(config),
                )  # fmt: skip
                try:
                    rows.append(resolve(policy, context, capabilities=stage))
                except PolicyError as exc:  # one context's error is its cell, not the table's end
                    rows.append(TableError(arch, platform, str(exc), context.config))
    sys.stdout.write(render_table(rows, args.format))
    if args.format == "text":
        for line in domain.describe_enumeration()[:1] if domain.config_predicates else []:
            sys.stdout.write(f"\nrows per {line}\n")
    return 1 if any(isinstance(r, TableError) for r in rows) else 0


def _platforms(policy: Policy) -> list[str]:
    named: dict[str, None] = dict.fromkeys(PLATFORM_NAMES)
    for rule in policy.rules:
        match = rule.when.name_match("platform")
        if match is not None:
            named.update(dict.fromkeys(sorted(match.literals)))
    return list(named)
