"""A runner subclassing a built-in runner's class claims no more than the built-in's spec
serves (the plugin test kit and `policy plugins`), as docs/plugins.md's snippet warns."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from plugin_builders import Declares

from interlock.plugins import PlatformSupport, RunnerSpec
from interlock.runners.mrv1.plugin import SPEC as MRV1
from interlock.testing.checks import check_inherited_claims, load_under_test

pytestmark = pytest.mark.usefixtures("fresh_plugins")

RUNNER = """\
from interlock.runners.mrv1.runner import MRV1Runner


class CountedRunner(MRV1Runner):
    name = "counted"
"""


@pytest.fixture
def factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module holding ``CountedRunner(MRV1Runner)``; its spec is set by each test."""
    (tmp_path / "counted_runner.py").write_text(RUNNER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "counted_runner", raising=False)
    return "counted_runner:CountedRunner"


def counted(factory: str, **declared) -> RunnerSpec:
    spec = RunnerSpec(name="counted", description="mrv1, counted", plugin_api=">=1.0,<2",
                      factory=factory, fallback="mrv1", **declared)
    __import__("counted_runner").CountedRunner.runner_spec = spec
    return spec


def findings(spec: RunnerSpec) -> list[str]:
    return [str(f) for f in check_inherited_claims(load_under_test(Declares(spec), "c"))]


def test_the_base_platforms_and_unsupported_claim_nothing_more(factory: str) -> None:
    spec = counted(factory, platforms=MRV1.platforms, unsupported=MRV1.unsupported)
    assert findings(spec) == []


def test_leaving_out_the_unsupported_features_is_flagged(factory: str) -> None:
    # The plugin guide's snippet without `unsupported=`: the subclass would be handed
    # pipeline-parallel and speculative contexts mrv1's code cannot run.
    (finding,) = findings(counted(factory, platforms=MRV1.platforms))
    assert finding == (
        "claims: counted: counted_runner:CountedRunner runs mrv1's code but its spec claims "
        "more than mrv1 serves: pipeline parallelism; speculative decoding; declare no more "
        "than its spec does (its platforms= and unsupported=, as examples/wrapped-runner-plugin "
        "does)"
    )


def test_more_platform_support_than_the_base_is_flagged() -> None:
    cpu = MRV1.platforms["cpu"]
    base = RunnerSpec(name="base", description="b", plugin_api=">=1.0,<2", factory="m:B",
                      platforms={"cpu": PlatformSupport(cudagraph=["none", "piecewise"],
                                                        requires=["has_triton"])})
    more = RunnerSpec(name="more", description="m", plugin_api=">=1.0,<2", factory="m:M",
                      platforms={"cpu": PlatformSupport(cudagraph=cpu.cudagraph, breakable=True,
                                                        max_tensor_parallel_size=None),
                                 "cuda": MRV1.platforms["cuda"]},
                      unsupported=MRV1.unsupported)
    assert more.claims_beyond(base) == [
        "platform cuda", "cudagraph=full on cpu", "cudagraph=full_decode_only on cpu",
        "cudagraph=full_and_piecewise on cpu", "breakable capture on cpu",
        "cpu without Triton", "tensor_parallel_size any on cpu (base: at most 1)",
    ]
    # The other way: within every platform it serves, only the features `more` excludes.
    assert base.claims_beyond(more) == ["pipeline parallelism", "speculative decoding"]
