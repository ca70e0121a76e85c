"""Round trip: feed vLLM's own config path the flags `policy vllm args` emits, for every
context of a snapshot, and check that vLLM arrives at interlock's decision.

Run with interlock's Python; the probe runs in the probe venv (``setup_venv.sh``).
A context the policy refuses has no command: vLLM gets the context's own environment and
must refuse it too. A context the policy declares a deviation for (on the field that
differs) is counted apart, as ``policy conformance`` does; rows the probe could not run
are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from snapshot import PLATFORMS, REPO, SnapshotError, _last_json, _probe  # noqa: E402

FIELDS = ("runner", "breakable", "cudagraph", "compile")
#: What a row says besides the fields: decided or refused, vLLM's message, the probe's error.
OUTCOME = ("outcome", "refusal", "probe_error")


def round_trip(
    snapshot_path: Path, venv: Path, policy_paths: list[Path], work: Path
) -> dict[str, Any]:
    from interlock.core.errors import PolicyError
    from interlock.policy import load_policy
    from interlock.policy.resolution import PolicyRefused, resolve
    from interlock.policy.snapshot import load_snapshot
    from interlock.vllm.command import UserFlags, serve_command
    from interlock.vllm.releases import release
    from interlock.vllm.stage import ReleaseStage

    policy = load_policy(policy_paths)
    snapshot = load_snapshot(snapshot_path)
    python = venv.resolve() / "bin" / "python"
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VLLM_CACHE_ROOT": str(work / "vllm-cache")}
    started = time.perf_counter()
    # Llama's class is what a surrogate runs: its model info must be in the cache too.
    archs = sorted({row.context.architecture for row in snapshot.rows} | {"LlamaForCausalLM"})
    surrogates = _last_json(_probe(python, env, "--inspect", "--archs", ",".join(archs)))[
        "not_inspected"
    ]
    expected: dict[str, tuple[Any, Any]] = {}
    requests: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in snapshot.rows:
        if row.probe_error is not None:
            continue
        ctx = row.context
        try:
            # The release the snapshot recorded decides through its stage, and its command
            # carries only the knobs it reads.
            version = snapshot.engine_version
            res = resolve(policy, ctx, engine=ReleaseStage(version))
            command = serve_command(res, "MODEL", [], UserFlags(), release=release(version))
            knobs, flags, decision = command.env, command.argv[3:], command.decision
        except PolicyRefused as exc:
            # No command to emit: vLLM, given what the user gave, must refuse as well.
            knobs, flags, res = dict(ctx.env), [], exc.resolution
            decision = {"outcome": "refused"}
        except PolicyError as exc:
            raise SnapshotError(f"policy vllm args fails for {ctx.to_dict()}: {exc}") from None
        request = {"architecture": ctx.architecture, "env": knobs, "flags": flags}
        key = json.dumps(
            [ctx.architecture, ctx.platform, ctx.device_arch, sorted(knobs.items()), flags]
        )
        expected[key] = (decision, res)
        requests.setdefault((ctx.platform, ctx.device_arch), []).append(request)
    counts: Counter[str] = Counter()
    failures = []
    for platform, device_arch in PLATFORMS:
        batch = requests.get((platform, device_arch), [])
        if not batch:
            continue
        req_file = work / f"requests-{platform}-{device_arch}.jsonl"
        req_file.write_text("".join(json.dumps(r) + "\n" for r in batch))
        out = work / f"roundtrip-{platform}-{device_arch}.jsonl"
        out.unlink(missing_ok=True)
        _probe(
            python, env, "--platform", platform, "--device-arch", device_arch,
            "--requests", str(req_file), "--surrogates", json.dumps(surrogates), "--out", str(out),
            "--moe", ",".join(snapshot.header.get("moe_config", [])),
        )  # fmt: skip
        for line in out.read_text().splitlines():
            got = json.loads(line)
            key = json.dumps(
                [
                    got["architecture"],
                    platform,
                    device_arch,
                    sorted(got["env"].items()),
                    got.get("flags", []),
                ]
            )
            decision, res = expected[key]
            diffs = _differences(decision, got)
            if not diffs:
                counts["agree"] += 1
                continue
            covered = all(
                any(
                    d.field == f and d.applies(res._draft.facts, res.context.env)
                    for d in policy.deviations
                )
                for f in diffs
            )
            if covered:
                counts["deviation"] += 1
            else:
                counts["disagree"] += 1
                request = {k: got.get(k, []) for k in ("architecture", "env", "flags")}
                failures.append({"request": request,
                                 "platform": f"{platform}/{device_arch}", "interlock": decision,
                                 "vllm": {f: got.get(f) for f in (*FIELDS, *OUTCOME)}})  # fmt: skip
    return {
        "snapshot": str(snapshot_path),
        "vllm": snapshot.engine_version,
        "contexts": sum(counts.values()),
        **counts,
        "failures": failures,
        "seconds": round(time.perf_counter() - started, 1),
    }


def _differences(decision: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """The fields where vLLM did not arrive at interlock's decision; ``outcome`` when one
    refused and the other did not, or the probe could not run."""
    refused = decision.get("outcome") == "refused"
    if "probe_error" in got or refused != (got.get("outcome") == "refused"):
        return ["outcome"]
    return [] if refused else [f for f in FIELDS if decision[f] != got[f]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("--venv", type=Path, required=True)
    parser.add_argument("--policy", type=Path, action="append")
    parser.add_argument("--work", type=Path, default=REPO / ".vllm-probe" / "roundtrip")
    args = parser.parse_args(argv)
    try:
        report = round_trip(
            args.snapshot, args.venv, args.policy or [REPO / "policies.yaml"], args.work
        )
    except SnapshotError as exc:
        print(f"vllm-roundtrip: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2))
    return 0 if not report["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
