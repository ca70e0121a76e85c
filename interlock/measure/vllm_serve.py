"""``policy measure --engine vllm``: the factorial measured on ``vllm serve`` itself.

Each cell is the decision with its varied fields forced, turned into the ``vllm serve``
command ``policy vllm args`` emits (env and flags); its startup log is checked with
:class:`interlock.vllm.startup_log.EngineCheck`. The trials and the record are
:mod:`interlock.measure.cells`'s.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from interlock.core.errors import PolicyError
from interlock.measure.cells import (
    Cell,
    EngineWorkload,
    Progress,
    check_answers,
    evidence_record,
    interlock_version,
    jsonable,
    run_cells,
)
from interlock.measure.client import free_port

if TYPE_CHECKING:
    from interlock.app.query import Query
    from interlock.vllm.process import EngineProcess


def resolve_cells(
    policy: Any,
    query: Query,
    model: str,
    factors: Mapping[str, Sequence[Any]],
    vllm_args: Sequence[str],
    version: str | None = None,
    triton: tuple[bool, str] | None = None,
) -> tuple[Any, list[Cell], list[dict[str, Any]]]:
    """``(base resolution, cells, skipped)``: every combination's decision with its levels
    forced (over what the user's ``vllm serve`` arguments set) and its ``vllm serve``
    command for vLLM ``version`` (None: unknown, every flag set); a combination the policy
    or vLLM's adjustments refuse is skipped with why."""
    from interlock.app.query import decide_query
    from interlock.measure.design import combinations
    from interlock.vllm.command import serve_command
    from interlock.vllm.flags import read_user_flags
    from interlock.vllm.releases import known

    user = read_user_flags(vllm_args)
    clashing = sorted(set(factors) & set(user.overrides))
    if clashing:
        raise PolicyError(
            f"{', '.join(clashing)}: varied and also set by vllm serve arguments; choose one"
        )
    base = decide_query(policy, replace(query, overrides=user.overrides))
    cells: list[Cell] = []
    skipped: list[dict[str, Any]] = []
    for levels in combinations(factors):
        try:
            forced = {**user.overrides, **levels}
            resolution = decide_query(policy, replace(query, overrides=forced))
            # The levels are forced in the resolution, not flags the user gave: the command
            # still carries them explicitly (those ``version`` reads).
            command = serve_command(resolution, model, vllm_args, user, (),
                                    None if version is None else known(version))
        except PolicyError as exc:
            skipped.append({"levels": jsonable(levels), "reason": str(exc)})
            continue
        cells.append(Cell(f"c{len(cells)}", dict(levels), resolution, command))
    return base, cells, skipped


def compare_cells(
    old: Any, new: Any, query: Query, model: str, vllm_args: Sequence[str],
    version: str | None,
) -> tuple[Any, Any, list[Cell]]:
    """``(old resolution, new resolution, cells)``: what two policies decide for ``query``
    on vLLM, as the cells ``old`` and ``new`` of a factor ``policy`` (none when vLLM would be
    started alike)."""
    from interlock.app.query import decide_query
    from interlock.vllm.command import serve_command
    from interlock.vllm.flags import read_user_flags
    from interlock.vllm.releases import known

    user = read_user_flags(vllm_args)
    cells = []
    for name, policy in (("old", old), ("new", new)):
        resolution = decide_query(policy, replace(query, overrides=user.overrides))
        command = serve_command(resolution, model, vllm_args, user, (),
                                None if version is None else known(version))
        cells.append(Cell(name, {"policy": name}, resolution, command))
    same = (cells[0].command.argv, cells[0].command.env) == (
        cells[1].command.argv, cells[1].command.env)
    return cells[0].resolution, cells[1].resolution, [] if same else cells


def measure_vllm(
    model: str,
    base: Any,
    cells: list[Cell],
    skipped: list[dict[str, Any]],
    factors: Mapping[str, Sequence[Any]],
    workload: EngineWorkload,
    *,
    policy: dict[str, Any],
    accuracy_prompts: Sequence[str],
    accuracy_answers: Sequence[str] | None,
    startup_timeout: float,
    vllm_version: str | None,
    port: int | None,
    decision_log: str | None,
    launch: Callable[[Sequence[str]], list[str]] | None = None,
    progress: Progress | None,
    command: str | None,
    pick: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the design on ``vllm serve`` and build the evidence record; ``pick`` as
    :func:`interlock.measure.measure` takes it."""
    from interlock import decision_log as records
    from interlock.vllm.process import EngineProcess
    from interlock.vllm.startup_log import EngineCheck, log_release

    log_release(vllm_version)  # an unread release is refused before anything starts
    check_answers(accuracy_prompts, accuracy_answers)
    taken: set[int] = set()
    for cell in cells:
        cell.port = free_port(port, taken)
        taken.add(cell.port)
        cell.record = records.build_record(
            cell.resolution, "policy measure", model=model, capabilities=False,
            runner={"name": cell.command.decision["runner"], "plugin": None,
                    "distribution": "vllm", "version": vllm_version},
        )
    created = datetime.datetime.now(datetime.timezone.utc)

    def launched(argv: list[str]) -> list[str]:
        """The install's own way: vllm serve, or python -m."""
        return launch(argv) if launch is not None else argv

    def start(cell: Cell, argv: list[str], name: str) -> EngineProcess:
        return EngineProcess(launched(argv), {**os.environ, **cell.command.env},
                             EngineCheck(cell.command.decision, vllm_version,
                                         cell.resolution.context.platform),
                             cell.port, name)

    trials = run_cells(cells, model, workload, accuracy_prompts, startup_timeout, progress,
                       start, "engine")

    if decision_log is not None:
        for cell in cells:
            records.append_record(decision_log, {**cell.record, "engine": {
                "name": "vllm", "argv": launched(cell.command.argv), "env": cell.command.env,
                "target": cell.command.decision, **(cell.verification or {})}})
    version = next((c.verification["vllm_version"] for c in cells if c.verification),
                   vllm_version)
    return evidence_record(
        base, cells, skipped, factors, workload, trials, model=model, policy=policy,
        command=command, created=created, pick=pick, launched=launched,
        software={"vllm": version, "interlock": interlock_version()},
        engine={"name": "vllm", "version": version},
        accuracy_prompts=accuracy_prompts, accuracy_answers=accuracy_answers,
    )
