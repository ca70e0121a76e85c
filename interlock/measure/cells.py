"""The trials of ``policy measure --engine vllm|interlock``: the factorial measured on a
serving engine's own server.

Each cell of the design is a decision with its varied fields forced, run as a server of its
own on a port of its own (``vllm serve``: :mod:`interlock.measure.vllm_serve`; ``policy
serve``: :mod:`interlock.measure.policy_serve`). Trials run in the blocks of
:mod:`interlock.measure.design`; each trial starts the cell's server, waits for ``/health``
(bounded), checks its startup log against the cell's decision (a server that does not run
the cell's decision stops the measurement, naming the cell), drives it with streaming
``/v1/completions`` requests at ``concurrency`` and stops it before the next trial. Times
are taken per streamed chunk, as ``vllm bench serve`` takes them: TTFT is the first
chunk's arrival after the request, TPOT the rest of the request's time per output token
after the first, ITL the gaps between chunks.

The first start of every cell also answers the accuracy prompts greedily
(``temperature 0``): a cell whose answers differ from the first cell's on more than
``max_divergence`` of the prompts is flagged; with reference answers each cell also gets
an exact-match score. The analysis is ``policy measure``'s own
(:func:`interlock.measure.analysis.analyse`), so is the record's layout, plus ``engine`` and
``accuracy``.
"""

from __future__ import annotations

import datetime
import http.client
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interlock.core.errors import InputError, PolicyError
from interlock.measure.client import complete, prompt_ids, run_trial

if TYPE_CHECKING:
    from interlock.vllm.process import EngineProcess


@dataclass(frozen=True)
class EngineWorkload:
    """What each trial sends: ``concurrency`` streams, each ``requests_per_stream`` requests
    of ``input_len`` prompt tokens (or the prompt file's texts, in turn) and ``output_len``
    generated tokens (end of sequence ignored)."""

    concurrency: int = 1
    input_len: int = 32
    output_len: int = 32
    prompts: tuple[str, ...] = ()
    requests_per_stream: int = 2
    trials: int = 5
    warmup: int = 1
    seed: int = 0
    accuracy_tokens: int = 16
    max_divergence: float = 0.1

    def __post_init__(self) -> None:
        problems = []
        if self.output_len < 2:
            problems.append(f"output_len {self.output_len} must be >= 2 (TPOT needs two tokens)")
        if self.trials < 2:
            problems.append(f"trials {self.trials} must be >= 2 (an interval needs two)")
        if not 0 <= self.max_divergence <= 1:
            problems.append(f"max_divergence {self.max_divergence} must be a share, 0..1")
        if problems:
            raise InputError("workload: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        # policy measure's record layout: what render_text and the plot read.
        data.update(batch_sizes=[self.concurrency], max_tokens=self.output_len,
                    prompt_token_ids=prompt_ids(self.input_len), prompts=list(self.prompts))
        return data


def shipped_accuracy_prompts() -> list[str]:
    """The ~50 short prompts shipped for the accuracy gate."""
    text = resources.files("interlock.measure").joinpath("accuracy_prompts.json").read_text()
    return list(json.loads(text))


def read_lines_file(path: str, what: str) -> list[str]:
    """A file of prompts or answers: a JSON list of strings, or one per line."""
    from interlock.core.files import FileProblem, decode_utf8, read_regular

    try:
        text = decode_utf8(read_regular(path, 16 * 1024 * 1024), path)
    except FileProblem as exc:
        raise InputError(f"{what} {path}: {exc.detail}") from None
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{what} {path}: not a JSON list: {exc}") from None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise InputError(f"{what} {path}: a JSON file must be a list of strings")
    else:
        items = [line for line in text.splitlines() if line.strip()]
    if not items:
        raise InputError(f"{what} {path}: holds no entries")
    return items


@dataclass
class Cell:
    """One configuration: its forced levels, resolution and ``vllm serve`` command."""

    id: str
    levels: dict[str, Any]
    resolution: Any
    command: Any
    port: int = 0
    record: dict[str, Any] = field(default_factory=dict)
    verification: dict[str, Any] | None = None
    answers: list[str] | None = None

    @property
    def label(self) -> str:
        from interlock.core.fields import show_scalar

        return " ".join(f"{k}={show_scalar(v)}" for k, v in self.levels.items())


def gpu_name() -> str | None:
    """The GPU, as ``nvidia-smi`` or ``rocm-smi`` names it, when either is here."""
    for tool, args in (("nvidia-smi", ["--query-gpu=name", "--format=csv,noheader"]),
                       ("rocm-smi", ["--showproductname", "--csv"])):
        if shutil.which(tool) is None:
            continue
        try:
            out = subprocess.run([tool, *args], capture_output=True, text=True, timeout=20,
                                 check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        if lines:
            return lines[-1] if tool == "rocm-smi" else lines[0]
    return None


Progress = Callable[[int, int], None]


def check_answers(prompts: Sequence[str], answers: Sequence[str] | None) -> None:
    """--accuracy-answers gives one answer per accuracy prompt, or none at all."""
    if answers is not None and len(answers) != len(prompts):
        raise InputError(
            f"--accuracy-answers has {len(answers)} answers for {len(prompts)} accuracy "
            "prompts; give one per prompt"
        )


@dataclass(frozen=True)
class Trials:
    """What ``run_cells`` ran: the blocks' order of the cells, a sample per trial, and the
    seconds they took."""

    order: list[list[int]]
    samples: list[dict[str, Any]]
    seconds: float


def run_cells(
    cells: list[Cell], model: str, workload: EngineWorkload, accuracy_prompts: Sequence[str],
    startup_timeout: float, progress: Progress | None,
    start: Callable[[Cell, list[str], str], EngineProcess], what: str,
) -> Trials:
    """Every trial of the design, in its blocks' order: each starts its cell's ``what``
    (``engine``, ``server``) with ``start(cell, argv, name)``, checks its startup log
    against the cell's decision, asks the accuracy prompts the first time, runs the trial
    and stops it. A failure is an ``EngineFailed`` naming the cell, with the process's last
    output."""
    from interlock.measure.design import block_order
    from interlock.vllm.process import EngineFailed

    blocks = workload.warmup + workload.trials
    order = block_order(len(cells), blocks, workload.seed)
    total, done = len(cells) * blocks, 0
    if progress is not None:
        progress(0, total)
    samples: list[dict[str, Any]] = []
    started = time.perf_counter()
    for block, row in enumerate(order):
        for position, index in enumerate(row):
            cell = cells[index]
            name = f"cell {cell.id} ({cell.label}) on port {cell.port}"
            process = start(cell, [*cell.command.argv, "--host", "127.0.0.1", "--port",
                                   str(cell.port)], name)
            try:
                boot = time.perf_counter()
                verdict = process.wait_ready(startup_timeout)
                startup_s = time.perf_counter() - boot
                if not verdict.verified:
                    raise EngineFailed(f"{name}: the {what} does not run the cell's decision: "
                                       + "; ".join(verdict.problems))
                if cell.verification is None:
                    cell.verification = verdict.to_dict()
                if cell.answers is None:
                    cell.answers = [complete(cell.port, model, p, workload.accuracy_tokens)
                                    for p in accuracy_prompts]
                sample = run_trial(cell.port, model, workload)
                if not process.alive():
                    raise PolicyError(f"the {what} exited before the trial's end")
            except (OSError, http.client.HTTPException, PolicyError) as exc:
                code = process.exit_status(wait=1.0)
                died = "" if code is None else f"the {what} exited (status {code}) mid-run: "
                raise EngineFailed(f"{name}: {died}{exc}; its last output: "
                                   f"{process.output()}") from None
            finally:
                process.stop()
            samples.append({
                "config": cell.id, "batch_size": workload.concurrency,
                "block": block - workload.warmup, "position": position,
                "warmup": block < workload.warmup, "startup_s": round(startup_s, 3), **sample,
            })
            done += 1
            if progress is not None:
                progress(done, total)
    return Trials(order, samples, time.perf_counter() - started)


def evidence_record(
    base: Any, cells: list[Cell], skipped: list[dict[str, Any]],
    factors: Mapping[str, Sequence[Any]], workload: EngineWorkload, trials: Trials, *,
    model: str, policy: dict[str, Any], command: str | None, created: datetime.datetime,
    pick: dict[str, Any] | None, launched: Callable[[list[str]], list[str]],
    software: dict[str, Any], engine: dict[str, Any], accuracy_prompts: Sequence[str],
    accuracy_answers: Sequence[str] | None,
) -> dict[str, Any]:
    """The evidence record of a design run on server processes (vLLM's or policy
    serve's): ``software`` and ``engine`` (its name and version) say which; ``launched``
    gives the argv each cell's process was started with."""
    from interlock.measure import _balance, _cpu_model
    from interlock.measure.analysis import analyse
    from interlock.measure.harness import config_hash, context_record

    ids = [c.id for c in cells]
    order = trials.order
    return {
        "schema": "interlock-evidence/1",
        "created": created.isoformat(timespec="seconds"),
        "command": command,
        "machine": {
            "platform": base.context.platform, "device_arch": base.context.device_arch,
            "device_name": gpu_name() or _cpu_model(), "cpu_model": _cpu_model(),
            "cpu_count": os.cpu_count(),
        },
        "software": software,
        "engine": {**engine, "gpu": gpu_name(), "trials_s": round(trials.seconds, 3)},
        "policy": policy,
        "model": {"name": model, "architecture": base.context.architecture,
                  "config_sha256": _config_sha(model, config_hash)},
        "context": context_record(base),
        "workload": workload.to_dict(),
        "factors": {name: jsonable(list(levels)) for name, levels in factors.items()},
        "base_decision": base.decision.to_dict(),
        **({"pick": pick} if pick is not None else {}),
        "configurations": [
            {
                "id": c.id, "label": c.label, "levels": jsonable(c.levels),
                "decision": c.resolution.decision.to_dict(), "target": c.command.decision,
                "argv": launched(c.command.argv), "env": c.command.env, "port": c.port,
                "decision_record": c.record["id"], "verification": c.verification,
            }
            for c in cells
        ],
        "skipped": skipped,
        "order": {
            "design": "blocks; each a row of a balanced Latin square (Williams) over the cells; "
            "every trial starts its cell's server and stops it",
            "seed": workload.seed,
            "units": [{"config": cid, "batch_size": workload.concurrency} for cid in ids],
            "blocks": order,
            "warmup_blocks": workload.warmup,
            **_balance(order[workload.warmup:], len(ids)),
        },
        "samples": trials.samples,
        "analysis": analyse(trials.samples, ids, factors, [workload.concurrency],
                            complete=not skipped, seed=workload.seed,
                            pick=None if pick is None else pick["config"]),
        "accuracy": accuracy(cells, accuracy_prompts, accuracy_answers, workload),
    }


def accuracy(
    cells: Sequence[Cell],
    prompts: Sequence[str],
    answers: Sequence[str] | None,
    workload: EngineWorkload,
) -> dict[str, Any]:
    """Each cell's greedy answers against the first cell's: the share of prompts whose
    first ``accuracy_tokens`` tokens differ, flagged over ``max_divergence``; with reference
    answers, the share whose answer (first line, stripped) matches exactly."""
    reference = cells[0].answers or [] if cells else []
    result: dict[str, Any] = {
        "prompts": len(prompts), "tokens": workload.accuracy_tokens,
        "max_divergence": workload.max_divergence, "reference": cells[0].id if cells else None,
        "cells": {},
    }
    for cell in cells:
        got = cell.answers or []
        differing = [i for i, (a, b) in enumerate(zip(got, reference, strict=True)) if a != b]
        share = len(differing) / len(prompts) if prompts else 0.0
        entry: dict[str, Any] = {
            "divergence": round(share, 4),
            "diverging_prompts": differing,
            "flagged": share > workload.max_divergence,
        }
        if answers is not None:
            hits = sum(_first_line(g) == _first_line(a) for g, a in zip(got, answers,
                                                                       strict=True))
            entry["exact_match"] = round(hits / len(answers), 4)
        result["cells"][cell.id] = entry
    result["flagged"] = [cid for cid, e in result["cells"].items() if e["flagged"]]
    return result


def _first_line(text: str) -> str:
    stripped = text.strip()
    return stripped.splitlines()[0].strip() if stripped else ""


def _config_sha(model: str, config_hash: Callable[[str], str]) -> str:
    import hashlib

    path = Path(model)
    if path.is_dir() and (path / "config.json").is_file():
        return config_hash(str(path))
    return hashlib.sha256(model.encode()).hexdigest()


def interlock_version() -> str:
    import interlock

    return str(interlock.__version__)


def jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    return value
