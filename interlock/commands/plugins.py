"""``policy plugins``: every plugin, where it comes from, what it provides, and its status."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from interlock.commands.common import write_json

if TYPE_CHECKING:
    from interlock.plugins.registry import PluginRecord
    from interlock.plugins.spec import PlatformSupport, RunnerSpec
    from interlock.testing.checks import Finding


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plugins",
        help="list runner plugins and their capabilities",
        description="Discover the installed plugins afresh (entry point group interlock.plugins) "
        "and list each with its distribution, status (ok, failed: ..., disabled, "
        "incompatible: ...), runners with their capabilities, and kernel implementations. "
        "Each runner's factory is imported (as a run would), and a plugin providing nothing "
        "gets a warning naming the missing @hookimpl marker. Exit 1 when a plugin failed, a "
        "factory does not import, a runner subclassing another runner's class claims more "
        "than that runner's spec serves, or the registry is inconsistent (e.g. two plugins "
        "registering one runner name).",
    )
    parser.add_argument("--json", action="store_true", help="print the listing as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from interlock.plugins import PLUGIN_API_VERSION, load_registry

    registry = load_registry(refresh=True)
    problems = [f"plugin {p.provider} {p.status_line}" for p in registry.failed()]
    problems += registry.problems()
    factories = {p.name: _factories(p) for p in registry.plugins if p.status == "ok"}
    problems += [
        f"plugin {p.provider}: runner {name!r}: {why}"
        for p in registry.plugins for name, why in factories.get(p.name, {}).items()
        if why != "ok"
    ]
    problems += [f"plugin {p.provider}: {f}" for p in registry.plugins if p.status == "ok"
                 for f in _claims(p)]
    warnings = [w for p in registry.plugins if (w := _provides_nothing(p)) is not None]
    if args.json:
        doc = {
            "plugin_api": PLUGIN_API_VERSION,
            "plugins": [
                {**p.to_dict(), "factories": factories.get(p.name, {})} for p in registry.plugins
            ],
            "problems": problems,
            "warnings": warnings,
        }
        write_json(doc)
    else:
        lines = [f"plugin API {PLUGIN_API_VERSION}"]
        for plugin in registry.plugins:
            lines += ["", *_plugin_lines(plugin, factories.get(plugin.name, {}))]
        sys.stdout.write("\n".join(lines) + "\n")
        for warning in warnings:
            print(f"policy: warning: {warning}", file=sys.stderr)
        for problem in problems:
            print(f"policy: problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _factories(plugin: PluginRecord) -> dict[str, str]:
    """Per runner: ``ok`` when its factory imports and is callable, else why not (a typo such
    as ``myrunner.runner:MyRuner`` would otherwise fail only when a run starts)."""
    from interlock.plugins.isolation import PluginCrash, plugin_code
    from interlock.testing.checks import check_factories

    try:
        with plugin_code():  # the plugin's import-time prints go to stderr, not into --json
            found = {f.subject: f.message for f in check_factories(plugin)}
    except PluginCrash as exc:  # SystemExit and the like from the plugin's import
        return {spec.name: f"importing the factory crashed: {exc}" for spec in plugin.runners}
    return {spec.name: found.get(spec.name, "ok") for spec in plugin.runners}


def _claims(plugin: PluginRecord) -> list[Finding]:
    """Runners subclassing another runner's class that claim more than its spec serves."""
    from interlock.plugins.isolation import PluginCrash, plugin_code
    from interlock.testing.checks import check_inherited_claims

    try:
        with plugin_code():
            return check_inherited_claims(plugin)
    except PluginCrash:  # reported by the factory import already
        return []


def _provides_nothing(plugin: PluginRecord) -> str | None:
    """The warning for an ok plugin that provides no runner and no kernel, naming the hook
    functions that lack the ``@hookimpl`` marker (pluggy ignores them without it)."""
    if plugin.status != "ok" or plugin.runners or plugin.kernels:
        return None
    import inspect

    from interlock.plugins.hookspecs import PROJECT, Hooks

    obj = _entry_object(plugin.source)
    hooks = [n for n in vars(Hooks) if n.startswith(f"{PROJECT}_")]
    unmarked = []
    for name in hooks:
        fn = getattr(obj, name, None) if obj is not None else None
        if callable(fn) and not hasattr(fn, f"{PROJECT}_impl"):
            try:
                where = f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
            except (OSError, TypeError):
                where = plugin.source
            unmarked.append(f"{name} ({where})")
    if unmarked:
        why = (f"{', '.join(unmarked)} {'is' if len(unmarked) == 1 else 'are'} not marked "
               "@hookimpl (from interlock.plugins import hookimpl), so pluggy never calls it")
    else:
        why = f"it has no function marked @hookimpl named {' or '.join(hooks)}"
    return f"plugin {plugin.provider} provides nothing: {why}"


def _entry_object(source: str) -> Any:
    """The object an entry point value names, when it is already imported (discovery did)."""
    module_name, _, attr = source.partition(":")
    module = sys.modules.get(module_name.strip())
    if module is None or not attr:
        return module
    obj: Any = module
    for part in attr.strip().split("."):
        obj = getattr(obj, part, None)
    return obj


def _plugin_lines(plugin: PluginRecord, factories: dict[str, str]) -> list[str]:
    lines = [
        f"{plugin.name}  {plugin.distribution} {plugin.version}  {plugin.status_line}",
        f"  source       {plugin.source}",
    ]
    for spec in plugin.runners:
        lines += [f"  runner {spec.name}: {spec.description}", *_runner_lines(spec)]
        if spec.name in factories:
            verdict = factories[spec.name]
            lines.append(
                f"    factory import         {'ok (imported)' if verdict == 'ok' else verdict}"
            )
    for kernel in plugin.kernels:
        lines.append(
            f"  kernel {kernel.op}/{kernel.backend}  {', '.join(kernel.platforms)}  "
            f"{', '.join(kernel.dtypes)}  {kernel.target}"
        )
    if not plugin.runners and not plugin.kernels and plugin.status == "ok":
        lines.append("  provides nothing (warning: see below)")
    return lines


def _runner_lines(spec: RunnerSpec) -> list[str]:
    import yaml

    from interlock.plugins.spec import SERVED_FIELDS

    # Platforms declaring the same support are listed together.
    groups: dict[PlatformSupport, list[str]] = {}
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
