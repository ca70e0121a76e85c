"""What measuring on a serving engine's server takes from the flags: the workload and
accuracy prompts, the vLLM found and its query, and the run with a progress bar."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from interlock.commands.measure.output import progress_bar
from interlock.core.platform import TRITON_FACT

if TYPE_CHECKING:
    from interlock.app.query import Query
    from interlock.measure.cells import Cell, EngineWorkload
    from interlock.policy.resolution import Resolution
    from interlock.vllm.version import VllmInstall


def engine_workload(
    args: argparse.Namespace,
) -> tuple[EngineWorkload, list[str], list[str] | None]:
    """What each trial on a server sends, and the accuracy prompts and answers."""
    from interlock.measure.cells import (
        EngineWorkload,
        read_lines_file,
        shipped_accuracy_prompts,
    )

    workload = EngineWorkload(
        concurrency=args.concurrency, input_len=args.input_len, output_len=args.output_len,
        prompts=tuple(read_lines_file(args.prompt_file, "--prompt-file"))
        if args.prompt_file else (),
        requests_per_stream=args.requests_per_stream, trials=args.trials,
        warmup=args.warmup, seed=args.seed, accuracy_tokens=args.accuracy_tokens,
        max_divergence=args.max_divergence,
    )
    prompts = (read_lines_file(args.accuracy_prompts, "--accuracy-prompts")
               if args.accuracy_prompts else shipped_accuracy_prompts())
    answers = (read_lines_file(args.accuracy_answers, "--accuracy-answers")
               if args.accuracy_answers else None)
    return workload, prompts, answers


class EngineSetup:
    """What measuring on `vllm serve` takes besides the cells, read from the flags."""

    def __init__(self, **parts: Any) -> None:
        self.model: str = parts["model"]
        #: The query of running MODEL on that vLLM (vLLM's runners: no capability stage).
        self.query: Query = parts["query"]
        self.workload: EngineWorkload = parts["workload"]
        self.prompts: list[str] = parts["prompts"]
        self.answers: list[str] | None = parts["answers"]
        #: The vLLM release detected (None: not known), and the one whose log is read.
        self.detected: str | None = parts["detected"]
        self.version: str | None = parts["version"]
        #: The vLLM install found (how to launch it), and its Triton for this platform.
        self.install: VllmInstall = parts["install"]
        self.triton: tuple[bool, str] | None = parts["triton"]


def engine_setup(args: argparse.Namespace, asked: Query) -> EngineSetup:
    """The engine workload, the accuracy prompts and answers, and the query of running
    MODEL on the `vllm` on PATH (its version detected: rules may test it, it decides which
    flags the commands carry and which log formats are read). ``asked``: the command line's
    query (``policy diff`` measures with no env binding set)."""
    from interlock.app.query import model_target
    from interlock.commands.vllm import engine_facts
    from interlock.core.errors import PolicyError
    from interlock.vllm.model import vllm_model
    from interlock.vllm.releases import known
    from interlock.vllm.stage import ReleaseStage
    from interlock.vllm.version import find_install, find_vllm

    given = getattr(args, "vllm", None)
    if given is not None and not os.access(given, os.X_OK):
        raise PolicyError(f"--vllm {given}: not an executable file")
    executable = given or find_vllm()
    if executable is None:
        raise PolicyError("--engine vllm: vllm is not on PATH: install vLLM or activate its "
                          "environment, or give --vllm PATH")
    install = find_install(executable)
    workload, prompts, answers = engine_workload(args)
    model = vllm_model(args.model)
    sources = dict(asked.sources)
    engine, engine_sources = engine_facts(install)
    sources.update(engine_sources)
    features = dict(asked.features)
    triton = install.triton_fact(asked.platform is not None, features)
    if triton is not None:
        features[TRITON_FACT], sources[f"features.{TRITON_FACT}"] = triton
    rel = known(engine["vllm"]) if "vllm" in engine else None
    query = replace(asked, model=model_target(model.readable), features=features,
                    sources=sources, engine=engine, overrides={}, executed_by="vllm",
                    stage=ReleaseStage(None if rel is None else rel.version))
    return EngineSetup(model=model.argument, query=query, workload=workload,
                       prompts=prompts, answers=answers, detected=engine.get("vllm"),
                       version=args.vllm_version or engine.get("vllm"), install=install,
                       triton=triton)


def measure_on_engine(
    args: argparse.Namespace, setup: EngineSetup, base: Resolution, cells: list[Cell],
    skipped: list[dict[str, Any]], factors: dict[str, list[Any]], policy: dict[str, Any],
    command: str, pick: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the cells on `vllm serve` with a progress bar; the record (``pick``: the
    policy's pick among the cells, None for ``policy diff``'s old and new)."""
    from interlock import decision_log
    from interlock.measure.vllm_serve import measure_vllm

    bar = progress_bar()
    try:
        return measure_vllm(
            setup.model, base, cells, skipped, factors, setup.workload, policy=policy,
            accuracy_prompts=setup.prompts, accuracy_answers=setup.answers,
            startup_timeout=args.startup_timeout, vllm_version=setup.version,
            launch=setup.install.launch, port=args.port,
            decision_log=decision_log.log_path(args.decision_log, args.settings),
            progress=bar, command=command, pick=pick,
        )
    finally:
        if bar is not None:
            bar.close()
