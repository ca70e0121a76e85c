"""``policy measure``'s engine, for notebooks too: ``interlock.measure.run(...)`` measures a model
under several decisions and returns the evidence record the command writes.

    from interlock.measure import Workload, run
    record = run("demo", vary={"runner": ["mrv1", "mrv2"], "cudagraph": ["none", "full"]},
                 workload=Workload(max_tokens=32, trials=5))
    record["analysis"]["batch_sizes"]["1"]["effects"]["tpot_ms"]

The record is plain JSON data; its layout is
:class:`interlock.policy.evidence.EvidenceRecord` (what ``policy check`` validates).
"""

from __future__ import annotations

import datetime
import os
import platform as pyplatform
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from interlock.measure.harness import OVERHEAD_LIMIT, Workload
from interlock.runners.model.sources import DEMO

if TYPE_CHECKING:
    from interlock.app.query import Query
    from interlock.core.env import Settings
    from interlock.policy.model import Policy

__all__ = ["OVERHEAD_LIMIT", "Workload", "compare", "measure", "run"]

#: ``progress(done, total)`` after each trial; ``progress(0, total)`` once before the first.
Progress = Callable[[int, int], None]


def run(
    model: str | os.PathLike[str] = DEMO,
    *,
    vary: Mapping[str, Sequence[Any]] | None = None,
    workload: Workload | None = None,
    policy: Sequence[str | os.PathLike[str]] | None = None,
    platform: str | None = None,
    device_arch: str | None = None,
    features: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    dtype: str = "auto",
    load_format: str = "auto",
    progress: Progress | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """Measure ``model`` under every combination of ``vary`` (decision field -> levels, typed
    as in a policy); the other fields are the policy's decision for this machine (layered
    ``policy`` files, the process environment's bindings and ``env``, ``overrides``).
    Returns the record. Raises ``PolicyError`` for policy errors, ``InputError`` (a
    ``ValueError``) for a bad workload, ``ModelError`` for a model that cannot run."""
    from interlock.app.query import Query, model_target, process_env
    from interlock.core.env import Settings
    from interlock.core.errors import PolicyError
    from interlock.policy.loader import load_policy

    # The environment, read once here: the decisions and every model loaded under them.
    settings = Settings.read()
    factors = design_factors(vary, overrides)
    loaded_policy = load_policy(policy)
    process, sources = process_env(loaded_policy, settings.environ)
    for name, value in (env or {}).items():
        if name not in loaded_policy.env:
            raise PolicyError(
                f"env {name}: the policy binds no such variable; declared: "
                f"{', '.join(loaded_policy.env) or 'none'}"
            )
        process[name] = value
        sources[f"env.{name}"] = "given"
    query = Query(
        model=model_target(model), platform=platform, device_arch=device_arch,
        features=dict(features or {}), env=process, sources=sources,
        overrides=dict(overrides or {}), runs_here=True,
    )
    return measure_query(loaded_policy, query, os.fspath(model), factors,
                         workload=workload or Workload(), dtype=dtype, load_format=load_format,
                         progress=progress, command=command, settings=settings)


def design_factors(
    vary: Mapping[str, Sequence[Any]] | None, overrides: Mapping[str, Any] | None
) -> dict[str, list[Any]]:
    """``vary``'s levels typed as in a policy: at least two distinct ones per field, and no
    field both varied and overridden (a ``PolicyError`` naming it)."""
    from interlock.core.decision import check_field
    from interlock.core.errors import PolicyError

    factors: dict[str, list[Any]] = {}
    for name, levels in (vary or {}).items():
        try:
            typed = [check_field(name, level) for level in levels]
        except ValueError as exc:
            raise PolicyError(f"--vary {exc}") from None
        if len(typed) < 2 or len(set(typed)) != len(typed):
            raise PolicyError(
                f"--vary {name}: give at least two distinct levels (got {list(levels)})"
            )
        factors[name] = typed
    clashing = sorted(set(factors) & set(overrides or {}))
    if clashing:
        raise PolicyError(f"{', '.join(clashing)}: both varied and set with --set; choose one")
    return factors


def measure_query(
    policy: Policy, query: Query, model: str, factors: Mapping[str, list[Any]], *,
    workload: Workload, dtype: str, load_format: str, progress: Progress | None,
    command: str | None, settings: Settings,
) -> dict[str, Any]:
    """``run`` for a query already asked (``policy measure`` builds it from its flags):
    ``model`` as the user named it, ``factors`` from :func:`design_factors`, ``settings``
    the environment read where the command started."""
    from interlock.measure.harness import resolve_design
    from interlock.measure.pick import policy_pick
    from interlock.plugins import load_registry

    base, configs, skipped = resolve_design(policy, query, factors,
                                            load_registry(settings.environ))
    return measure(
        model, base, configs, skipped, factors, workload, policy=policy.stamp(),
        dtype=dtype, load_format=load_format, progress=progress, command=command,
        settings=settings,
        pick=policy_pick(base, [(c.id, c.resolution) for c in configs], list(factors)),
    )


def compare(
    model: str | os.PathLike[str],
    old: Any,
    new: Any,
    *,
    workload: Workload | None = None,
    dtype: str = "auto",
    load_format: str = "auto",
    progress: Progress | None = None,
    command: str | None = None,
    settings: Settings | None = None,
) -> tuple[Any, Any, dict[str, Any] | None]:
    """``(old resolution, new resolution, record)``: the decisions two policies make for
    running ``model`` here (env bindings unset, the runners' capabilities applied), measured
    side by side as the levels ``old`` and ``new`` of a factor ``policy`` when they differ
    (the record is None when they decide alike); ``settings``: the environment as read where
    the caller started (None: read here)."""
    from interlock.app.query import Query, decide_query, model_target
    from interlock.core.env import Settings
    from interlock.measure.harness import Config
    from interlock.plugins import load_registry

    settings = settings or Settings.read()
    plugins = load_registry(settings.environ)
    model = os.fspath(model)
    query = Query(model=model_target(model), runs_here=True)
    before = decide_query(old, query, plugins=plugins)
    after = decide_query(new, query, plugins=plugins)
    if before.decision == after.decision:
        return before, after, None
    configs = [Config("old", {"policy": "old"}, before), Config("new", {"policy": "new"}, after)]
    record = measure(
        model, before, configs, [], {"policy": ["old", "new"]}, workload or Workload(),
        policy={"old": old.stamp(), "new": new.stamp()}, dtype=dtype,
        load_format=load_format, progress=progress, command=command, settings=settings,
    )
    return before, after, record


def measure(
    model: str,
    base: Any,
    configs: Sequence[Any],
    skipped: list[dict[str, Any]],
    factors: Mapping[str, Sequence[Any]],
    workload: Workload,
    *,
    policy: dict[str, Any],
    dtype: str,
    load_format: str,
    progress: Progress | None,
    command: str | None,
    settings: Settings,
    pick: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Load ``configs`` (resolutions of ``model``), run the trials and build the record;
    ``pick``: the policy's pick (:func:`interlock.measure.pick.policy_pick`), None when the
    configurations are not the policy's alternatives (``policy diff --measure``)."""
    from interlock.app.query import model_target
    from interlock.measure.analysis import analyse
    from interlock.measure.harness import (
        config_hash,
        context_record,
        load_configs,
        prompt_token_ids,
        run_trials,
    )
    from interlock.runners.model.checkpoint import resolve_model

    # A named model or a GGUF file is read from its converted directory.
    target = model_target(model)
    source = resolve_model(target)
    digest = config_hash(target)
    prompt = prompt_token_ids(workload, source)
    created = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()
    loaded = load_configs(
        target, configs, workload, len(prompt), dtype=dtype, load_format=load_format,
        max_position=source.config.max_position_embeddings, settings=settings,
    )
    total = len(configs) * len(workload.batch_sizes) * (workload.warmup + workload.trials)
    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    if progress is not None:
        progress(0, total)
    started = time.perf_counter()
    order, samples = run_trials(loaded, workload, prompt, step)
    elapsed = time.perf_counter() - started
    measured = [s for s in samples if not s["warmup"]]
    harness_ms = sum(s["overhead_ms"] for s in measured)
    wall_ms = sum(s["wall_ms"] for s in measured)
    ids = [c.id for c in configs]
    return {
        "schema": "interlock-evidence/1",
        "created": created.isoformat(timespec="seconds"),
        "command": command,
        "machine": _machine(base.context, load_before),
        "software": _software(),
        "policy": policy,
        "model": {
            "name": model,
            "architecture": base.context.architecture,
            "config_sha256": digest,
            "dtype": loaded[0].llm.report().dtype if loaded else dtype,
            "load_format": load_format,
        },
        "context": context_record(base),
        "workload": {**workload.to_dict(), "prompt_token_ids": prompt},
        "factors": {name: _jsonable(levels) for name, levels in factors.items()},
        "base_decision": base.decision.to_dict(),
        **({"pick": pick} if pick is not None else {}),
        "configurations": [
            {
                "id": c.config.id,
                "label": c.config.label,
                "levels": {k: _jsonable(v) for k, v in c.config.levels.items()},
                "decision": c.config.resolution.decision.to_dict(),
                "load_s": round(c.load_s, 3),
            }
            for c in loaded
        ],
        "skipped": skipped,
        "order": {
            "design": "blocks; each a row of a balanced Latin square (Williams) over the units",
            "seed": workload.seed,
            "units": [
                {"config": cid, "batch_size": b} for cid in ids for b in workload.batch_sizes
            ],
            "blocks": order,
            "warmup_blocks": workload.warmup,
            **_balance(order[workload.warmup :], len(ids) * len(workload.batch_sizes)),
        },
        "samples": samples,
        "overhead": {
            "harness_ms": round(harness_ms, 3),
            "wall_ms": round(wall_ms, 3),
            "fraction": round(harness_ms / wall_ms, 6) if wall_ms else 0.0,
            "limit": OVERHEAD_LIMIT,
            "within_limit": not wall_ms or harness_ms / wall_ms <= OVERHEAD_LIMIT,
            "trials_s": round(elapsed, 3),
        },
        "analysis": analyse(
            samples, ids, factors, workload.batch_sizes, complete=not skipped,
            seed=workload.seed, pick=None if pick is None else pick["config"],
        ),
    }


def _balance(blocks: Sequence[Sequence[int]], units: int) -> dict[str, Any]:
    """How often each unit ran at each position over the measured blocks, and whether
    that is even (it is over every full balanced square)."""
    positions = [[row.index(unit) for row in blocks] for unit in range(units)]
    table = [[seen.count(p) for p in range(units)] for seen in positions]
    return {
        "position_counts": table,
        "positions_balanced": len({c for row in table for c in row}) <= 1,
    }


def _machine(context: Any, load_before: tuple[float, float, float]) -> dict[str, Any]:
    import torch

    from interlock.core.platform import detect_platform

    name = ""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
    return {
        "platform": context.platform,
        "device_arch": context.device_arch,
        "device_name": name or _cpu_model(),
        "detected": detect_platform()[2],
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
        "os": f"{pyplatform.system()} {pyplatform.release()}",
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return pyplatform.processor() or pyplatform.machine()


def _software() -> dict[str, Any]:
    from importlib import metadata

    import numpy
    import torch

    import interlock

    try:
        triton: str | None = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton = None
    from interlock.core.code_digest import code_digests

    return {
        "interlock": interlock.__version__,
        "torch": torch.__version__,
        "triton": triton,
        "numpy": numpy.__version__,
        "python": pyplatform.python_version(),
        # What ran: policy check calls the record stale once any of these files changes.
        "code": code_digests(loaded=True),
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value
