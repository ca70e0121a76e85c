"""Write ``conformance/vllm-<version>.jsonl``: vLLM's own decisions over the probe's domain.

Run with interlock's Python (it reads the policies' catalogs); it drives
``probe.py`` in the probe venv (``setup_venv.sh``), one process per (platform,
device_arch), at most ``--jobs`` at a time. Per-process results are cached under
``--work`` (keyed by the probe's own source), so an interrupted run resumes.

Domain: architectures = every name vLLM's default sets and compilation hooks
name (``probe.py --list-defaults``) + every architecture in interlock's
policies' catalogs; platforms = cuda sm_90, sm_100, rocm gfx942, gfx950; env =
VLLM_USE_V2_MODEL_RUNNER x VLLM_USE_BREAKABLE_CUDAGRAPH, each unset/"0"/"1".

Cost (measured on a shared 2-core machine at load 10-17): 10-100 s to import vLLM
per process, then a median of 34-140 ms per context (the model class is inspected
once per architecture, on the CPU platform, and cached by vLLM itself); 18-22
minutes of wall time per release, most of it imports.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROBE = HERE / "probe.py"
PLATFORMS = (("cuda", "sm_90"), ("cuda", "sm_100"), ("rocm", "gfx942"), ("rocm", "gfx950"))
#: Fields a snapshot row carries besides its context (``seconds`` stays in the cache).
RESULT_FIELDS = (
    "outcome", "runner", "breakable", "cudagraph", "compile", "capture_sizes", "task", "refusal",
    "probe_error",
)
#: What a row says about its stand-in where it differs from the default: the text model's
#: architectures the release matched, transformers' encoder-decoder model type it ran on.
STAND_IN_FIELDS = ("text_architectures", "stand_in_config")
#: The env var of the breakable verdict; set, it decides (every release).
BREAKABLE_ENV = "VLLM_USE_BREAKABLE_CUDAGRAPH"
RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"


class SnapshotError(RuntimeError):
    pass


def catalog_architectures(paths: list[Path]) -> list[str]:
    from interlock.policy import load_policy

    names: set[str] = set()
    for path in paths:
        names.update(load_policy([path]).catalog)
    return sorted(names)


def moe_architectures(paths: list[Path]) -> list[str]:
    """Architectures every catalog naming them calls mixture-of-experts (``moe: true``)."""
    from interlock.policy import load_policy

    said: dict[str, set[bool]] = {}
    for path in paths:
        for arch, entry in load_policy([path]).catalog.items():
            if "moe" in entry.traits:
                said.setdefault(arch, set()).add(entry.traits["moe"])
    return sorted(arch for arch, values in said.items() if values == {True})


def _probe(python: Path, env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(
        [str(python), str(PROBE), *args], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.splitlines()[-15:])
        raise SnapshotError(f"probe {' '.join(args[:4])} failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


def _last_json(text: str) -> Any:
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


def list_defaults(
    python: Path, env: dict[str, str]
) -> tuple[str, dict[str, list[str]], dict[str, Any]]:
    """The release's version, the architecture sets its defaults name (a function's answer
    on CUDA, and on ROCm as ``NAME() on rocm``), and its :func:`probe.release_facts`."""
    listed = {}
    for platform, arch in (("cuda", "sm_90"), ("rocm", "gfx950")):
        listed[platform] = _last_json(
            _probe(python, env, "--platform", platform, "--device-arch", arch, "--list-defaults")
        )
    named = dict(listed["cuda"]["named"])
    for key, value in listed["rocm"]["named"].items():
        # Functions (``name()``) answer per platform: ROCm's answer is kept apart.
        named[f"{key} on rocm" if key.endswith("()") else key] = value
    return listed["cuda"]["vllm"], named, listed["cuda"]["release"]


def relist(path: Path, python: Path, env: dict[str, str]) -> None:
    """Rewrite a written snapshot's header sets from its release (rows untouched): the
    snapshots of 0.29.0-0.33.0 were written with ROCm's answer under the CUDA name."""
    lines = path.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    version, named, release = list_defaults(python, env)
    if version != header["snapshot"]["vllm"]:
        raise SnapshotError(f"{path} is vLLM {header['snapshot']['vllm']}, the venv {version}")
    header["snapshot"]["named_by_vllm_defaults"] = named
    header["snapshot"]["release"] = release
    path.write_text("\n".join([json.dumps(header, sort_keys=True), *lines[1:]]) + "\n")


def build(args: argparse.Namespace) -> int:
    python = Path(args.venv).resolve() / "bin" / "python"
    if not (Path(args.venv) / f".installed-{args.vllm}").exists():
        raise SnapshotError(
            f"no complete probe venv for vLLM {args.vllm} at {args.venv}; "
            f"run tools/vllm_probe/setup_venv.sh {args.vllm} {args.venv}"
        )
    probe_hash = hashlib.sha256(PROBE.read_bytes()).hexdigest()[:12]
    work = Path(args.work) / f"{args.vllm}-{probe_hash}"
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VLLM_CACHE_ROOT": str(work / "vllm-cache")}
    started = time.perf_counter()

    version, named, release = list_defaults(python, env)
    if version != args.vllm:
        raise SnapshotError(f"the probe venv has vLLM {version}, not {args.vllm}")
    catalog = catalog_architectures([Path(p) for p in args.policies])
    moe = moe_architectures([Path(p) for p in args.policies])
    archs = sorted(set(catalog).union(*named.values()))

    surrogates = _last_json(_probe(python, env, "--inspect", "--archs", ",".join(archs)))[
        "not_inspected"
    ]

    def run(platform: str, device_arch: str) -> Path:
        out = work / f"{platform}-{device_arch}-{args.env}.jsonl"
        _probe(
            python, env,
            "--platform", platform, "--device-arch", device_arch, "--env", args.env,
            "--archs", ",".join(archs), "--surrogates", json.dumps(surrogates), "--out", str(out),
            "--moe", ",".join(moe),
        )  # fmt: skip
        return out

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        outs = list(pool.map(lambda p: run(*p), PLATFORMS))
    rows = [json.loads(line) for out in outs for line in out.read_text().splitlines() if line]
    seconds = [row["seconds"] for row in rows]
    elapsed = time.perf_counter() - started

    problems = self_check(rows, named, release)
    if problems:
        raise SnapshotError(
            f"self-check: {len(problems)} readings disagree with vLLM {version}'s own sets "
            "(nothing written):\n  " + "\n  ".join(problems[:20])
        )
    if args.verify:
        _verify(python, env, work, rows, args.verify, surrogates, moe)

    header = {
        "snapshot": {
            "vllm": version,
            "tool": "tools/vllm_probe (make vllm-snapshot VLLM=" + version + ")",
            "path": "EngineArgs(...).create_engine_config() as `vllm serve` parses it, "
            "under stand-in platforms (subclasses of vLLM's CudaPlatformBase / RocmPlatform)",
            "platforms": [f"{p}/{a}" for p, a in PLATFORMS],
            "env": "VLLM_USE_V2_MODEL_RUNNER x VLLM_USE_BREAKABLE_CUDAGRAPH, each unset/0/1"
            if args.env == "all"
            else "unset only",
            "architectures": archs,
            "named_by_vllm_defaults": named,
            "release": release,
            "stand_in_configs": {
                r["architecture"]: r["stand_in_config"] for r in rows if "stand_in_config" in r
            },
            "catalogs": [str(Path(p).resolve().relative_to(REPO)) for p in args.policies],
            "surrogates": surrogate_reasons(rows),
            "moe_config": sorted({r["architecture"] for r in rows if r.get("moe_config")}),
            "contexts": len(rows),
            "fields": list(RESULT_FIELDS),
        }
    }
    body = sorted(
        (_row(r) for r in rows),
        key=lambda r: (
            r["architecture"],
            r["platform"],
            r["device_arch"],
            sorted(r["env"].items()),
        ),
    )
    target = Path(args.out or REPO / "conformance" / f"vllm-{version}.jsonl")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w", encoding="utf-8") as f:
        f.write(json.dumps(header, sort_keys=True) + "\n")
        for row in body:
            f.write(json.dumps(row, sort_keys=True) + "\n")
    print(
        f"vllm-snapshot: {target}: vLLM {version}, {len(body)} contexts, "
        f"{len(archs)} architectures ({len(surrogates)} surrogate), "
        f"{elapsed:.0f} s wall, {sum(seconds):.1f} s in config code "
        f"({1000 * sum(seconds) / max(len(seconds), 1):.0f} ms per context)",
        file=sys.stderr,
    )
    return 0


def surrogate_reasons(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Architecture -> why a surrogate stood in (per platform process, so possibly several)."""
    reasons: dict[str, set[str]] = {}
    for row in rows:
        if "surrogate" in row:
            where = f"{row['platform']}/{row['device_arch']}"
            reasons.setdefault(row["architecture"], set()).add(f"{where}: {row['surrogate']}")
    return {arch: sorted(why) for arch, why in sorted(reasons.items())}


def _row(row: dict[str, Any]) -> dict[str, Any]:
    kept = {k: row[k] for k in ("vllm", "architecture", "platform", "device_arch", "env")}
    kept.update({k: row[k] for k in (*RESULT_FIELDS, *STAND_IN_FIELDS) if k in row})
    if "surrogate" in row:
        kept["surrogate"] = True
    if row.get("moe_config"):
        kept["moe_config"] = True
    return kept


def breakable_set(named: dict[str, list[str]], platform: str) -> set[str] | None:
    """The architectures the release auto-enables breakable graphs for on ``platform`` (the
    names its own function answers there, or 0.27.1/0.28.0's inline tuple); None for a
    platform the snapshot has no answer for."""
    key = "default_breakable_cudagraph_architectures()"
    if key in named:
        return set(named[f"{key} on rocm" if platform == "rocm" else key])
    inline = named.get("inline breakable tuple in VllmConfig.__post_init__")
    return None if inline is None else set(inline)


def self_check(
    rows: list[dict[str, Any]], named: dict[str, list[str]], release: dict[str, Any]
) -> list[str]:
    """Each reading that disagrees with what the release's own sets imply, as
    ``context: field ...``. Decided rows: an explicit VLLM_USE_BREAKABLE_CUDAGRAPH is the
    verdict; unset, the verdict is whether the architecture (or, where the release matches
    it, its text model's) is in the release's breakable set for that platform; breakable
    graphs turn compilation off; on a release with one runner every decided row runs it and
    every context setting VLLM_USE_V2_MODEL_RUNNER to anything but 1 is refused."""
    problems: list[str] = []
    only = release.get("only_runner")
    for row in rows:
        where = (
            f"{row['architecture']} on {row['platform']}/{row['device_arch']} "
            f"env {json.dumps(row['env'], sort_keys=True)}"
        )
        runner_env = row["env"].get(RUNNER_ENV)
        if only is not None and runner_env not in (None, "1") and row.get("outcome") != "refused":
            problems.append(
                f"{where}: outcome {row.get('outcome') or 'probe_error'}, but vLLM "
                f"{row['vllm']} refuses {RUNNER_ENV}={runner_env} (it has one runner, {only})"
            )
        if row.get("outcome") != "decided":
            continue
        if only is not None and row["runner"] != only:
            problems.append(f"{where}: runner {row['runner']}, but the release runs only {only}")
        if row["breakable"] and row["compile"]:
            problems.append(f"{where}: compile true with breakable true (vLLM turns it off)")
        if BREAKABLE_ENV in row["env"]:
            expected = row["env"][BREAKABLE_ENV] == "1"
            why = f"{BREAKABLE_ENV}={row['env'][BREAKABLE_ENV]}"
        else:
            names = breakable_set(named, row["platform"])
            if names is None:
                continue
            archs = {row["architecture"], *row.get("text_architectures", ())}
            expected = bool(archs & names)
            why = (
                f"{sorted(archs & names) or row['architecture']} "
                f"{'in' if expected else 'not in'} the release's breakable set on "
                f"{row['platform']}, {BREAKABLE_ENV} unset"
            )
        if row["breakable"] != expected:
            problems.append(f"{where}: breakable {str(row['breakable']).lower()}, but {why}")
    return problems


def check_file(path: Path) -> list[str]:
    """:func:`self_check` over a written snapshot (its header carries the named sets)."""
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    meta = lines[0]["snapshot"]
    return self_check(lines[1:], meta["named_by_vllm_defaults"], meta.get("release", {}))


def _verify(
    python: Path, env: dict[str, str], work: Path, rows: list[dict[str, Any]], n: int,
    surrogates: dict[str, str], moe: list[str],
) -> None:  # fmt: skip
    """Re-run ``n`` sampled contexts each in a fresh process; the answers must be the same
    as the in-process loop's (nothing leaks from one context into the next)."""
    sample = random.Random(0).sample(rows, min(n, len(rows)))
    for i, row in enumerate(sample):
        request = work / f"verify-{i}.json"
        request.write_text(
            json.dumps({"architecture": row["architecture"], "env": row["env"], "flags": []})
        )
        out = work / f"verify-{i}.jsonl"
        out.unlink(missing_ok=True)
        _probe(
            python, env, "--platform", row["platform"], "--device-arch", row["device_arch"],
            "--requests", str(request), "--surrogates", json.dumps(surrogates), "--out", str(out),
            "--moe", ",".join(moe),
        )  # fmt: skip
        fresh = json.loads(out.read_text().splitlines()[0])
        if _row(fresh) != _row(row):
            raise SnapshotError(
                f"in-process and fresh-process answers differ for {row['architecture']} on "
                f"{row['platform']}/{row['device_arch']} env {row['env']}:\n"
                f"  loop:  {_row(row)}\n  fresh: {_row(fresh)}"
            )
    print(
        f"vllm-snapshot: {len(sample)} sampled contexts agree with fresh processes", file=sys.stderr
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", help="the vLLM version, e.g. 0.33.0")
    parser.add_argument("--venv", help="the probe venv (setup_venv.sh)")
    parser.add_argument(
        "--check", metavar="SNAPSHOT", help="only run the self-check over a written snapshot"
    )
    parser.add_argument(
        "--relist", metavar="SNAPSHOT",
        help="rewrite a written snapshot's header sets from --venv, then --check it",
    )  # fmt: skip
    parser.add_argument("--work", default=str(REPO / ".vllm-probe" / "runs"))
    parser.add_argument("--env", default="all", choices=("all", "unset"))
    parser.add_argument("--jobs", type=int, default=1, help="probe processes at a time")
    parser.add_argument("--verify", type=int, default=0, help="contexts re-run in fresh processes")
    parser.add_argument("--out", help="default: conformance/vllm-<version>.jsonl")
    parser.add_argument(
        "--policies",
        nargs="+",
        default=[
            str(REPO / "policies.yaml"),
            *(
                str(p)
                for p in sorted((REPO / "examples" / "history").glob("*.yaml"))
                if not p.name.endswith(".tests.yaml")
            ),
        ],
        help="policies whose catalogs join the domain",
    )
    args = parser.parse_args(argv)
    try:
        if args.relist:
            if not args.venv:
                parser.error("--relist needs --venv")
            python = Path(args.venv).resolve() / "bin" / "python"
            env = {**os.environ, "VLLM_CACHE_ROOT": str(Path(args.work) / "relist-cache")}
            relist(Path(args.relist), python, env)
            args.check = args.relist
        if args.check:
            problems = check_file(Path(args.check))
            if problems:
                raise SnapshotError(
                    f"self-check: {args.check}: {len(problems)} readings disagree with the "
                    "release's own sets:\n  " + "\n  ".join(problems[:20])
                )
            print(f"vllm-snapshot: {args.check}: self-check passed", file=sys.stderr)
            return 0
        if not (args.vllm and args.venv):
            parser.error("--vllm and --venv are required (unless --check)")
        return build(args)
    except SnapshotError as exc:
        print(f"vllm-snapshot: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
