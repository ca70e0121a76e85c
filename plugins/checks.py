"""What `policy check` asks of the plugin registry about a policy's values."""

from __future__ import annotations

from collections.abc import Iterable

from interlock.plugins.registry import PluginRegistry


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
        served = {s.name: s.platforms[platform].cudagraph for s in specs if platform in s.platforms}
        if any(mode in modes for modes in served.values()):
            continue
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
