"""Every runner x every cudagraph mode x breakable, on CPU through the debug backend.

Greedy tokens must equal transformers' (and so eager's) for batches whose
sizes fall on, between and above the capture sizes, across steps that mix
prefill chunks and decodes.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from graph_cases import CAPTURE_SIZES, run_case

from interlock.core.decision import CUDAGRAPH_MODES
from interlock.core.env import GRAPHS_FAIL_CAPTURE
from interlock.kernels.native import unavailable as native_unavailable
from interlock.runners.contract import Decision
from interlock.runners.graphs.modes import Strategy, strategy_for
from interlock.runners.graphs.runner import RunnerError
from interlock.runners.mrv1.runner import MRV1Runner
from interlock.runners.mrv2.runner import MRV2Runner

RUNNERS = {"mrv1": MRV1Runner, "mrv2": MRV2Runner}
# What a float32 CPU run captures with: tapes of native kernels where they are built.
CPU_GRAPHS = "debug" if native_unavailable("cpu") else "native"


@pytest.mark.parametrize("breakable", [False, True], ids=["plain", "breakable"])
@pytest.mark.parametrize("mode", CUDAGRAPH_MODES)
@pytest.mark.parametrize("runner", list(RUNNERS))
def test_greedy_tokens_equal_transformers_in_every_mode(runner, mode, breakable, llama_oracle):
    decision = Decision(runner, mode, breakable, capture_sizes=CAPTURE_SIZES)
    tokens, routes, report = run_case(llama_oracle.path, RUNNERS[runner](), decision)

    assert tokens == llama_oracle.tokens
    graphs = report.graphs
    assert graphs.backend == ("none" if mode == "none" else CPU_GRAPHS)
    assert not graphs.failed and not report.fallbacks
    largest = max(CAPTURE_SIZES)
    kinds = {
        "on" if n in CAPTURE_SIZES else "above" if n > largest else "between"
        for n, *_ in routes.steps
    }
    assert kinds == {"on", "between", "above"}
    assert {decode for _, _, decode, _ in routes.steps} == {True, False}, "mixed and decode steps"
    for num_tokens, _, decode, served in routes.steps:
        strategy = strategy_for(mode, breakable, decode)
        if strategy is Strategy.EAGER or num_tokens > largest:
            assert served.startswith("eager: "), served
            continue
        # Padded up to the nearest capture size: a key of that size and this strategy.
        size = min(s for s in CAPTURE_SIZES if s >= num_tokens)
        assert served.startswith(f"{strategy.value}/") and f"/{size}t" in served, served


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_captured_programs_break_at_every_attention(runner, llama_oracle):
    layers = 2
    shapes = {}
    for mode, breakable in (("full", False), ("piecewise", False), ("full", True)):
        decision = Decision(runner, mode, breakable, capture_sizes=(2,))
        _, _, report = run_case(llama_oracle.path, RUNNERS[runner](), decision)
        shapes[mode, breakable] = {(g.segments, g.breaks) for g in report.graphs.captured}
    assert shapes["full", False] == {(1, 0)}
    # Planned pieces and breaks found during capture cut at the same points.
    assert shapes["piecewise", False] == shapes["full", True] == {(layers + 1, layers)}


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_a_failed_capture_runs_that_size_eagerly_and_is_reported(
    runner, llama_oracle, monkeypatch
):
    monkeypatch.setenv(GRAPHS_FAIL_CAPTURE.name, "2")
    decision = Decision(runner, "full_and_piecewise", capture_sizes=CAPTURE_SIZES)
    tokens, routes, report = run_case(llama_oracle.path, RUNNERS[runner](), decision)

    assert tokens == llama_oracle.tokens
    failed = report.graphs.failed
    assert failed and all("/2t" in key for key in failed)
    assert not {g.key for g in report.graphs.captured} & set(failed)
    assert all(f"forced by ${GRAPHS_FAIL_CAPTURE.name}" in why for why in failed.values())
    assert report.fallbacks and report.fallbacks[0].endswith("batches of this size run eagerly")
    assert 2 not in report.captured_sizes and 4 in report.captured_sizes
    failed_steps = [key for *_, key in routes.steps if key == "eager: capture failed"]
    assert failed_steps, "a batch of size 2 ran eagerly"
    assert any("capture of" in why for why in report.graphs.eager_steps)


def test_an_invalid_forced_failure_list_names_the_value(llama_oracle, monkeypatch):
    monkeypatch.setenv(GRAPHS_FAIL_CAPTURE.name, "two")
    with pytest.raises(ValueError, match=f"{GRAPHS_FAIL_CAPTURE.name}='two' is invalid"):
        run_case(llama_oracle.path, MRV1Runner(), Decision("mrv1", "full"))


def test_moe_layers_under_full_and_breakable_graphs(moe_oracle):
    for runner, breakable in (("mrv1", False), ("mrv2", True)):
        decision = Decision(runner, "full_and_piecewise", breakable, capture_sizes=CAPTURE_SIZES)
        tokens, _, _ = run_case(moe_oracle.path, RUNNERS[runner](), decision)
        assert tokens == moe_oracle.tokens


def test_the_runner_comes_from_its_plugin_when_none_is_given(llama_oracle):
    decision = Decision("mrv2", "full_decode_only", capture_sizes=CAPTURE_SIZES)
    tokens, _, report = run_case(llama_oracle.path, None, decision)
    assert tokens == llama_oracle.tokens
    assert report.runner == "mrv2"
    assert "mrv2_prepare_inputs" in {k.op for k in report.kernels}


def test_compile_is_refused_where_the_spec_does_not_serve_it(llama_oracle):
    for runner in RUNNERS.values():
        with pytest.raises(RunnerError, match="does not serve torch.compile on cpu"):
            run_case(llama_oracle.path, runner(), Decision(runner.name, "full", compile=True))


class CompilingMRV1(MRV1Runner):
    """mrv1 declaring torch.compile on cpu too, to run the compile path here."""

    runner_spec = dataclasses.replace(
        MRV1Runner.runner_spec,
        platforms={
            **MRV1Runner.runner_spec.platforms,
            "cpu": dataclasses.replace(MRV1Runner.runner_spec.platforms["cpu"], compile=True),
        },
    )


@pytest.mark.slow
def test_compile_compiles_each_graph_segment_before_capture(llama_oracle, monkeypatch):
    compiled = []

    def dynamo_without_codegen(fn, **options):
        compiled.append(fn)
        return real_compile(fn, backend="eager", **options)  # traced by dynamo, run as traced

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", dynamo_without_codegen)
    decision = Decision("mrv1", "full_and_piecewise", compile=True, capture_sizes=(2,))
    tokens, routes, report = run_case(llama_oracle.path, CompilingMRV1(), decision)
    assert tokens == llama_oracle.tokens
    # One full graph and the three planned pieces of the 2-layer model, each compiled once.
    assert len(compiled) == 1 + 3
    assert {g.key for g in report.graphs.captured} == {"full/decode/2t2s", "piecewise/any/2t2s"}
    with pytest.raises(RunnerError, match="torch.compile with breakable capture"):
        run_case(llama_oracle.path, CompilingMRV1(), dataclasses.replace(decision, breakable=True))


def test_a_decision_for_another_runner_is_refused(llama_oracle):
    with pytest.raises(RunnerError, match="it names runner 'mrv2', but this is 'mrv1'"):
        run_case(llama_oracle.path, MRV1Runner(), Decision("mrv2", "full"))
