"""What `policy check` asks of the plugin registry about a policy's values: the runner names
that exist and the cudagraph modes their runners serve, handed to :mod:`interlock.policy.lint`."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from interlock.core.decision import Decision
from interlock.core.platform import (
    DEVICE_ARCHS,
    GPU_PLATFORMS,
    PLATFORM_NAMES,
    PLATFORMS,
    device_arch_problem,
    platform_problem,
)
from interlock.plugins.manager import load_registry
from interlock.plugins.registry import PluginRegistry
from interlock.policy.conditions import NameMatch
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
        # A platform nothing knows (a rule's typo) is reported as that, on that rule.
        known = registry.platforms()
        platforms = [
            p for p in subject.domain.platforms_of(rule.when) if platform_problem(p, known) is None
        ]
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
        lambda subject: _unknown_platforms(registry, subject),
    )


def _unknown_platforms(registry: PluginRegistry, subject: Subject) -> Iterator[Finding]:
    """Warnings: a rule names a platform that is neither built in nor served by a registered
    plugin, or a device arch its platforms do not name that way (``rcom``, ``gfx95O``): the
    rule never matches, and nothing else would say why."""
    declared = registry.platforms()
    for rule in subject.policy.rules:
        platforms = rule.when.name_match("platform")
        named = sorted(platforms.literals) if platforms is not None else []
        for where, name in _names(subject, rule, platforms):
            problem = platform_problem(name, declared) if name in named else None
            if problem is not None:
                yield subject.finding(
                    where, WARNING, "unknown-platform", f"rule {rule.id}: {problem}"
                )
        # Without a platform condition an arch must be some platform's (those whose arch
        # names are known; a plugin's own platform, whose names are not, turns the check off).
        scope = named or [
            p for p in dict.fromkeys((*PLATFORM_NAMES, *declared))
            if p in DEVICE_ARCHS or p not in PLATFORMS  # built-ins without arch names: out
        ]
        for where, arch in _names(subject, rule, rule.when.name_match("device_arch")):
            problem = device_arch_problem(arch, scope)
            if problem is not None:
                yield subject.finding(
                    where, WARNING, "unknown-device-arch", f"rule {rule.id}: {problem}"
                )


def _names(subject: Subject, rule: Any, match: NameMatch | None) -> Iterator[tuple[Any, str]]:
    """``(location, name)`` of each name a condition lists."""
    if match is None:
        return
    for i, name in enumerate(match.patterns):
        index = [i] if len(match.patterns) > 1 else []
        yield subject.at(rule, "when", match.key, *index), name


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
