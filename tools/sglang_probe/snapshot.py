"""Write ``conformance/sglang-<version>.jsonl``: SGLang's own decisions over the probe's domain.

Run with interlock's Python (it reads the policies' catalogs); it drives ``probe.py`` in
the .sglang venv (``make sglang``), one process per (platform, device arch).

Domain: architectures = every name SGLang's per-model overrides are keyed on
(``probe.py --list-named``) + every architecture in the policies' catalogs (the seeds'
families among them); platforms = cuda sm_90, sm_100, rocm gfx942, gfx950, cpu.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROBE = HERE / "probe.py"
sys.path.insert(0, str(HERE))
from standins import PLATFORMS  # noqa: E402

DEFAULT_POLICIES = (
    "policies.yaml",
    "examples/history/2026-09-01-vllm-53155.yaml",
    "examples/history/vllm-0.32.0.yaml",
)


class SnapshotError(RuntimeError):
    pass


def catalog_attention(paths: list[Path]) -> dict[str, str]:
    """Every catalog architecture, with the attention kind the catalogs agree on ('' if none)."""
    from interlock.policy import load_policy

    said: dict[str, set[str]] = {}
    for path in paths:
        for arch, entry in load_policy([path]).catalog.items():
            kinds = said.setdefault(arch, set())
            if "attention" in entry.traits:
                kinds.add(str(entry.traits["attention"]))
    return {arch: kinds.pop() if len(kinds) == 1 else "" for arch, kinds in said.items()}


def _probe(python: Path, *args: str) -> str:
    proc = subprocess.run(
        [str(python), str(PROBE), *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.splitlines()[-15:])
        raise SnapshotError(f"probe {' '.join(args[:4])} failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


def build(venv: Path, policies: list[Path], out: Path) -> list[dict[str, Any]]:
    python = venv.resolve() / "bin" / "python"
    if not python.exists():
        raise SnapshotError(f"no SGLang venv at {venv}: run make sglang")
    listed = json.loads(_probe(python, "--list-named").splitlines()[-1])
    attention = catalog_attention(policies)
    archs = sorted(set(listed["named"]) | set(attention))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sglang-snapshot-") as work:
        traits = Path(work) / "traits.json"
        traits.write_text(json.dumps({a: k for a, k in attention.items() if k}))
        for platform, device_arch in PLATFORMS:
            part = Path(work) / f"{platform}-{device_arch}.jsonl"
            _probe(
                python, "--platform", platform, "--device-arch", device_arch,
                "--traits", str(traits), "--out", str(part), *archs,
            )  # fmt: skip
            for line in part.read_text().splitlines():
                rows.append({**json.loads(line), "sglang": listed["sglang"]})
    rows.sort(key=lambda r: (r["architecture"], r["platform"], r["device_arch"]))
    header = {
        "snapshot": {
            "sglang": listed["sglang"],
            "tool": "tools/sglang_probe (make sglang-snapshot)",
            "path": "ServerArgs(model_path=DIR).resolve_once() under stand-in platforms "
            "(tools/sglang_probe/standins.py), read back with resolution_result",
            "platforms": [f"{p}/{a}" if a else p for p, a in PLATFORMS],
            "architectures": archs,
            "named_by_sglang_overrides": listed["named"],
            "catalogs": [str(p) for p in policies],
            "contexts": len(rows),
            "fields": [
                "outcome", "decode_cuda_graph", "decode_cuda_graph_max_bs", "prefill_cuda_graph",
                "prefill_cuda_graph_max_bs", "torch_compile", "attention_backend", "refusal",
                "probe_error",
            ],
        }
    }  # fmt: skip
    out.write_text(
        "\n".join(json.dumps(r, sort_keys=True) for r in [header, *rows]) + "\n", encoding="utf-8"
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=REPO / ".sglang")
    parser.add_argument("--policy", dest="policies", action="append", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    policies = args.policies or [Path(p) for p in DEFAULT_POLICIES]
    try:
        version = json.loads(
            _probe(args.venv.resolve() / "bin" / "python", "--list-named").splitlines()[-1]
        )["sglang"]
        out = args.out or REPO / "conformance" / f"sglang-{version}.jsonl"
        rows = build(args.venv, policies, out)
    except SnapshotError as exc:
        print(f"sglang snapshot: {exc}", file=sys.stderr)
        return 1
    outcomes: dict[str, int] = {}
    for row in rows:
        outcomes[row["outcome"]] = outcomes.get(row["outcome"], 0) + 1
    print(f"{out}: {len(rows)} contexts, {outcomes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
