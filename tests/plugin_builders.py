"""Builders for plugin tests: specs, registries, and installed-looking distributions."""

from __future__ import annotations

import textwrap
from pathlib import Path

from interlock.core.decision import CUDAGRAPH_MODES
from interlock.plugins import (
    KernelSpec,
    PlatformSupport,
    PluginRecord,
    PluginRegistry,
    RunnerSpec,
    Unsupported,
    hookimpl,
)

EVERY_MODE = PlatformSupport(cudagraph=CUDAGRAPH_MODES, breakable=True, compile=True)
EAGER_ONLY = PlatformSupport(cudagraph={"none"})
PIPELINE = Unsupported("pipeline parallelism", {"features": {"pipeline_parallel_size": {"gt": 1}}})


class Declares:
    """A plugin object declaring the given runner specs (and kernel specs)."""

    def __init__(self, *runners: RunnerSpec, kernels: tuple[KernelSpec, ...] = ()) -> None:
        self.runners, self.kernels = list(runners), list(kernels)

    @hookimpl
    def interlock_runner_specs(self) -> list[RunnerSpec]:
        return self.runners

    @hookimpl
    def interlock_kernel_specs(self) -> list[KernelSpec]:
        return self.kernels


def spec(
    name: str, platforms: dict[str, PlatformSupport] | None = None, **kw: object
) -> RunnerSpec:
    kw.setdefault("description", f"test runner {name}")
    kw.setdefault("plugin_api", ">=1.0,<2")
    kw.setdefault("factory", f"{name}_runner:Runner")
    return RunnerSpec(
        name=name, platforms={"cpu": EVERY_MODE} if platforms is None else platforms, **kw
    )  # type: ignore[arg-type]


def record(
    *specs: RunnerSpec,
    name: str = "test",
    distribution: str = "test-dist",
    status: str = "ok",
    detail: str = "",
) -> PluginRecord:
    return PluginRecord(
        name=name,
        distribution=distribution,
        version="1.0",
        source=f"{name}_mod",
        status=status,
        detail=detail,
        runners=specs,
    )  # type: ignore[arg-type]


def registry_of(*specs: RunnerSpec) -> PluginRegistry:
    """One ok plugin per spec, named after it."""
    return PluginRegistry(
        [record(s, name=f"p-{s.name}", distribution=f"{s.name}-dist") for s in specs]
    )


def make_dist(
    root: Path, dist: str, version: str, entry_points: dict[str, str], modules: dict[str, str]
) -> Path:
    """An installed-looking distribution under ``root`` (put ``root`` on sys.path)."""
    root.mkdir(parents=True, exist_ok=True)
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[interlock.plugins]\n{lines}")
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    return root


SPEC_MODULE = """
from interlock.plugins import PlatformSupport, RunnerSpec, hookimpl

@hookimpl
def interlock_runner_specs():
    return [RunnerSpec(name={name!r}, description="from an entry point", plugin_api={api!r},
                       platforms={{"cpu": PlatformSupport(cudagraph={{"none"}})}},
                       factory="nowhere_yet:Runner")]
"""


def spec_module(name: str, api: str = ">=1.0,<2") -> str:
    return SPEC_MODULE.format(name=name, api=api)
