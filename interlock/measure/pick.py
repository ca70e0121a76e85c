"""The policy's own pick among a measurement's configurations, and whether the measurement
contradicts it.

The pick is the configuration whose decision is the one the policy makes here with no
level forced (``base_decision``); the analysis compares it, per batch size, with the
fastest alternative on the measurement's own test (a block-paired bootstrap interval of the
TPOT difference, significant only from enough trials). A pick that a measured
alternative beats significantly is what a reviewer needs to see: the rule that decided
it, and the record to cite as the evidence of a rule that changes it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from interlock.core.fields import show_scalar


def policy_pick(
    base: Any, configurations: Sequence[tuple[str, Any]], factors: Sequence[str]
) -> dict[str, Any]:
    """A record's ``pick``: the id of the configuration (``(id, resolution)``) deciding as
    ``base`` (the policy's resolution here) does, None when none was measured; the pick's
    values of the varied ``factors``, and what decided each (``rule x``, ``file:line``)."""
    from interlock.policy.diff import decider

    config = next((cid for cid, res in configurations if res.decision == base.decision), None)
    decision = base.decision.to_dict()
    decided_by = {}
    for name in factors:
        prov = base.provenance.get(name)
        if prov is not None:
            where = prov.location
            decided_by[name] = {
                "by": decider(prov),
                "file": where.file if where else None,
                "line": where.line if where else None,
            }
    return {
        "config": config,
        # As the record's levels are written (JSON lists), so that the two compare.
        "decision": {name: list(v) if isinstance(v := decision[name], tuple) else v
                     for name in factors if name in decision},
        "decided_by": decided_by,
    }


def beaten(record: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(batch size, the analysis's pick entry)`` where a measured alternative beats the
    policy's pick significantly."""
    return [
        (batch, entry["pick"])
        for batch, entry in record["analysis"]["batch_sizes"].items()
        if (entry.get("pick") or {}).get("beaten")
    ]


def decided_by_text(record: Mapping[str, Any], fields: Sequence[str] | None = None) -> str:
    """``runner=mrv2 by defaults (policies.yaml:89)``, for ``fields`` (default: every varied
    field)."""
    pick = record.get("pick") or {}
    parts = []
    for name, who in pick.get("decided_by", {}).items():
        if fields is None or name in fields:
            where = f" ({who['file']}:{who['line']})" if who.get("file") else ""
            parts.append(f"{name}={show_scalar(_value(pick['decision'].get(name)))} by "
                         f"{who['by']}{where}")
    return "; ".join(parts)


def evidence_entry(
    record: Mapping[str, Any], alternative: str, record_path: Path
) -> tuple[list[str], str | None]:
    """``(lines, policy file)``: a rule a reviewer would weigh, its ``when`` (the record's
    context), its ``set`` (the alternative's values where they differ from the pick's) and
    the ``evidence`` entry citing the record relative to the policy file that decided the
    pick (as ``policy check`` resolves it; None: no file decided it, the path as given)."""
    from interlock.policy.evidence import policy_file_path

    pick = record["pick"]
    by_id = {c["id"]: c for c in record["configurations"]}
    levels = by_id[alternative]["levels"]
    changed = {k: v for k, v in levels.items() if pick["decision"].get(k) != v}
    files = [who["file"] for name, who in pick["decided_by"].items()
             if name in changed and who.get("file")]
    cited = str(record_path)
    if files:
        folder = policy_file_path(files[0]).resolve().parent
        cited = os.path.relpath(record_path.resolve(), folder)
    ctx = record["context"]
    when = {"platform": ctx["platform"]}
    if ctx["device_arch"]:
        when["device_arch"] = ctx["device_arch"]
    when["architecture"] = ctx["architecture"]
    lines = [f"when: {_flow(when)}", f"set: {_flow(changed)}", f"evidence: [{cited}]"]
    return lines, files[0] if files else None


def _flow(data: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {show_scalar(_value(v))}" for k, v in data.items()) + "}"


def _value(value: Any) -> Any:
    return "[" + ", ".join(map(str, value)) + "]" if isinstance(value, list) else value
