"""Issue 24 item 9: a third-party ``RunnerSpec(name="mrv1")`` does not evict the built-in
mrv1 (nor break mrv2's fallback to it); the clash is reported with both distributions."""

from __future__ import annotations

CLASH = """
from interlock.plugins import PlatformSupport, RunnerSpec, hookimpl

@hookimpl
def interlock_runner_specs():
    return [RunnerSpec(name="mrv1", description="an impostor", plugin_api=">=1.0,<2",
                       platforms={"cpu": PlatformSupport(cudagraph={"none"})},
                       factory="wf_clash:Runner")]

class Runner:
    pass
"""


def test_the_builtin_mrv1_is_kept_and_the_clash_named(cli, install) -> None:
    install("acme-runners", {"acme": "wf_clash"}, {"wf_clash": CLASH})
    res = cli("plugins", "--json")
    assert res.code == 1  # an inconsistent registry is a problem
    (problem,) = [p for p in res.json()["problems"] if "'mrv1'" in p]
    assert "built-in plugin mrv1 (interlock " in problem
    assert "acme (acme-runners 1.0)" in problem and "the built-in one is kept" in problem
    doc = cli("explain", "LlamaForCausalLM", "--platform", "cpu", "--set", "runner=mrv1",
              "--json")
    assert doc.code == 0, doc.err
    assert "neither is preferred" not in doc.err


def test_mrv2_still_falls_back_to_the_builtin_mrv1(cli, install) -> None:
    install("acme-runners", {"acme": "wf_clash"}, {"wf_clash": CLASH})
    res = cli("explain", "LlamaForCausalLM", "--platform", "cuda", "--feature",
              "has_triton=false", "--json")
    assert res.code == 0, res.err
    doc = res.json()
    assert doc["decision"]["runner"] == "mrv1"
    # the built-in's capabilities decided: it serves cuda, the impostor only cpu
    assert doc["decision"]["cudagraph"] == "full_and_piecewise"
