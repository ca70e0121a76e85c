"""``policy measure --engine interlock``: the factorial measured on ``policy serve``, through
the HTTP client ``--engine vllm`` drives ``vllm serve`` with (:mod:`interlock.measure.client`).

Each cell is the decision with its varied fields forced, run as a ``policy serve`` child
that is given those levels with ``--set`` (and the measurement's own policy and context flags),
on a port of its own. As on vLLM, every trial starts the cell's server, waits for
``/health``, checks that its startup line names the cell's decision (a server that runs
another decision stops the measurement, naming the cell), drives it with streaming
``/v1/completions`` at ``concurrency``, and stops it; the first start of each cell
answers the accuracy prompts. The record is ``--engine vllm``'s, with ``engine.name``
``interlock``.
"""

from __future__ import annotations

import datetime
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from interlock.core.errors import LocatedError
from interlock.core.fields import show_scalar
from interlock.measure.cells import (
    Cell,
    EngineWorkload,
    Progress,
    check_answers,
    evidence_record,
    run_cells,
)
from interlock.measure.client import free_port

if TYPE_CHECKING:
    from interlock.app.query import Query

#: ``policy serve``'s first line: ``policy serve: runner=mrv2 (who), cudagraph=... (who), ...``
DECIDED = re.compile(r"^policy serve: (runner=.*)$")
FIELD = re.compile(r"(\w+)=(\S+) \(")
CHECKED = ("runner", "cudagraph", "breakable")


@dataclass(frozen=True)
class ServeCommand:
    """A cell's ``policy serve`` command (its port added at start) and its target."""

    argv: list[str]
    env: dict[str, str]
    decision: dict[str, Any]


@dataclass
class ServeVerdict:
    """Whether a started ``policy serve`` runs the cell's decision, by its startup line."""

    verified: bool
    expected: dict[str, str]
    seen: dict[str, str]
    problems: list[str]
    ended_by: str

    def to_dict(self) -> dict[str, Any]:
        return {"verified": self.verified, "ended_by": self.ended_by,
                "expected": self.expected, "seen": self.seen, "problems": self.problems}


@dataclass
class ServeCheck:
    """Reads ``policy serve``'s output for its decision line (``EngineProcess``'s check)."""

    decision: Mapping[str, Any]
    verdict: ServeVerdict | None = None
    expected: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.expected = {name: show_scalar(self.decision[name]) for name in CHECKED}

    def feed(self, text: str) -> ServeVerdict | None:
        found = DECIDED.match(text.strip())
        if found is None or self.verdict is not None:
            return None
        seen = dict(FIELD.findall(found.group(1)))
        problems = [f"{name}: the server runs {seen.get(name, 'nothing named')}, the cell "
                    f"{want}" for name, want in self.expected.items() if seen.get(name) != want]
        self.verdict = ServeVerdict(not problems, self.expected, seen, problems,
                                    "mismatch" if problems else "ready")
        return self.verdict

    def finish(self, ended_by: str, detail: str = "") -> ServeVerdict:
        if self.verdict is None:
            self.verdict = ServeVerdict(False, self.expected, {}, [
                "no `policy serve: runner=...` line in its output" + (f" ({detail})"
                                                                      if detail else "")],
                ended_by)
        return self.verdict


def serve_cells(
    policy: Any, query: Query, model: str, factors: Mapping[str, Sequence[Any]],
    flags: Sequence[str],
) -> tuple[Any, list[Cell], list[dict[str, Any]]]:
    """``(base resolution, cells, skipped)``: every combination's decision with its levels
    forced over the query's overrides, as `policy serve` decides it, and the command that
    runs it (``flags``: the measurement's policy and context flags, passed on); a
    combination the policy or the runners refuse is skipped with why."""
    from interlock.app.query import decide_query
    from interlock.measure.design import combinations

    base = decide_query(policy, query)
    cells: list[Cell] = []
    skipped: list[dict[str, Any]] = []
    for levels in combinations(factors):
        forced = {**query.overrides, **levels}
        try:
            resolution = decide_query(policy, replace(query, overrides=forced))
        except LocatedError as exc:  # a policy's or a plugin's (stage 5) error
            skipped.append({"levels": dict(levels), "reason": str(exc)})
            continue
        argv = [sys.executable, "-m", "interlock.cli", "serve", "--model", model, *flags]
        for name, value in forced.items():
            argv += ["--set", f"{name}={show_scalar(value)}"]
        command = ServeCommand(argv, {}, resolution.decision.to_dict())
        cells.append(Cell(f"c{len(cells)}", dict(levels), resolution, command))
    return base, cells, skipped


def measure_serve(
    model: str, base: Any, cells: list[Cell], skipped: list[dict[str, Any]],
    factors: Mapping[str, Sequence[Any]], workload: EngineWorkload, *,
    policy: dict[str, Any], accuracy_prompts: Sequence[str],
    accuracy_answers: Sequence[str] | None, startup_timeout: float, port: int | None,
    progress: Progress | None, command: str | None, pick: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the design on ``policy serve`` children and build the evidence record; ``pick``
    as ``--engine vllm``'s (``interlock.measure.pick``)."""
    from interlock import decision_log as records
    from interlock.measure.cells import interlock_version
    from interlock.vllm.process import EngineProcess

    check_answers(accuracy_prompts, accuracy_answers)
    taken: set[int] = set()
    for cell in cells:
        cell.port = free_port(port, taken)
        taken.add(cell.port)
        cell.record = records.build_record(cell.resolution, "policy measure", model=model)
    created = datetime.datetime.now(datetime.timezone.utc)

    def start(cell: Cell, argv: list[str], name: str) -> EngineProcess:
        return EngineProcess(argv, {**os.environ, **cell.command.env},
                             ServeCheck(cell.command.decision), cell.port, name)

    trials = run_cells(cells, model, workload, accuracy_prompts, startup_timeout, progress,
                       start, "server")
    version = interlock_version()
    return evidence_record(
        base, cells, skipped, factors, workload, trials, model=model, policy=policy,
        command=command, created=created, pick=pick, launched=list,
        software={"interlock": version}, engine={"name": "interlock", "version": version},
        accuracy_prompts=accuracy_prompts, accuracy_answers=accuracy_answers,
    )
