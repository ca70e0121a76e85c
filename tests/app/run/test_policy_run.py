"""`policy run`: the decision, logged with its provenance, executed through the runner plugin."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from interlock.core.env import GRAPHS_FAIL_CAPTURE
from interlock.kernels.native import unavailable as native_unavailable
from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision

# The built-in backend a float32 CPU run prefers for the ops the native kernels implement,
# and what it captures graphs with (tapes of those kernels).
CPU = "torch" if native_unavailable("cpu") else "native"
CPU_GRAPHS = "debug" if native_unavailable("cpu") else "native"
LOG_LINE = re.compile(
    r"^policy run: runner=(\w+) \((.+?)\), cudagraph=(\w+) \((.+?)\), breakable=(\w+) \((.+?)\)$",
    re.M,
)


def test_runs_the_shipped_decision_and_logs_who_chose_each_field(policy_run, tiny_llama):
    result = policy_run("--model", tiny_llama, "--prompt-token-ids", "5,9,2", "--max-tokens", "6",
                        "--ignore-eos")
    assert result.code == 0, result.err
    runner, who_runner, mode, who_mode, breakable, who_breakable = LOG_LINE.search(
        result.err
    ).groups()
    assert (runner, mode, breakable) == ("mrv2", "full_and_piecewise", "false")
    for who in (who_runner, who_mode, who_breakable):
        assert re.fullmatch(r"defaults, .*policies\.yaml:\d+", who)
    assert "runner mrv2 from plugin mrv2 (interlock " in result.out
    assert "[0] prompt [5, 9, 2]" in result.out
    tokens = re.search(r"-> \[([\d, ]+)\] \(length\)", result.out).group(1)
    assert len(tokens.split(",")) == 6


def test_json_document_shape_and_tokens_equal_the_python_api(policy_run, tiny_llama):
    result = policy_run("--model", tiny_llama, "--prompt-token-ids", "5,9,2",
                        "--prompt-token-ids", "17", "--max-tokens", "5", "--ignore-eos",
                        "--set", "runner=mrv1", "--set", "cudagraph=full", "--json")
    assert result.code == 0, result.err
    doc = result.json()
    assert set(doc) >= {"decision", "provenance", "outputs", "metrics", "kernels", "graphs"}
    assert doc["decision"]["runner"] == "mrv1" and doc["decision"]["cudagraph"] == "full"
    assert doc["provenance"]["cudagraph"]["stage"] == "overrides"
    # The shipped default compile=true is not served by the built-in runners: stage 5 says so.
    assert doc["decision"]["compile"] is False
    assert doc["provenance"]["compile"]["stage"] == "capabilities"
    assert [o["prompt_token_ids"] for o in doc["outputs"]] == [[5, 9, 2], [17]]
    metrics = doc["metrics"]
    assert metrics["ttft_ms"] > 0 and metrics["tpot_ms"] > 0 and metrics["output_tokens"] == 10
    assert doc["kernels"]["rms_norm"] == f"{CPU} (interlock)"
    graphs = doc["graphs"]
    assert graphs["backend"] == CPU_GRAPHS and graphs["captured_sizes"] == [1, 2]
    assert graphs["fallbacks"] == [] and graphs["replays"]
    assert "trace" not in doc

    llm = LLM(str(tiny_llama), max_num_seqs=2, decision=Decision("mrv1", "full"))
    direct = llm.generate([[5, 9, 2], [17]], SamplingParams(temperature=0, max_tokens=5,
        ignore_eos=True))
    assert [o["token_ids"] for o in doc["outputs"]] == [list(o.token_ids) for o in direct]


def test_verbose_adds_the_trace_kernel_choices_and_captured_graphs(policy_run, tiny_llama):
    result = policy_run("--model", tiny_llama, "--max-tokens", "3", "--verbose", "--json")
    doc = result.json()
    assert any(step["stage"] == "capabilities" for step in doc["trace"])
    assert doc["kernel_choices"]["mrv2_prepare_inputs"]["reason"] == "preferred torch on cpu"
    text = policy_run("--model", tiny_llama, "--max-tokens", "3", "--verbose").out
    for heading in ("\ntrace\n", "\nkernels\n", "\ngraphs\n"):
        assert heading in text
    assert "captured full/decode/1t1s: 1 segment(s), 0 eager break(s)" in text
    assert "captured piecewise/any/1t1s: 3 segment(s), 2 eager break(s)" in text


def test_text_prompts_and_text_output_with_the_tokenizer(policy_run, tiny_llama):
    doc = policy_run("--model", tiny_llama, "--prompt", "t5 t9 t2", "--max-tokens", "4",
                     "--ignore-eos", "--json").json()
    [out] = doc["outputs"]
    assert out["prompt_token_ids"] == [5, 9, 2]
    assert out["text"] == " ".join(f"t{t}" for t in out["token_ids"])


def test_a_failed_capture_is_reported_not_hidden(policy_run, tiny_llama, monkeypatch):
    monkeypatch.setenv(GRAPHS_FAIL_CAPTURE.name, "all")
    result = policy_run("--model", tiny_llama, "--max-tokens", "3", "--debug-graphs")
    assert result.code == 0
    assert "capture(s) failed" in result.out
    pattern = r"fallback: full/decode/1t1s: capture failed \(CaptureError: .*forced"
    assert re.search(pattern, result.out)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model", "/no/such/dir"), "nor a directory containing config.json"),
        (("--set", "compile=true"), "does not support torch.compile on cpu"),
        (("--feature", "pipeline_parallel_size=2"), "does not support pipeline parallelism"),
        (("--platform", "rocm"), "runs the model on this machine, which is cpu"),
        (("--prompt-token-ids", "1,200"), "outside the vocabulary [0, 128)"),
        (("--prompt", "t1"), None),
    ],
)
def test_errors_exit_1_with_a_message(policy_run, tiny_llama, args, message, tmp_path):
    if args[0] != "--model":
        args = ("--model", tiny_llama, *args)
    if message is None:  # a text prompt without a tokenizer
        model = tmp_path / "no-tokenizer"
        model.mkdir()
        for name in ("config.json", "model.safetensors"):
            (model / name).write_bytes((tiny_llama / name).read_bytes())
        args = ("--model", model, "--prompt", "t1")
        message = "text prompts need a tokenizer.json"
    result = policy_run(*args)
    assert result.code == 1
    assert "policy: error:" in result.err and message in result.err


def test_an_unsupported_architecture_is_explained_but_not_run(policy_run, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["ToyLatentForCausalLM"], "num_attention_heads": 8,
        "kv_lora_rank": 512, "n_routed_experts": 8,
    }))
    result = policy_run("--model", tmp_path)
    assert result.code == 4  # a model error
    assert "runner=" in result.err  # the decision was made and logged first
    assert "ToyLatentForCausalLM" in result.err and "supported" in result.err


def test_usage_errors_exit_2(policy_run):
    assert policy_run("--model", "demo", "--prompt-token-ids", "a,b").code == 2
    assert policy_run("--prompt-token-ids", "1").code == 2  # --model is required


def test_the_demo_model_runs_offline():
    # A subprocess, as `make demo` runs it: the console entry point, the shipped policy.
    result = subprocess.run(
        [sys.executable, "-m", "interlock.cli", "run", "--model", "demo",
         "--max-tokens", "4",
         "--prompt-token-ids", "1,2,3", "--set", "cudagraph=full_decode_only", "--json"],
        capture_output=True, text=True, check=False, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["runner"]["name"] == "mrv2" and len(doc["outputs"][0]["token_ids"]) == 4


def test_debug_graphs_applies_to_the_run_only(policy_run, tiny_llama, monkeypatch):
    monkeypatch.delenv("INTERLOCK_DEBUG_GRAPHS", raising=False)
    doc = policy_run("--model", tiny_llama, "--max-tokens", "2", "--debug-graphs", "--json").json()
    assert doc["graphs"]["backend"] == "debug"
    assert "INTERLOCK_DEBUG_GRAPHS" not in os.environ


def test_a_deepseek_model_runs_as_decided_and_reports_its_latent_cache(policy_run, tiny_models):
    path = tiny_models.path("deepseek_v3")
    prompt = [7, 93, 12, 54, 3]
    text = policy_run("--model", path, "--prompt-token-ids", ",".join(map(str, prompt)),
                      "--max-tokens", "6", "--ignore-eos")
    assert text.code == 0, text.err
    # 2 layers x (kv_lora_rank 16 + qk_rope_head_dim 8) x 4 bytes; per head 2 x 4 x (16 + 12).
    assert "kv cache: MLA latent, 192 bytes/token (per-head K/V would take 896: 4.7x)" in text.out
    doc = policy_run("--model", path, "--prompt-token-ids", ",".join(map(str, prompt)),
                     "--max-tokens", "6", "--ignore-eos", "--json").json()
    assert doc["kv_cache"]["layout"] == "MLA latent"
    assert doc["kv_cache"]["bytes_per_token"] == 192
    with torch.no_grad():
        expected = tiny_models.hf("deepseek_v3").generate(
            input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt)),
            max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    assert doc["outputs"][0]["token_ids"] == expected[0, len(prompt):].tolist()


def test_json_metrics_are_the_benchs_on_the_same_requests(policy_run, tiny_llama):
    """`policy run --json`'s TTFT, TPOT and tokens/s are what bench/bench_cpu_engines.py
    computes (interlock/app/timing.py) from the run's own request times."""
    from interlock.app.timing import (
        RequestTimes,
        decode_ms_per_token,
        mean_ttft_ms,
        output_tokens_per_s,
    )

    doc = policy_run("--model", tiny_llama, "--prompt-token-ids", "5,9,2",
                     "--prompt-token-ids", "17", "--prompt-token-ids", "3,4", "--max-tokens",
                     "4", "--ignore-eos", "--json").json()
    times = [RequestTimes(output_tokens=len(o["token_ids"]), **o["times_s"])
             for o in doc["outputs"]]
    assert [t.arrival for t in times][0] == 0.0 and all(t.finish > 0 for t in times)
    metrics = doc["metrics"]
    assert metrics["ttft_ms"] == pytest.approx(mean_ttft_ms(times), abs=1e-2)
    assert metrics["tpot_ms"] == pytest.approx(decode_ms_per_token(times), abs=1e-2)
    assert metrics["output_tokens_per_s"] == pytest.approx(output_tokens_per_s(times), rel=1e-3)
