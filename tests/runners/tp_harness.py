"""Tensor-parallel parity harness: the same engine runs on every rank of a group started
once, each rank scheduling the same requests (the scheduler is deterministic), so many
models and decisions are checked in one group without rank 0's broadcast."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from interlock.runners.batching.kv_cache import plan_kv_cache
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.batching.step_loop import StepLoop
from interlock.runners.contract import Decision, ModelSpec
from interlock.runners.model.checkpoint import resolve_model
from interlock.runners.mrv1.runner import MRV1Runner
from interlock.runners.mrv2.runner import MRV2Runner

RUNNERS = {"mrv1": MRV1Runner, "mrv2": MRV2Runner}
NEW_TOKENS = 6
# Job: (model path or "demo", runner, cudagraph mode, scenario "alone" or "batch").
Job = tuple[str, str, str, str]


def build_engine(model: str, runner: str, mode: str, tp: int, scenario: str) -> StepLoop:
    config = resolve_model(model).config
    spec = ModelSpec(
        name=model, config=config, dtype="float32", device="cpu", max_model_len=64,
        max_num_seqs=4, max_num_batched_tokens=8, tensor_parallel_size=tp,
    )
    # The batch scenario runs short of blocks: requests wait and are preempted.
    blocks = 24 if scenario == "batch" else 64
    kv = plan_kv_cache(spec, 4, num_blocks=blocks)
    return StepLoop(spec, kv, RUNNERS[runner](), Decision(runner=runner, cudagraph=mode))


def generate(engine: StepLoop, prompts: Sequence[Sequence[int]], scenario: str) -> list[list[int]]:
    """Greedy tokens of every prompt: one request at a time ("alone"), or arriving every
    third step into a continuous batch with chunked prefills ("batch")."""
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    requests = [engine.make_request(p, params) for p in prompts]
    if scenario == "alone":
        for request in requests:
            engine.add_request(request)
            while engine.has_unfinished():
                engine.step()
    else:
        pending = list(requests)
        steps = 0
        while engine.has_unfinished() or pending:
            if pending and steps % 3 == 0:
                engine.add_request(pending.pop(0))
            engine.step()
            steps += 1
    return [list(r.output_token_ids) for r in requests]


def run_job(job: Job, tp: int, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    model, runner, mode, scenario = job
    return generate(build_engine(model, runner, mode, tp, scenario), prompts, scenario)


def rank_main(rank: int, size: int, port: int, jobs: list[Job], prompts: list[list[int]],
              results: Any) -> None:
    """One rank: join the group, run every job; rank 0 sends (job, tokens or error)."""
    from interlock.runners.parallel.distributed import (
        Rendezvous,
        connect_store,
        join_control,
        join_tensor_parallel,
    )
    from interlock.runners.parallel.group import set_current

    torch.set_num_threads(1)
    rdzv = Rendezvous("127.0.0.1", port, rank, size, rank, size, rank == 0, "test")
    store = connect_store(rdzv, 60)
    join_control(rdzv, store, 60)
    set_current(join_tensor_parallel(rdzv, torch.device("cpu"), 60))
    for job in jobs:
        try:
            tokens: Any = run_job(job, size, prompts)
        except Exception as exc:  # noqa: BLE001 - reported per job, not a crash of the group
            tokens = f"{type(exc).__name__}: {exc}"
        if rank == 0:
            results.put((job, tokens))
    if rank == 0:
        results.put(None)
        results.close()
        results.join_thread()  # the queue's feeder thread must flush before the exit below
    os._exit(0)  # skip interpreter teardown of the group
