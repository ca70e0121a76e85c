"""What rank 0 tells the other ranks, as JSON bytes (never pickle: nothing received runs code).

Two kinds of message: ``load`` (the model, KV cache, decision and runner factory each
rank loads, once) and ``step`` (one scheduled batch); ``stop`` ends the workers.
"""

from __future__ import annotations

import json
from dataclasses import asdict, astuple
from typing import Any

from interlock.runners.contract import (
    Decision,
    KVCacheSpec,
    ModelSpec,
    Sampling,
    ScheduledBatch,
    ScheduledSequence,
)

LOAD, STEP, STOP = "load", "step", "stop"


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def decode(payload: bytes) -> dict[str, Any]:
    message = json.loads(payload)
    if not isinstance(message, dict) or message.get("op") not in (LOAD, STEP, STOP):
        raise ValueError(f"not a tensor-parallel message: {payload[:80]!r}")
    return message


def load_message(
    model: ModelSpec, kv_cache: KVCacheSpec, decision: Decision, factory: str
) -> dict[str, Any]:
    """Everything a rank needs to load its shard; the model config is resolved there from
    ``model.name`` (a path must exist on every machine)."""
    spec = {k: v for k, v in asdict(model).items() if k != "config"}
    return {
        "op": LOAD,
        "model": spec,
        "kv_cache": asdict(kv_cache),
        "decision": asdict(decision),
        "factory": factory,
    }


def load_parts(message: dict[str, Any]) -> tuple[dict[str, Any], KVCacheSpec, Decision, str]:
    """(ModelSpec fields without config, KV cache, decision, runner factory)."""
    decision = dict(message["decision"])
    if decision.get("capture_sizes") is not None:
        decision["capture_sizes"] = tuple(decision["capture_sizes"])
    return (
        message["model"],
        KVCacheSpec(**message["kv_cache"]),
        Decision(**decision),
        message["factory"],
    )


def step_message(batch: ScheduledBatch) -> dict[str, Any]:
    return {
        "op": STEP,
        "seqs": [
            [
                s.request_id, s.token_ids, s.start_position, s.block_table,
                list(astuple(s.sampling)), s.step, s.sample, s.state_slot,
                s.prompt_token_ids, s.output_token_ids,
            ]
            for s in batch.sequences
        ],
        "finished": batch.finished_request_ids,
    }


def step_batch(message: dict[str, Any]) -> ScheduledBatch:
    return ScheduledBatch(
        tuple(
            ScheduledSequence(
                request_id=rid,
                token_ids=tuple(tokens),
                start_position=start,
                block_table=tuple(table),
                sampling=Sampling(*sampling),
                step=step,
                sample=sample,
                state_slot=slot,
                prompt_token_ids=tuple(prompt),
                output_token_ids=tuple(output),
            )
            for rid, tokens, start, table, sampling, step, sample, slot, prompt, output
            in message["seqs"]
        ),
        tuple(message["finished"]),
    )
