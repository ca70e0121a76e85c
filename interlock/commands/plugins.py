"""``policy plugins``: every plugin, where it comes from, what it provides, and its status."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from interlock.commands.common import write_json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plugins",
        help="list runner plugins and their capabilities",
        description="Discover the installed plugins afresh (entry point group interlock.plugins) "
        "and list each with its distribution, status (ok, failed: ..., disabled, "
        "incompatible: ...), runners with their capabilities, and kernel implementations. "
        "Exit 1 when a plugin failed or the registry is inconsistent (e.g. two plugins "
        "registering one runner name).",
    )
    parser.add_argument("--json", action="store_true", help="print the listing as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from interlock.plugins import PLUGIN_API_VERSION, load_registry

    registry = load_registry(refresh=True)
    problems = [f"plugin {p.provider} {p.status_line}" for p in registry.failed()]
    problems += registry.problems()
    if args.json:
        doc = {
            "plugin_api": PLUGIN_API_VERSION,
            "plugins": [p.to_dict() for p in registry.plugins],
            "problems": problems,
        }
        write_json(doc)
    else:
        lines = [f"plugin API {PLUGIN_API_VERSION}"]
        for plugin in registry.plugins:
            lines += ["", *_plugin_lines(plugin)]
        sys.stdout.write("\n".join(lines) + "\n")
        for problem in problems:
            print(f"policy: problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _plugin_lines(plugin: Any) -> list[str]:
    lines = [
        f"{plugin.name}  {plugin.distribution} {plugin.version}  {plugin.status_line}",
        f"  source       {plugin.source}",
    ]
    for spec in plugin.runners:
        lines += [f"  runner {spec.name}: {spec.description}", *_runner_lines(spec)]
    for kernel in plugin.kernels:
        lines.append(
            f"  kernel {kernel.op}/{kernel.backend}  {', '.join(kernel.platforms)}  "
            f"{', '.join(kernel.dtypes)}  {kernel.target}"
        )
    if not plugin.runners and not plugin.kernels and plugin.status == "ok":
        lines.append("  provides nothing")
    return lines


def _runner_lines(spec: Any) -> list[str]:
    import yaml

    from interlock.plugins.spec import SERVED_FIELDS

    # Platforms declaring the same support are listed together.
    groups: dict[Any, list[str]] = {}
    for platform, support in spec.platforms.items():
        groups.setdefault(support, []).append(platform)
    lines = []
    for support, platforms in groups.items():
        parts = [support.describe(name) for name in SERVED_FIELDS]
        parts += [f"requires {fact}" for fact in support.requires]
        limit = support.max_tensor_parallel_size
        parts.append(
            "no tensor parallelism" if limit == 1
            else f"tensor parallel up to {'any size' if limit is None else limit}"
        )
        lines.append(f"    {', '.join(platforms):<22} {'; '.join(parts)}")
    for item in spec.unsupported:
        flow = yaml.safe_dump(dict(item.when), default_flow_style=True, width=1000).strip()
        lines.append(f"    unsupported            {item.feature} when {flow}")
    lines.append(f"    fallback               {spec.fallback or '-'}")
    lines.append(f"    factory                {spec.factory}  (plugin API {spec.plugin_api})")
    return lines
