"""The probe's readers of release-specific vLLM code, on stand-in modules (no vLLM needed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "vllm_probe"

INLINE = '''
import os

class VllmConfig:
    model_config = None

    def __post_init__(self):
        if (
            self.model_config is not None
            and "VLLM_USE_BREAKABLE_CUDAGRAPH" not in os.environ
            and any(a in ("KimiK3ForConditionalGeneration", "KimiLinearForCausalLM")
                    for a in self.model_config.architectures)
        ):
            os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1"
        if os.environ.get("X") in ("a", "b"):
            pass
'''


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def probe() -> ModuleType:
    return _load("vllm_probe_under_test", TOOLS / "probe.py")


def test_the_inline_breakable_tuple_is_read_from_post_init(probe, tmp_path: Path) -> None:
    (tmp_path / "fake_config_vllm.py").write_text(INLINE)
    config = _load("fake_config_vllm", tmp_path / "fake_config_vllm.py")
    assert probe.inline_breakable_architectures(config) == [
        "KimiK3ForConditionalGeneration", "KimiLinearForCausalLM",
    ]  # fmt: skip


def test_a_release_without_the_tuple_stops_the_probe_naming_it(probe, tmp_path: Path) -> None:
    (tmp_path / "fake_moved.py").write_text("class VllmConfig:\n    def __post_init__(self):\n"
                                            "        pass\n")
    config = _load("fake_moved", tmp_path / "fake_moved.py")
    with pytest.raises(probe.ProbeError, match="breakable auto-enable of VllmConfig.__post_init__"):
        probe.inline_breakable_architectures(config)


def test_a_moe_architecture_gets_an_expert_count(probe, tmp_path: Path) -> None:
    import json

    dense = json.loads((probe._model_dir(tmp_path, "A") / "config.json").read_text())
    moe = json.loads((probe._model_dir(tmp_path, "B", moe=True) / "config.json").read_text())
    assert "num_local_experts" not in dense
    assert moe["num_local_experts"] > 0 and moe["architectures"] == ["B"]


def test_the_snapshot_takes_moe_from_catalogs_that_agree(tmp_path: Path) -> None:
    sys.path.insert(0, str(TOOLS))
    try:
        snapshot = _load("vllm_snapshot_under_test", TOOLS / "snapshot.py")
    finally:
        sys.path.remove(str(TOOLS))
    base = ("schema_version: 1\nversion: t\ndefaults: {runner: mrv2, cudagraph: none, "
            "breakable: false, compile: true}\ncatalog:\n")
    a_catalog = "  M: {moe: true}\n  D: {moe: false}\n  X: {moe: true}\n"
    (tmp_path / "a.yaml").write_text(base + a_catalog)
    (tmp_path / "b.yaml").write_text(base + "  M: {moe: true}\n  X: {moe: false}\n  U: {}\n")
    paths = [tmp_path / "a.yaml", tmp_path / "b.yaml"]
    assert snapshot.moe_architectures(paths) == ["M"]


def test_a_vllm_refusal_is_recorded_as_the_outcome_refused() -> None:
    probe = _load("vllm_probe_outcomes", TOOLS / "probe.py")
    refusal = "ValidationError: Value error, Model Runner V1 does not support: Step5"
    assert probe.classify({"error": refusal}) == {"outcome": "refused", "refusal": refusal}
    other = "ImportError: vllm.vllm_flash_attn requires the CUDA flash attention extensions"
    assert probe.classify({"error": other}) == {"probe_error": other}
    decided = {"outcome": "decided", "runner": "mrv2", "task": "generate"}
    assert probe.classify(dict(decided)) == decided


@pytest.mark.parametrize(
    ("runner_type", "encoder_decoder", "task"),
    [("generate", False, "generate"), ("pooling", False, "pooling"),
     ("draft", False, "draft"), ("generate", True, "encoder-decoder")],
)  # fmt: skip
def test_the_task_is_vllms_runner_type_with_encoder_decoder_apart(
    runner_type: str, encoder_decoder: bool, task: str
) -> None:
    probe = _load("vllm_probe_tasks", TOOLS / "probe.py")

    class ModelConfig:
        pass

    config = ModelConfig()
    config.runner_type = runner_type  # type: ignore[attr-defined]
    config.is_encoder_decoder = encoder_decoder  # type: ignore[attr-defined]
    assert probe.task_of(config) == task
    with pytest.raises(probe.ProbeError, match="ModelConfig.runner_type"):
        probe.task_of(object())


def test_the_round_trip_compares_refusals() -> None:
    roundtrip = _load("vllm_roundtrip_under_test", TOOLS / "roundtrip.py")
    decided = {"runner": "mrv2", "breakable": False, "cudagraph": "piecewise", "compile": True}
    refused = {"outcome": "refused"}
    vllm_refused = {"outcome": "refused", "refusal": "ValidationError: ... does not support"}
    assert roundtrip._differences(refused, vllm_refused) == []
    assert roundtrip._differences(refused, {"outcome": "decided", **decided}) == ["outcome"]
    assert roundtrip._differences(decided, vllm_refused) == ["outcome"]
    assert roundtrip._differences(decided, {"probe_error": "ImportError"}) == ["outcome"]
    assert roundtrip._differences(
        decided, {"outcome": "decided", **decided, "cudagraph": "full_and_piecewise"}
    ) == ["cudagraph"]


def _snapshot_module() -> ModuleType:
    sys.path.insert(0, str(TOOLS))
    try:
        return _load("vllm_snapshot_checked", TOOLS / "snapshot.py")
    finally:
        sys.path.remove(str(TOOLS))


def test_0_34_refusals_are_recorded_as_the_outcome_refused(probe) -> None:
    """vLLM 0.34.0 refuses VLLM_USE_V2_MODEL_RUNNER=0 (Platform.validate_environ) and what its
    one runner cannot serve (_validate_model_runner): refusals, never "not probed"."""
    for text in (
        "ValueError: VLLM_USE_V2_MODEL_RUNNER=0 is no longer supported: Model Runner V1 has "
        "been removed. Unset this variable.",
        "ValueError: The GPU model runner does not support: pipeline parallelism with "
        "external_launcher",
        "ValueError: The CPU model runner without Triton does not yet support: speculative "
        "decoding",
    ):
        assert probe.classify({"error": text}) == {"outcome": "refused", "refusal": text}


def test_the_breakable_verdict_is_read_from_the_final_config_where_it_lives(probe) -> None:
    """0.34.0 keeps the verdict in CompilationConfig.use_breakable_cudagraph and no longer
    writes the env var: the env reader would say false for every auto-enabled model."""
    from types import SimpleNamespace

    env_says_off = lambda: False  # noqa: E731 - the release's env reader
    assert probe.breakable_of(SimpleNamespace(use_breakable_cudagraph=True), env_says_off)
    assert not probe.breakable_of(SimpleNamespace(use_breakable_cudagraph=False), lambda: True)
    assert probe.breakable_of(SimpleNamespace(), lambda: True)  # up to 0.33.0: the env
    with pytest.raises(probe.ProbeError, match="use_breakable_cudagraph is unresolved"):
        probe.breakable_of(SimpleNamespace(use_breakable_cudagraph=None), env_says_off)


def _fake_vllm(root: Path, files: dict[str, str]) -> None:
    for name, text in {"vllm/__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            init = root / parent / "__init__.py"
            if parent != Path(".") and not init.exists():
                init.write_text("")
        path.write_text(text)


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A stand-in ``vllm`` package on sys.path (interlock's venv has none)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield lambda files: _fake_vllm(tmp_path, files)
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]


V2_WORKER = '''
class Worker:
    def _make_model_runner(self):
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner
        return GPUModelRunner()
'''


def test_a_release_with_one_runner_is_read_as_mrv2_from_its_worker(probe, fake_vllm) -> None:
    fake_vllm({"vllm/v1/worker/gpu_worker.py": V2_WORKER})
    assert probe.only_runner() == "mrv2"


def test_a_release_still_shipping_v1_stops_the_runner_reading(probe, fake_vllm) -> None:
    fake_vllm({"vllm/v1/worker/gpu_worker.py": V2_WORKER,
               "vllm/v1/worker/gpu_model_runner.py": ""})  # fmt: skip
    with pytest.raises(probe.ProbeError, match="Model Runner V1"):
        probe.only_runner()


def test_a_worker_building_another_runner_stops_the_runner_reading(probe, fake_vllm) -> None:
    fake_vllm({"vllm/v1/worker/gpu_worker.py": V2_WORKER.replace("gpu.model_runner", "other")})
    with pytest.raises(probe.ProbeError, match="no longer builds"):
        probe.only_runner()


def test_the_triton_stand_in_follows_where_the_config_code_reads_it(probe, fake_vllm) -> None:
    fake_vllm({"vllm/config/vllm.py": "", "vllm/triton_utils.py": "HAS_TRITON = False\n"})
    assert probe._triton_flag("cuda") is None  # 0.34.0's GPU config path reads none
    assert probe._triton_flag("cpu").__name__ == "vllm.triton_utils"


def test_a_triton_flag_read_elsewhere_in_the_config_stops_the_probe(probe, fake_vllm) -> None:
    fake_vllm({"vllm/config/vllm.py": "", "vllm/config/model.py": "from x import HAS_TRITON\n"})
    with pytest.raises(probe.ProbeError, match=r"HAS_TRITON in vllm/config/model.py"):
        probe._triton_flag("cuda")


def test_up_to_0_33_the_triton_flag_is_the_config_modules(probe, fake_vllm) -> None:
    fake_vllm({"vllm/config/vllm.py": "HAS_TRITON = False\n"})
    assert probe._triton_flag("rocm").__name__ == "vllm.config.vllm"


def test_an_encoder_decoder_architecture_gets_its_own_config(probe, tmp_path: Path) -> None:
    """vLLM takes encoder-decoder from the config's flag: Whisper runs on transformers'
    Whisper config, every decoder on the Llama-shaped one."""
    import json

    assert probe.encoder_decoder_type("WhisperForConditionalGeneration") == "whisper"
    assert probe.encoder_decoder_type("LlamaForCausalLM") is None
    assert probe.encoder_decoder_type("NoSuchArchitecture") is None
    whisper = probe._model_dir(tmp_path, "WhisperForConditionalGeneration", stand_in="whisper")
    config = json.loads((whisper / "config.json").read_text())
    assert config["is_encoder_decoder"] is True and config["model_type"] == "whisper"
    assert config["architectures"] == ["WhisperForConditionalGeneration"]


NAMED = {
    "default_breakable_cudagraph_architectures()": ["B", "Q"],
    "default_breakable_cudagraph_architectures() on rocm": ["R"],
}


def _decided(arch: str, platform: str, env: dict[str, str], **fields) -> dict:
    return {"vllm": "0.34.0", "architecture": arch, "platform": platform,
            "device_arch": "sm_90" if platform == "cuda" else "gfx942", "env": env,
            "outcome": "decided", "runner": "mrv2", "breakable": False, "compile": True,
            **fields}  # fmt: skip


def test_the_self_check_passes_readings_that_match_the_release_sets() -> None:
    snapshot = _snapshot_module()
    rows = [
        _decided("B", "cuda", {}, breakable=True, compile=False),
        _decided("R", "cuda", {}),
        _decided("R", "rocm", {}, breakable=True, compile=False),
        _decided("B", "rocm", {}),
        _decided("B", "cuda", {"VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}),
        _decided("X", "cuda", {"VLLM_USE_BREAKABLE_CUDAGRAPH": "1"}, breakable=True,
                 compile=False),
        # a multimodal wrapper hosting a breakable text model (0.34.0's hf_text_config match)
        _decided("W", "cuda", {}, text_architectures=["Q"], breakable=True, compile=False),
        {"vllm": "0.34.0", "architecture": "B", "platform": "cuda", "device_arch": "sm_90",
         "env": {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "outcome": "refused", "refusal": "..."},
    ]  # fmt: skip
    assert snapshot.self_check(rows, NAMED, {"only_runner": "mrv2"}) == []


@pytest.mark.parametrize(
    ("row", "says"),
    [
        # the env trap: an auto-enabled model recorded false
        (_decided("B", "cuda", {}), "B on cuda/sm_90 env {}: breakable false, but ['B'] in"),
        (_decided("W", "cuda", {}, text_architectures=["Q"]), "breakable false, but ['Q'] in"),
        (_decided("R", "rocm", {"VLLM_USE_BREAKABLE_CUDAGRAPH": "1"}),
         "breakable false, but VLLM_USE_BREAKABLE_CUDAGRAPH=1"),
        (_decided("X", "cuda", {}, runner="mrv1"), "runner mrv1, but the release runs only mrv2"),
        (_decided("X", "cuda", {"VLLM_USE_V2_MODEL_RUNNER": "0"}),
         "outcome decided, but vLLM 0.34.0 refuses VLLM_USE_V2_MODEL_RUNNER=0"),
        (_decided("B", "cuda", {}, breakable=True), "compile true with breakable true"),
    ],
)  # fmt: skip
def test_the_self_check_names_the_context_and_field_of_a_bad_reading(row, says) -> None:
    problems = _snapshot_module().self_check([row], NAMED, {"only_runner": "mrv2"})
    assert len(problems) == 1 and says in problems[0], problems


def test_the_self_check_fails_the_snapshot_command_loudly(tmp_path: Path) -> None:
    import json
    import subprocess

    path = tmp_path / "vllm-0.34.0.jsonl"
    header = {"snapshot": {"vllm": "0.34.0", "named_by_vllm_defaults": NAMED,
                           "release": {"only_runner": "mrv2"}}}  # fmt: skip
    path.write_text(json.dumps(header) + "\n" + json.dumps(_decided("B", "cuda", {})) + "\n")
    proc = subprocess.run(
        [sys.executable, str(TOOLS / "snapshot.py"), "--check", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "B on cuda/sm_90 env {}: breakable false" in proc.stderr


@pytest.mark.parametrize(
    "path", sorted((TOOLS.parents[1] / "conformance").glob("vllm-*.jsonl")), ids=lambda p: p.name
)
def test_every_committed_snapshot_passes_its_self_check(path: Path) -> None:
    assert _snapshot_module().check_file(path) == []


PLUGIN = {"runner": "mrv2", "cudagraph": "piecewise", "breakable": False, "compile": True}


@pytest.mark.parametrize(
    ("row", "passes", "says"),
    [
        ({"plugin": PLUGIN, "final": PLUGIN}, True, "agrees: runner=mrv2 cudagraph=piecewise"),
        ({"plugin": PLUGIN, "final": PLUGIN, "vllm_alone": {**PLUGIN, "cudagraph": "full"}},
         True, "compile=true (vLLM alone: cudagraph=full)"),
        ({"plugin": {**PLUGIN, "runner": "mrv1"}, "final": PLUGIN}, False,
         "DIFFERS: runner plugin mrv1, vLLM mrv2"),
        ({"plugin": PLUGIN, "final": {**PLUGIN, "breakable": True, "compile": False}}, False,
         "breakable plugin false, vLLM true; compile plugin true, vLLM false"),
        ({"plugin_exit": 5}, True, "refused by the policy"),
        ({"plugin_exit": 3}, False, "the plugin stopped the engine (exit 3)"),
        ({"plugin": PLUGIN, "vllm_error": "ValueError: VLLM_USE_V2_MODEL_RUNNER=0 is no longer "
          "supported"}, False, "vLLM raised: ValueError"),
        ({"final": PLUGIN}, False, "the plugin applied no decision"),
        ({"plugin": {**PLUGIN, "runner": "mrv1"}, "final": PLUGIN,
          "environ_refused": "VLLM_USE_V2_MODEL_RUNNER=0 is no longer supported"}, False,
         "runner plugin mrv1, vLLM mrv2; vLLM refuses the environment the plugin left: VLLM_"),
    ],
)  # fmt: skip
def test_the_plugin_check_compares_vllms_final_config_with_the_plugins_decision(
    row: dict, passes: bool, says: str
) -> None:
    check = _load("vllm_plugin_check_under_test", TOOLS / "plugin_check.py")
    ok, why = check.verdict(row)
    assert ok is passes and says in why, why


def test_the_plugin_checks_site_policy_moves_every_seed_away_from_the_shipped() -> None:
    """The site stack decides differently from the shipped policy on every seed context, so
    the plugin check shows the plugin's decision, not vLLM's default, reaching the config."""
    from interlock.policy import load_policy
    from interlock.policy.context import Context
    from interlock.policy.resolution import resolve

    check = _load("vllm_plugin_check_site", TOOLS / "plugin_check.py")
    shipped = load_policy([check.POLICIES["shipped"]])
    site = load_policy(check.POLICIES["site"].split(":"))
    for platform, device_arch, arch, _ in check.SEEDS:
        context = Context(arch, platform=platform, device_arch=device_arch,
                          engine={"vllm": "0.34.0"})  # fmt: skip
        ours = resolve(site, context).decision.to_dict()
        theirs = resolve(shipped, context).decision.to_dict()
        assert ours != theirs, (arch, platform)
