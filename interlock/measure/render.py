"""A measurement record as text: the configurations table (the policy's pick marked), the
effects, the fastest, the pick against the alternatives, what was skipped, and the
harness's overhead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from interlock.core.fields import show_scalar
from interlock.measure.stats import MIN_TRIALS

#: Beside the policy's pick in the table (and the plot's labels).
PICK_MARK = "← policy's pick"


def render_text(record: dict[str, Any]) -> str:
    model, ctx, work = record["model"], record["context"], record["workload"]
    configs = record["configurations"]
    factors = list(record["factors"])
    where = ctx["platform"] + (f" {ctx['device_arch']}" if ctx["device_arch"] else "")
    lines = [
        f"{model['architecture']} ({model['name']}) on {where}: {len(configs)} configuration(s), "
        f"{work['trials']} trials each (+{work['warmup']} warm-up) per batch size, "
        f"interleaved in blocks",
        f"workload: prompt {len(work['prompt_token_ids'])} tokens, {work['max_tokens']} new "
        f"tokens, batch sizes {', '.join(map(str, work['batch_sizes']))}",
    ]
    columns = factors or ["runner", "cudagraph", "breakable"]
    by_id = {c["id"]: c for c in configs}
    claims = record["analysis"].get("claims") is not False
    pick = (record.get("pick") or {}).get("config")
    for batch, entry in record["analysis"]["batch_sizes"].items():
        lines += ["", f"batch {batch}"]
        header = ["config", *columns, "TPOT ms [95% CI]", "TTFT ms [95% CI]", "tokens/s"]
        rows = []
        for cid, metrics in entry["configurations"].items():
            config = by_id[cid]
            rows.append(
                [
                    cid,
                    *(
                        show_scalar(_value(config["levels"].get(name, config["decision"][name])))
                        for name in columns
                    ),
                    _interval(metrics["tpot_ms"]),
                    _interval(metrics["ttft_ms"]),
                    f"{metrics['throughput_tok_s']['value']:.1f}",
                    PICK_MARK if cid == pick else "",
                ]
            )
        header.append("")
        lines += _table(header, rows)
        effects = (entry.get("effects") or {}).get("tpot_ms")
        if effects:
            lines.append("  effects on TPOT:")
            lines += [f"    {_effect(e, claims)}" for e in effects]
        fastest = entry.get("fastest")
        if fastest:
            lines.append(f"  fastest: {_fastest(fastest, by_id, claims)}")
        if "pick" in record:
            lines.append(f"  policy's pick: {_pick(record, entry.get('pick'), by_id, claims)}")
    if not claims:
        lines += ["", f"significance: not claimed, {work['trials']} trials per configuration "
                  f"is fewer than {MIN_TRIALS} (rerun with --trials {MIN_TRIALS} or more)"]
    note = record["analysis"].get("effects_note")
    if note and factors:
        lines += ["", f"effects: not computed ({note})"]
    for skipped in record["skipped"]:
        levels = " ".join(f"{k}={show_scalar(_value(v))}" for k, v in skipped["levels"].items())
        reason = skipped["reason"].replace("\n", " ")
        lines.append(f"skipped {levels}: {reason}")
    over = record.get("overhead")
    if over is not None:  # an engine record times the engine from outside: no harness share
        verdict = "within" if over["within_limit"] else "OVER"
        lines += [
            "",
            f"harness overhead: {100 * over['fraction']:.3f} % of the measured time "
            f"({verdict} the {100 * over['limit']:.0f} % limit); trials took "
            f"{over['trials_s']:.1f} s",
        ]
    if "accuracy" in record:
        lines += _accuracy(record)
    return "\n".join(lines) + "\n"


def _accuracy(record: dict[str, Any]) -> list[str]:
    """An engine record's engine line, ITL per configuration, and the accuracy gate."""
    acc, engine = record["accuracy"], record["engine"]
    lines = ["", f"engine: vLLM {engine['version']}"
             + (f" on {engine['gpu']}" if engine.get("gpu") else "")
             + f"; every cell's startup log verified; trials took {engine['trials_s']:.1f} s"]
    itl: dict[str, list[float]] = {}
    for s in record["samples"]:
        if not s["warmup"] and s.get("itl_ms") is not None:
            itl.setdefault(s["config"], []).append(s["itl_ms"])
    lines.append(f"accuracy: {acc['prompts']} prompts, first {acc['tokens']} tokens greedy, "
                 f"against {acc['reference']}; flagged over {100 * acc['max_divergence']:.0f} %")
    for cid, entry in acc["cells"].items():
        gaps = sorted(itl.get(cid, []))
        median = f"ITL {gaps[len(gaps) // 2]:.2f} ms, " if gaps else ""
        score = ""
        if "exact_match" in entry:
            score = f", exact match {100 * entry['exact_match']:.0f} %"
        mark = "  DIVERGES" if entry["flagged"] else ""
        lines.append(f"  {cid}: {median}outputs differ on {100 * entry['divergence']:.0f} % "
                     f"of the prompts{score}{mark}")
    return lines


def effect_text(effect: dict[str, Any]) -> str:
    """``runner mrv1→mrv2: +3.00 ms/token [+2.70, +3.30]``, or for an interaction
    ``runner×breakable interaction: ...``."""
    if len(effect["factors"]) == 1:
        first, second = effect["levels"][0]
        name = f"{effect['factors'][0]} {show_scalar(_value(first))}→{show_scalar(_value(second))}"
    else:
        name = "×".join(effect["factors"]) + " interaction"
    return f"{name}: {effect['value']:+.2f} ms/token [{effect['low']:+.2f}, {effect['high']:+.2f}]"


def _effect(effect: dict[str, Any], claims: bool = True) -> str:
    return f"{effect_text(effect)}  ({verdict(effect, claims)})"


def verdict(estimate: dict[str, Any], claims: bool = True) -> str:
    """``significant``, ``not significant``, or, from too few trials, no claim at all."""
    if not claims:
        return f"no claim: fewer than {MIN_TRIALS} trials"
    return "significant" if estimate["significant"] else "not significant"


def _fastest(fastest: dict[str, Any], by_id: dict[str, Any], claims: bool = True) -> str:
    best = f"{fastest['config']} ({by_id[fastest['config']]['label']})"
    if fastest["runner_up"] is None:
        return f"{best}, the only configuration"
    lead = fastest["lead"]
    return (
        f"{best}, ahead of {fastest['runner_up']} by {lead['value']:.2f} ms/token "
        f"[{lead['low']:.2f}, {lead['high']:.2f}]: {verdict(lead, claims)}"
    )


def _pick(
    record: dict[str, Any], compared: dict[str, Any] | None, by_id: dict[str, Any], claims: bool
) -> str:
    """The pick against the fastest alternative (or the one that beats it), at one batch."""
    pick = record["pick"]
    if pick["config"] is None:
        shown = " ".join(f"{k}={show_scalar(_value(v))}" for k, v in pick["decision"].items())
        return f"{shown or 'its decision'}, not among the measured configurations"
    best = f"{pick['config']} ({by_id[pick['config']]['label']})"
    if compared is None:
        return f"{best}, the only configuration"
    other = f"{compared['alternative']} ({by_id[compared['alternative']]['label']})"
    margin = compared["margin"]
    interval = f"[{margin['low']:+.2f}, {margin['high']:+.2f}]"
    if compared["beaten"]:
        return (f"{best}, slower than {other} by {margin['value']:.2f} ms/token {interval}: "
                "significant, the measurement contradicts the policy")
    return (f"{best}; the fastest alternative {other} differs by {margin['value']:+.2f} "
            f"ms/token {interval}: {verdict(margin, claims)}")


def contradiction_text(record: dict[str, Any], path: Path, *, kept: bool) -> str:
    """When an alternative beats the policy's pick significantly: which rule decided the
    pick (file:line) and the evidence entry of a rule that changes it, citing the record
    at ``path`` (``kept``: written where --record said, not under the cache directory)."""
    from interlock.measure.pick import beaten, decided_by_text, evidence_entry

    lost = beaten(record)
    if not lost:
        return ""
    by_id = {c["id"]: c for c in record["configurations"]}
    pick = record["pick"]
    # The alternative that beats the pick can differ between batch sizes: one entry each.
    by_alternative: dict[str, list[str]] = {}
    for batch, compared in lost:
        by_alternative.setdefault(compared["alternative"], []).append(batch)
    lines = []
    for alternative, batches in by_alternative.items():
        levels = by_id[alternative]["levels"]
        changed = [k for k, v in levels.items() if pick["decision"].get(k) != v]
        lines += [
            "",
            f"the policy's pick {pick['config']} loses to {alternative} at batch size(s) "
            f"{', '.join(batches)}",
            f"  decided by: {decided_by_text(record, changed)}",
        ]
        entry, policy_file = evidence_entry(record, alternative, path)
        where = (f"relative to {policy_file}, as `policy check` reads it" if policy_file
                 else "as written")
        lines.append(f"  the evidence a reviewer attaches to a rule that changes it ({where}):")
        lines += [f"    {line}" for line in entry]
    if not kept:
        lines.append("  (the record is under the cache directory: measure with --record "
                     "evidence/NAME.json to keep it with the policy)")
    return "\n".join(lines) + "\n"


def _interval(estimate: dict[str, Any]) -> str:
    return f"{estimate['value']:.2f} [{estimate['low']:.2f}, {estimate['high']:.2f}]"


def _value(value: Any) -> Any:
    return ",".join(map(str, value)) if isinstance(value, list) else value


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in [header, *rows]]
