"""The hooks a plugin implements: interlock's public plugin API.

A plugin is any object (usually a module) with functions marked
``@hookimpl``, exposed as an entry point in the group ``interlock.plugins``::

    [project.entry-points."interlock.plugins"]
    eager = "interlock_eager.plugin"

Hooks are called once per discovery, must be cheap and must not import torch:
they return declarations, and the heavy objects are named by import path.
"""

from __future__ import annotations

import pluggy

from interlock.plugins.spec import KernelSpec, RunnerSpec

PROJECT = "interlock"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class Hooks:
    """Hook specifications (pluggy)."""

    @hookspec
    def interlock_runner_specs(self) -> list[RunnerSpec]:  # type: ignore[empty-body]
        """The runners this plugin provides."""

    @hookspec
    def interlock_kernel_specs(self) -> list[KernelSpec]:  # type: ignore[empty-body]
        """Extra kernel implementations this plugin provides (installed before any runner loads)."""


HOOK_NAMES: tuple[str, ...] = ("interlock_runner_specs", "interlock_kernel_specs")
