"""``policy measure --plot FILE.svg|png``: TPOT per configuration with its interval (the
policy's pick marked, and whether an alternative beats it), and the effects as bars with
theirs (matplotlib, from the optional extra ``interlock[measure]``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from interlock.core.errors import InputError
from interlock.measure.pick import beaten
from interlock.measure.render import PICK_MARK, effect_text

FORMATS = (".svg", ".png")


def write_plot(record: dict[str, Any], path: str | Path) -> Path:
    """Draw the record into ``path`` (its suffix picks the format)."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise InputError(f"--plot {path}: the file must end in .svg or .png")
    try:
        import matplotlib
    except ImportError:
        raise InputError(
            "--plot needs matplotlib: pip install 'interlock[measure]'"
        ) from None
    matplotlib.use("Agg")
    # SVG text as <text> elements, not glyph paths: searchable, selectable, diffable.
    matplotlib.rcParams["svg.fonttype"] = "none"
    from matplotlib import pyplot as plt

    batches = record["analysis"]["batch_sizes"]
    labels = {c["id"]: c["label"] for c in record["configurations"]}
    # An engine record's accuracy gate: a flagged cell says so beside its bar.
    for cid in (record.get("accuracy") or {}).get("flagged", []):
        labels[cid] += " [outputs diverge]"
    pick = (record.get("pick") or {}).get("config")
    if pick is not None:
        lost = [batch for batch, _ in beaten(record)]
        labels[pick] += f"  {PICK_MARK}" + (
            f" (beaten, batch {', '.join(lost)})" if lost else ""
        )
    first = next(iter(batches.values()))
    effects = (first.get("effects") or {}).get("tpot_ms") or []
    panels = 2 if effects else 1
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 0.5 * len(labels) + 2.5))
    axes = list(axes) if panels > 1 else [axes]
    ax = axes[0]
    height = 0.8 / max(len(batches), 1)
    for j, (batch, entry) in enumerate(batches.items()):
        ids = list(entry["configurations"])
        tpot = [entry["configurations"][cid]["tpot_ms"] for cid in ids]
        ys = [i + j * height for i in range(len(ids))]
        ax.barh(
            ys,
            [t["value"] for t in tpot],
            height=height,
            xerr=_errors(tpot),
            label=f"batch {batch}",
            capsize=3,
        )
    ax.set_yticks([i + height * (len(batches) - 1) / 2 for i in range(len(labels))])
    ax.set_yticklabels([f"{cid}: {label}" for cid, label in labels.items()], fontsize=8)
    for tick, cid in zip(ax.get_yticklabels(), labels, strict=True):
        if cid == pick:
            tick.set_fontweight("bold")
    ax.set_xlabel("TPOT, ms/token (median, 95% CI)")
    ax.legend(fontsize=8)
    if effects:
        ax = axes[1]
        names = [effect_text(e).split(":")[0] for e in effects]
        ax.barh(
            range(len(effects)),
            [e["value"] for e in effects],
            xerr=_errors(effects),
            color=["tab:red" if e["value"] > 0 else "tab:green" for e in effects],
            capsize=3,
        )
        ax.axvline(0, color="black", linewidth=0.8)
        claims = record["analysis"].get("claims") is not False
        for i, e in enumerate(effects):
            ax.annotate(
                _mark(e, claims), (e["high"] if e["value"] >= 0 else e["low"], i),
                xytext=(4 if e["value"] >= 0 else -4, 0), textcoords="offset points",
                ha="left" if e["value"] >= 0 else "right", va="center", fontsize=8,
            )
        ax.set_yticks(range(len(effects)))
        ax.set_yticklabels(names, fontsize=8)
        ax.margins(x=0.25)
        min_trials = record["analysis"].get("min_trials", "enough")
        legend = (
            "* significant: the 95% interval excludes 0\nn.s.: not significant"
            if claims else
            f"n/a: fewer than {min_trials} trials, no significance claimed"
        )
        ax.text(0.01, -0.18, legend, transform=ax.transAxes, fontsize=7, va="top")
        ax.set_xlabel(f"effect on TPOT, ms/token (batch {next(iter(batches))}, 95% CI)")
    model = record["model"]
    fig.suptitle(f"{model['architecture']} ({model['name']}) on {record['context']['platform']}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _mark(effect: dict[str, Any], claims: bool) -> str:
    """The mark beside an effect's bar: ``*`` significant, ``n.s.`` not, ``n/a`` no claim."""
    if not claims:
        return "n/a"
    return "*" if effect["significant"] else "n.s."


def _errors(estimates: list[dict[str, Any]]) -> list[list[float]]:
    """Error bar lengths below and above each value (a percentile interval from few blocks
    may end at the value itself)."""
    return [
        [max(0.0, e["value"] - e["low"]) for e in estimates],
        [max(0.0, e["high"] - e["value"]) for e in estimates],
    ]
