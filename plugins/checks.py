"""What `policy check` asks of the plugin registry about a policy's values: the runner names
that exist and the cudagraph modes their runners serve, handed to :mod:`interlock.policy.lint`."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence

from interlock.core.decision import Decision
from interlock.core.platform import GPU_PLATFORMS
from interlock.plugins.manager import load_registry
from interlock.plugins.registry import PluginRegistry
from interlock.policy.lint import ERROR, WARNING, Check, Finding, RunnerCheck, Subject
from interlock.policy.lint import lint_paths as _lint_paths
from interlock.policy.lint import lint_sources as _lint_sources


def unserved_cudagraph(
    registry: PluginRegistry, mode: str, platforms: Iterable[str], runner: str | None = None
) -> list[str]:
    """Why ``mode`` is served on none of ``platforms``' runners, one message per platform where
    it is not: by ``runner`` when a rule sets one, else by any registered runner. Empty when
    every platform has a runner serving it (unregistered runners are reported elsewhere)."""
    candidates = [runner] if runner is not None else registry.runner_names()
    specs = [reg.spec for name in candidates if (reg := registry.find(name)) is not None]
    if runner is not None and not specs:
        return []
    who = f"runner {runner}" if runner is not None else "no registered runner"
    problems = []
    for platform in platforms:
        # The judge stage 5 asks: would this runner serve the mode here?
        if any(not s.unserved(Decision(s.name, mode), platform)  # type: ignore[arg-type]
               for s in specs):
            continue
        served = {s.name: s.platforms[platform].cudagraph for s in specs
                  if platform in s.platforms}
        if not served:
            problems.append(
                f"{who} {'does not serve' if runner else 'serves'} platform {platform}, so "
                f"cudagraph={mode} cannot be served there"
            )
            continue
        offered = "; ".join(f"{name} serves {', '.join(modes)}" for name, modes in served.items())
        problems.append(
            f"{who} {'does not serve' if runner else 'serves'} cudagraph={mode} on {platform} "
            f"({offered}): stage 5 downgrades it there"
        )
    return problems


def _unserved_cudagraph_modes(registry: PluginRegistry, subject: Subject) -> Iterator[Finding]:
    """Warnings: a rule sets a cudagraph mode that no registered runner (the rule's own runner
    when it sets one) serves on a platform the rule can match; stage 5 would always downgrade."""
    for rule in subject.policy.rules:
        setting = rule.set.get("cudagraph")
        if setting is None:
            continue
        runner = rule.set.get("runner")
        platforms = subject.domain.platforms_of(rule.when)
        problems = unserved_cudagraph(
            registry, str(setting.value), platforms, str(runner.value) if runner else None
        )
        if problems:
            yield subject.finding(
                setting.location,
                WARNING,
                "unsupported-cudagraph",
                f"rule {rule.id}: " + "; ".join(problems),
            )


def _default_runner_serves(registry: PluginRegistry, subject: Subject) -> Iterator[Finding]:
    """The defaults' runner (following its fallbacks) serves none of the GPU platforms (a
    warning), or its fallback chain loops (an error): either way contexts fail to resolve."""
    setting = subject.policy.defaults.get("runner")
    if setting is None or registry.find(str(setting.value)) is None:
        return  # an unregistered runner is reported by unknown-runner
    chain: list[str] = []
    name: str | None = str(setting.value)
    loop = None
    while name is not None:
        if name in chain:
            loop = " -> ".join([*chain, name])
            break
        chain.append(name)
        found = registry.find(name)
        name = found.spec.fallback if found is not None else None
    if loop is not None:
        yield subject.finding(
            setting.location, ERROR, "fallback-loop",
            f"defaults.runner {setting.value}: its fallback chain loops: {loop}",
        )
    specs = [reg.spec for n in chain if (reg := registry.find(n)) is not None]
    # The GPU platforms: those the default runner must serve (itself or along its chain).
    unserved = [p for p in GPU_PLATFORMS if not any(p in spec.platforms for spec in specs)]
    if unserved:
        # A warning: a site policy for CPU-only machines is legitimate; `--strict` fails it.
        yield subject.finding(
            setting.location, WARNING, "default-runner-unserved",
            f"defaults.runner {setting.value} (fallbacks: {' -> '.join(chain)}) serves no "
            f"runner on {', '.join(unserved)}: contexts there fail to resolve unless a rule "
            "chooses another runner (policy table shows them as errors)",
        )


def registered_runners(registry: PluginRegistry) -> RunnerCheck:
    """Runner names as the plugin registry knows them (the built-in runners are plugins too)."""
    names = set(registry.runner_names())
    return lambda name: None if name in names else registry.why_missing(name)


def registry_checks(registry: PluginRegistry) -> tuple[Check, ...]:
    """The lint checks that ask the registry."""
    return (
        lambda subject: _unserved_cudagraph_modes(registry, subject),
        lambda subject: _default_runner_serves(registry, subject),
    )


def lint_paths(
    paths: Sequence[str | os.PathLike[str]] | None = None,
    registry: PluginRegistry | None = None,
) -> list[Finding]:
    """``policy check``: :func:`interlock.policy.lint.lint_paths` against the installed plugins."""
    registry = registry if registry is not None else _installed()
    return _lint_paths(
        paths, runners=registered_runners(registry), checks=registry_checks(registry)
    )


def lint_sources(
    sources: list[tuple[str, bytes]], registry: PluginRegistry | None = None
) -> list[Finding]:
    """:func:`interlock.policy.lint.lint_sources` against the installed plugins."""
    registry = registry if registry is not None else _installed()
    return _lint_sources(
        sources, runners=registered_runners(registry), checks=registry_checks(registry)
    )


def _installed() -> PluginRegistry:
    return load_registry()
