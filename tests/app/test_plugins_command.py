"""`policy plugins [--json]`: every plugin with its distribution, status and capabilities."""

from __future__ import annotations

import json

import pytest
from plugin_builders import EAGER_ONLY, Declares, spec

from interlock.plugins import KernelSpec, RunnerSpec, hookimpl

pytestmark = pytest.mark.usefixtures("fresh_plugins")

#: `policy plugins` imports every factory (issue 24 item 11): these listings name a real one.
IMPORTABLE = "interlock.runners.mrv1.runner:MRV1Runner"
KERNEL = KernelSpec(
    op="silu_and_mul",
    backend="mine",
    target="mine.kernels:silu_and_mul",
    platforms={"cpu"},
    dtypes={"float32"},
    plugin_api=">=1.0",
)


def test_text_lists_plugins_runners_and_kernels(register_plugin, cli) -> None:  # type: ignore[no-untyped-def]
    register_plugin(
        Declares(spec("tiny", {"cpu": EAGER_ONLY}, fallback="mrv1", factory=IMPORTABLE),
                 kernels=(KERNEL,)),
        "tiny-plugin",
        distribution="tiny-dist",
        version="2.1",
    )
    code, out, err = cli("plugins")
    assert (code, err) == (0, "")
    assert "mrv2  interlock " in out and "  ok\n" in out
    assert (
        "cuda, rocm             cudagraph none, piecewise, full, full_decode_only, "
        "full_and_piecewise; breakable capture; torch.compile; requires has_triton" in out
    )
    assert (
        "xpu                    cudagraph none, piecewise, full, full_decode_only, "
        "full_and_piecewise; breakable capture; no torch.compile; requires has_triton" in out
    )
    assert (
        "unsupported            pipeline parallelism when {features: "
        "{pipeline_parallel_size: {gt: 1}}}" in out
    )
    assert "tiny-plugin  tiny-dist 2.1  ok" in out
    assert "cpu                    cudagraph none; no breakable capture; no torch.compile" in out
    assert "kernel silu_and_mul/mine  cpu  float32  mine.kernels:silu_and_mul" in out


def test_failures_are_listed_and_make_the_exit_code(register_plugin, cli) -> None:  # type: ignore[no-untyped-def]
    class Raises:
        @hookimpl
        def interlock_runner_specs(self) -> list[RunnerSpec]:
            raise ValueError("bad config")

    register_plugin(Raises(), "raises")
    code, out, err = cli("plugins")
    assert code == 1
    assert "raises  in-process 0  failed: ValueError: bad config" in out
    assert "policy: problem: plugin raises (in-process 0) failed: ValueError: bad config" in err


def test_json_document(register_plugin, cli, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("INTERLOCK_DISABLE_PLUGINS", "mrv2")
    register_plugin(
        Declares(spec("tiny", {"cpu": EAGER_ONLY}, factory=IMPORTABLE), kernels=(KERNEL,)),
        "tiny-plugin",
    )
    code, out, _ = cli("plugins", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["plugin_api"] == "1.0" and doc["problems"] == []
    by_name = {p["name"]: p for p in doc["plugins"]}
    assert by_name["mrv2"]["status"] == "disabled"
    assert by_name["mrv1"]["runners"][0]["platforms"]["cpu"]["breakable"] is True
    assert by_name["tiny-plugin"]["kernels"] == [KERNEL.to_dict()]
