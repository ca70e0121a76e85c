"""interlock's vLLM plugin inside a release's own config code, under the probe's stand-in GPUs.

The GPU path without a GPU: for each seed context, vLLM's real
``EngineArgs(...).create_engine_config()`` (arguments parsed as ``vllm serve`` parses them)
runs with interlock's plugin loaded as vLLM loads it (vLLM's own
``load_plugins_by_group("vllm.general_plugins")``, ``VLLM_PLUGINS=interlock``), and vLLM's
final config (cudagraph mode, compilation mode, the breakable verdict, the runner where
the release makes it knowable) must equal the decision the plugin applied
(``interlock.vllm.plugin.APPLIED``). Each context runs under the shipped policy and under
a site policy that differs from vLLM on every seed context (``site-differs.yaml``).

Two halves:
- the driver (any Python, ``--vllm X --venv DIR``): one worker process per (platform,
  device arch) in the probe venv, where this checkout's interlock is installed (``make
  vllm-plugin-check`` installs it), the result printed per context with the plugin's log
  lines; exit 1 when any context fails;
- the worker (``--worker``, in the probe venv): the probe's stand-ins
  (``probe.install_stand_ins``), plus ``vllm.triton_utils.HAS_TRITON`` answering True as
  on a GPU build (the plugin reads it for the policy's Triton fact).

A context passes when every compared field agrees, or when the plugin stops the engine on
a rule's refusal (exit 5: no config is built, nothing runs against the policy). It fails
when a field differs, when vLLM raises, when the release's own environment check
(``Platform.validate_environ``, run before any config exists) refuses what the plugin left
in the environment every engine process inherits, or when the plugin stops for any other
reason.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SITE = HERE / "site-differs.yaml"
#: (platform, device arch, architecture, the model it stands for): the issue's seed contexts.
SEEDS = (
    ("rocm", "gfx950", "GlmMoeDsaForCausalLM", "GLM-5.2"),
    ("rocm", "gfx950", "KimiK3ForConditionalGeneration", "Kimi-K3"),
    ("cuda", "sm_90", "DeepseekV32ForCausalLM", "DeepSeek V3.2"),
    # Qwen3.5's published checkpoints; in 0.34.0's _QWEN3_5_ARCHITECTURES (CUDA only).
    ("cuda", "sm_90", "Qwen3_5MoeForConditionalGeneration", "Qwen3.5"),
    ("rocm", "gfx942", "HYV4ForCausalLM", "HYV4"),
)
#: The seeds whose checkpoints carry a DSA indexer (``index_topk``): the plugin reads the
#: model's config.json, where those keys make the attention trait ``dsa``, so only these get
#: them (the probe gives every stand-in config the keys; vLLM asserts on them for DSA).
DSA = {"GlmMoeDsaForCausalLM", "DeepseekV32ForCausalLM"}
#: The policy stacks, as INTERLOCK_POLICY writes them.
POLICIES = {
    "shipped": str(REPO / "policies.yaml"),
    "site": f"{REPO / 'policies.yaml'}:{SITE}",
}
COMPARED = ("runner", "cudagraph", "breakable", "compile")
#: interlock's exit code for a rule's refusal (interlock.core.errors.EXIT_CODES).
REFUSED_EXIT = 5


def worker(
    platform: str, device_arch: str, archs: list[str], surrogates: dict[str, str], out: Path
) -> int:
    """Run in the probe venv: every (architecture, policy) of one platform process;
    ``surrogates``: the architectures ``probe.py --inspect`` could not inspect, and why."""
    sys.path.insert(0, str(HERE))
    import probe

    os.environ["VLLM_PLUGINS"] = ""  # only the plugin registered below takes part
    for name in probe.ENV_VARS:
        os.environ.pop(name, None)
    probe.install_stand_ins(platform, device_arch)
    import vllm
    import vllm.triton_utils

    serve = probe.ServeConfig()
    registry = probe._require(probe._import("vllm.model_executor.models.registry"), "ModelRegistry")
    base_env = dict(os.environ)
    tmp = Path(tempfile.mkdtemp(prefix="vllm-plugin-check-"))
    models: dict[str, Path] = {}
    surrogates = dict(surrogates)
    for arch in archs:
        # As in the probe: a class that cannot be inspected or run here (CUDA-only imports,
        # a real checkpoint's sub-configs) is replaced by Llama's, found by vLLM's own run
        # without the plugin.
        models[arch] = _model_dir(probe, tmp, arch)
        if arch not in surrogates:
            trial = probe._quiet(serve.run, models[arch], {}, [], base_env)
            if "error" in trial and not probe._is_refusal(trial["error"]):
                surrogates[arch] = f"config path failed: {trial['error'][:300]}"
        if arch in surrogates:
            registry.register_model(arch, probe.SURROGATE_CLASS)
    # vLLM's own decision, without the plugin: shown beside each context's, so that a site
    # policy's effect (the plugin's decision, not vLLM's default) is visible.
    alone = {arch: probe._quiet(serve.run, models[arch], {}, [], base_env) for arch in archs}

    # The stand-in GPU ships Triton: the plugin reads vLLM's verdict here.
    vllm.triton_utils.HAS_TRITON = True
    import interlock
    from interlock.vllm import plugin

    if not Path(interlock.__file__).resolve().is_relative_to(REPO):
        raise SystemExit(
            f"vllm-plugin-check: error: the venv's interlock is {interlock.__file__}, not this "
            f"checkout's ({REPO}): install it with `pip install --no-deps -e {REPO}` "
            "(make vllm-plugin-check does)"
        )
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger(plugin.LOGGER)
    logger.addHandler(Collect(logging.INFO))
    logger.setLevel(logging.INFO)
    # As vLLM loads general plugins (vllm/plugins/__init__.py), allowing interlock alone;
    # the runs above, without it, already spent vLLM's once-per-process flag.
    os.environ["VLLM_PLUGINS"] = "interlock"
    plugins = _require_plugins()
    if set(plugins) != {"interlock"}:
        raise SystemExit(
            "vllm-plugin-check: error: vLLM's vllm.general_plugins group has "
            f"{sorted(plugins) or 'nothing'}, not interlock: is interlock installed in the venv?"
        )
    plugins["interlock"]()
    base_env["VLLM_PLUGINS"] = "interlock"
    results = []
    for arch in archs:
        for policy, stack in POLICIES.items():
            lines.clear()
            applied = len(plugin.APPLIED)
            row: dict[str, Any] = {
                "vllm": vllm.__version__, "platform": platform, "device_arch": device_arch,
                "architecture": arch, "policy": policy,
            }  # fmt: skip
            if arch in surrogates:
                row["surrogate"] = surrogates[arch]
            if alone[arch].get("outcome") == "decided":
                row["vllm_alone"] = {k: alone[arch][k] for k in COMPARED}
            try:
                record = probe._quiet(
                    serve.run, models[arch], {}, [], {**base_env, "INTERLOCK_POLICY": stack}
                )
            except SystemExit as stop:
                row["plugin_exit"] = stop.code
                record = {}
            row["log"] = list(lines)
            if len(plugin.APPLIED) > applied:
                row["plugin"] = {k: plugin.APPLIED[-1].decision[k] for k in COMPARED}
            if "error" in record:
                row["vllm_error"] = record["error"]
            elif record:
                row["final"] = {k: record[k] for k in COMPARED}
                refused = _environ_refused()
                if refused:
                    row["environ_refused"] = refused
            results.append(row)
    out.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in results))
    return 0


def _model_dir(probe: Any, root: Path, arch: str) -> Path:
    """The probe's stand-in checkpoint for ``arch``, without the DSA indexer's keys unless
    the model has one (:data:`DSA`)."""
    path = probe._model_dir(root, arch, stand_in=probe.encoder_decoder_type(arch))
    if arch not in DSA:
        config = json.loads((path / "config.json").read_text())
        for key in probe.EXTRA:
            config.pop(key, None)
        (path / "config.json").write_text(json.dumps(config))
    return path


def _environ_refused() -> str | None:
    """What the release says of the environment the plugin left in this process (every
    engine process inherits it): its own ``Platform.validate_environ``, which vLLM runs
    before the config exists (0.31.0 on; 0.34.0 refuses VLLM_USE_V2_MODEL_RUNNER other
    than 1). None when it accepts it or has no such check."""
    from vllm.platforms import current_platform

    validate = getattr(current_platform, "validate_environ", None)
    if validate is None:
        return None
    try:
        validate(False)  # unknown variables only warn, as vLLM's default
    except ValueError as exc:
        return " ".join(str(exc).split())
    return None


def _require_plugins() -> dict[str, Any]:
    import vllm.plugins

    group = getattr(vllm.plugins, "DEFAULT_PLUGINS_GROUP", None)
    load = getattr(vllm.plugins, "load_plugins_by_group", None)
    if group is None or load is None:
        raise SystemExit("vllm-plugin-check: error: vLLM moved vllm.plugins.load_plugins_by_group")
    return dict(load(group=group))


def verdict(row: dict[str, Any]) -> tuple[bool, str]:
    """Whether a context passes, and the one-line reason."""
    if "plugin_exit" in row:
        if row["plugin_exit"] == REFUSED_EXIT:
            return True, "refused by the policy: the plugin stopped the engine (exit 5)"
        return False, f"the plugin stopped the engine (exit {row['plugin_exit']})"
    if "vllm_error" in row:
        return False, f"vLLM raised: {row['vllm_error']}"
    if "plugin" not in row:
        return False, "the plugin applied no decision (not governed)"
    problems = []
    differ = [k for k in COMPARED if row["plugin"][k] != row["final"][k]]
    if differ:
        problems.append("DIFFERS: " + "; ".join(
            f"{k} plugin {_show(row['plugin'][k])}, vLLM {_show(row['final'][k])}" for k in differ
        ))  # fmt: skip
    if "environ_refused" in row:
        problems.append(f"vLLM refuses the environment the plugin left: {row['environ_refused']}")
    if problems:
        return False, "; ".join(problems)
    shown = " ".join(f"{k}={_show(row['final'][k])}" for k in COMPARED)
    own = row.get("vllm_alone", {})
    changed = " ".join(f"{k}={_show(v)}" for k, v in own.items() if row["final"][k] != v)
    return True, f"agrees: {shown}" + (f" (vLLM alone: {changed})" if changed else "")


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def drive(version: str, venv: Path, work: Path) -> int:
    python = venv / "bin" / "python"
    if not (venv / f".installed-{version}").exists():
        print(
            f"vllm-plugin-check: error: no probe venv for vLLM {version} at {venv}; run "
            f"tools/vllm_probe/setup_venv.sh {version} {venv}",
            file=sys.stderr,
        )
        return 2
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VLLM_CACHE_ROOT": str(work / "vllm-cache")}
    env.pop("INTERLOCK_DECISION_LOG", None)
    started = time.perf_counter()
    archs = sorted({arch for _, _, arch, _ in SEEDS})
    # Model classes are inspected on the CPU platform first, into vLLM's own cache, with
    # the surrogates' class (the probe's SURROGATE_CLASS).
    inspect = ",".join([*archs, "LlamaForCausalLM"])
    inspected = _run([str(python), str(HERE / "probe.py"), "--inspect", "--archs", inspect], env)
    surrogates = json.loads(inspected.splitlines()[-1])["not_inspected"]
    groups: dict[tuple[str, str], list[str]] = {}
    for platform, device_arch, arch, _ in SEEDS:
        groups.setdefault((platform, device_arch), []).append(arch)
    rows = []
    for (platform, device_arch), members in groups.items():
        out = work / f"{version}-{platform}-{device_arch}.jsonl"
        _run([str(python), str(Path(__file__).resolve()), "--worker", "--platform", platform,
              "--device-arch", device_arch, "--archs", ",".join(members), "--out", str(out),
              "--surrogates", json.dumps(surrogates)],
             env)  # fmt: skip
        rows += [json.loads(line) for line in out.read_text().splitlines() if line]
    names = {arch: name for _, _, arch, name in SEEDS}
    failed = 0
    print(f"vLLM {version}: interlock's plugin inside create_engine_config() (policies: "
          f"shipped = policies.yaml, site = policies.yaml:{SITE.relative_to(REPO)})")
    for row in rows:
        ok, why = verdict(row)
        failed += not ok
        mark = " (surrogate model class)" if "surrogate" in row else ""
        print(f"{'ok  ' if ok else 'FAIL'} {names[row['architecture']]} "
              f"({row['architecture']}) on {row['platform']}/{row['device_arch']}, "
              f"{row['policy']} policy{mark}: {why}")
        for line in row["log"]:
            print(f"       | {line}")
    print(f"vllm-plugin-check: vLLM {version}: {len(rows) - failed} of {len(rows)} contexts pass, "
          f"{time.perf_counter() - started:.0f} s")
    return 1 if failed else 0


def _run(argv: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.splitlines()[-20:])
        raise SystemExit(
            f"vllm-plugin-check: error: {' '.join(argv[1:3])} failed (exit {proc.returncode}):\n"
            f"{tail}"
        )
    return proc.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", help="the vLLM version (driver)")
    parser.add_argument("--venv", help="the probe venv (driver; setup_venv.sh)")
    parser.add_argument("--work", default=str(REPO / ".vllm-probe" / "plugin-check"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--platform", help=argparse.SUPPRESS)
    parser.add_argument("--device-arch", help=argparse.SUPPRESS)
    parser.add_argument("--archs", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--surrogates", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.platform, args.device_arch, args.archs.split(","),
                      json.loads(args.surrogates), Path(args.out))
    if not (args.vllm and args.venv):
        parser.error("--vllm and --venv are required")
    return drive(args.vllm, Path(args.venv), Path(args.work))


if __name__ == "__main__":
    sys.exit(main())
