"""The runner x mode x breakable matrix with real CUDA graphs (``-m gpu``; skipped without one)."""

from __future__ import annotations

import pytest
import torch
from graph_cases import CAPTURE_SIZES, make_oracle, run_case

from interlock.core.decision import CUDAGRAPH_MODES
from interlock.runners.contract import Decision
from interlock.runners.mrv1.runner import MRV1Runner
from interlock.runners.mrv2.runner import MRV2Runner

RUNNERS = {"mrv1": MRV1Runner, "mrv2": MRV2Runner}
# Blocks of 16, the size the Triton attention kernels are tuned for.
ON_GPU = {"device": "cuda", "block_size": 16}


@pytest.mark.gpu
@pytest.mark.parametrize("breakable", [False, True], ids=["plain", "breakable"])
@pytest.mark.parametrize("mode", CUDAGRAPH_MODES)
@pytest.mark.parametrize("runner", list(RUNNERS))
def test_cuda_graphs_give_the_tokens_of_eager(runner, mode, breakable, llama_oracle):
    eager, _, _ = run_case(
        llama_oracle.path, RUNNERS[runner](), Decision(runner, "none"), **ON_GPU
    )
    decision = Decision(runner, mode, breakable, capture_sizes=CAPTURE_SIZES)
    tokens, routes, report = run_case(llama_oracle.path, RUNNERS[runner](), decision, **ON_GPU)

    assert tokens == eager
    # float32 on the GPU (Triton kernels, TF32 off) still follows transformers' greedy path.
    assert tokens == llama_oracle.tokens
    graphs = report.graphs
    assert graphs.backend == ("none" if mode == "none" else "cuda")
    assert not graphs.failed, graphs.failed
    if mode != "none":
        assert graphs.replays and set(graphs.captured_sizes) <= set(CAPTURE_SIZES)


@pytest.mark.gpu
@pytest.mark.parametrize("runner", list(RUNNERS))
def test_the_debug_backend_can_be_forced_on_a_gpu(runner, llama_oracle, monkeypatch):
    monkeypatch.setenv("INTERLOCK_DEBUG_GRAPHS", "1")
    decision = Decision(runner, "full_and_piecewise", capture_sizes=CAPTURE_SIZES)
    tokens, _, report = run_case(llama_oracle.path, RUNNERS[runner](), decision, **ON_GPU)
    assert report.graphs.backend == "debug"
    assert tokens == llama_oracle.tokens


@pytest.mark.gpu
def test_an_op_cuda_cannot_capture_falls_back_to_eager(llama_oracle, monkeypatch):
    # The torch reference store_kv_cache indexes with a mask (a host sync), which a
    # CUDA graph cannot capture: every capture fails, every step runs eagerly.
    monkeypatch.setenv("INTERLOCK_KERNELS", "torch")
    decision = Decision("mrv1", "full", capture_sizes=CAPTURE_SIZES)
    tokens, _, report = run_case(llama_oracle.path, MRV1Runner(), decision, **ON_GPU)
    assert tokens == llama_oracle.tokens
    assert report.graphs.captured == () and len(report.graphs.failed) == 2 * len(CAPTURE_SIZES)
    assert len(report.fallbacks) == len(report.graphs.failed)
    # Each capture fails for the op's own reason: a failed capture leaves no half-recorded
    # pool behind to fail the next one ("beginAllocateToPool: already recording").
    reasons = set(report.graphs.failed.values())
    assert all("not permitted when stream is capturing" in why for why in reasons), reasons
    # The failed captures leave the device's random generator usable (sampling draws from it).
    assert torch.rand(8, device="cuda").shape == (8,)


# The families with latent attention (DeepSeek V2/V3), DSA's top-k indexer (V3.2, GLM-5) and
# Kimi Linear's recurrent KDA layers: every graph mode captured for real, against transformers.
FAMILIES = ["deepseek_v2", "deepseek_v3", "deepseek_v32", "glm_moe_dsa", "kimi_linear"]
FAMILY_MODES = [("piecewise", False), ("full_and_piecewise", False),
                ("full_and_piecewise", True), ("full", False), ("full_decode_only", False)]
# Mixed prefill/decode batches of latent attention (``mla_attention``) and of KDA's chunked
# prefill have only the torch references, which read each sequence's length on the host: in
# ``full`` mode a mixed batch cannot be captured whole (the copy to the host is refused during
# capture, and the report names it), so those batches run eagerly and decode batches replay.
HOST_DRIVEN_MIXED = {"deepseek_v2", "deepseek_v3", "kimi_linear"}


@pytest.mark.gpu
@pytest.mark.parametrize(("mode", "breakable"), FAMILY_MODES,
                         ids=[f"{m}{'-breakable' if b else ''}" for m, b in FAMILY_MODES])
@pytest.mark.parametrize("runner", list(RUNNERS))
@pytest.mark.parametrize("name", FAMILIES)
def test_each_new_family_captures_every_mode_and_keeps_transformers_tokens(
    name, runner, mode, breakable, graph_models
):
    oracle = make_oracle(graph_models, name)
    eager, _, _ = run_case(oracle.path, RUNNERS[runner](), Decision(runner, "none"), **ON_GPU)
    decision = Decision(runner, mode, breakable, capture_sizes=CAPTURE_SIZES)
    tokens, _, report = run_case(oracle.path, RUNNERS[runner](), decision, **ON_GPU)

    assert tokens == eager
    assert tokens == oracle.tokens
    graphs = report.graphs
    assert graphs.backend == "cuda"
    assert graphs.replays and set(graphs.captured_sizes) <= set(CAPTURE_SIZES)
    if mode == "full" and name in HOST_DRIVEN_MIXED:
        assert graphs.failed and all(key.startswith("full/mixed/") for key in graphs.failed)
        assert all("Cannot copy between CPU and CUDA tensors during CUDA graph capture" in why
                   for why in graphs.failed.values()), graphs.failed
    else:
        assert not graphs.failed, graphs.failed
