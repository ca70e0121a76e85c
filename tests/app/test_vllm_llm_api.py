"""Issue 24 item 13: ``LLM`` and ``SamplingParams`` behave like vLLM's where ported code
would notice: the fields, their defaults and meaning, refusals by name, vLLM-shaped
outputs, and a vLLM quickstart run unchanged apart from the import."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from tiny_models import RecordingRunner
from tokenizers import Tokenizer, models, pre_tokenizers

from interlock import LLM, SamplingParams
from interlock.core.errors import InputError
from interlock.runners.contract import Decision, Sampling, ScheduledBatch, ScheduledSequence
from interlock.runners.parallel import messages

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = [7, 93, 12, 54, 3, 88, 41]


def word(i: int) -> str:
    return f"t{i:03d}"  # no word is a substring of another


@pytest.fixture(scope="module")
def worded(tiny_models, tmp_path_factory) -> Path:
    """The tiny llama with a word-level tokenizer: token i is the word t{i:03d}."""
    directory = shutil.copytree(tiny_models.path("llama"), tmp_path_factory.mktemp("w") / "m")
    tokenizer = Tokenizer(models.WordLevel({word(i): i for i in range(128)}, unk_token=word(0)))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def make_llm(path: Path | str, runner: str = "mrv1", recording: bool = False) -> LLM:
    return LLM(str(path), num_blocks=32, max_model_len=96, decision=Decision(runner=runner),
               runner=RecordingRunner() if recording else None)


def test_the_defaults_are_vllms():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p, p.max_tokens) == (1, 1.0, 1.0, 0, 0.0,
        16)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.seed, p.logprobs, p.stop, p.stop_token_ids) == (None, None, (), ())
    assert not p.ignore_eos and not p.include_stop_str_in_output
    # the line, a TypeError before
    q = SamplingParams(stop=["."], n=2, repetition_penalty=1.1, logprobs=1)
    assert (q.stop, q.n, q.repetition_penalty, q.logprobs) == ((".",), 2, 1.1, 1)
    assert SamplingParams(stop=".").stop == (".",) and SamplingParams(top_k=-1).top_k == 0


@pytest.mark.parametrize("field, value", [
    ("best_of", 2), ("use_beam_search", True), ("guided_decoding", {"json": {}}),
    ("logit_bias", {1: 5.0}), ("prompt_logprobs", 1), ("min_tokens", 3),
    ("skip_special_tokens", False), ("bad_words", ["x"]),
])
def test_every_other_vllm_field_is_refused_by_name(field, value):
    with pytest.raises(InputError, match=rf"interlock does not support vLLM's '{field}'"):
        SamplingParams(**{field: value})


def test_a_vllm_field_at_its_default_asks_nothing_and_is_accepted():
    assert SamplingParams(best_of=None, skip_special_tokens=True, min_tokens=0) == SamplingParams()


def test_an_unknown_keyword_is_refused_by_name():
    with pytest.raises(InputError, match=r"no field 'temprature' \(neither interlock nor vLLM"):
        SamplingParams(temprature=0.5)


@pytest.mark.parametrize("kwargs, message", [
    ({"n": 0}, "n=0 is invalid"),
    ({"presence_penalty": 2.5}, r"presence_penalty=2.5 is invalid; allowed: a number in \[-2, 2\]"),
    ({"frequency_penalty": -3}, "frequency_penalty=-3.0 is invalid"),
    ({"repetition_penalty": 0}, "repetition_penalty=0 is invalid; allowed: a number > 0"),
    ({"min_p": 1.5}, r"min_p=1.5 is invalid; allowed: a number in \[0, 1\]"),
    ({"logprobs": -1}, "logprobs=-1 is invalid"),
    ({"stop": [""]}, "stop=.* is invalid; allowed: a string, a list of non-empty strings"),
    ({"max_tokens": 0}, "max_tokens=0 is invalid"),
])
def test_values_are_checked_as_input_errors(kwargs, message):
    with pytest.raises(InputError, match=message):
        SamplingParams(**kwargs)


def penalised(logits: torch.Tensor, prompt: list[int], output: list[int], p: SamplingParams):
    """vLLM's penalties, written out: repetition over prompt and output, then frequency
    and presence over the output."""
    logits = logits.float().clone()
    seen = sorted(set(prompt) | set(output))
    for t in seen:
        x = logits[t]
        logits[t] = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
    for t in set(output):
        logits[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    return logits


@pytest.mark.parametrize("kwargs", [
    {"repetition_penalty": 1.8},
    {"frequency_penalty": 1.5},
    {"presence_penalty": 2.0},
    {"repetition_penalty": 1.3, "frequency_penalty": 0.7, "presence_penalty": -0.4},
])
def test_penalties_change_the_logits_as_vllm_defines_them(tiny_models, kwargs):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, **kwargs)
    llm = make_llm(tiny_models.path("llama"), recording=True)
    [out] = llm.generate([PROMPT], params)
    tokens = list(out.token_ids)
    runner = llm.step_loop.runner
    assert isinstance(runner, RecordingRunner)
    for step, logits in enumerate(runner.logits):
        expected = penalised(logits[0], PROMPT, tokens[:step], params)
        assert tokens[step] == int(expected.argmax()), step
    plain = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert plain[0].token_ids != out.token_ids  # the penalty did change what was generated


def test_mrv2_applies_the_same_penalties_and_logprobs(tiny_models):
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=3,
                            repetition_penalty=1.5, frequency_penalty=0.5)
    one = make_llm(tiny_models.path("llama"), "mrv1").generate([PROMPT, [5, 6]], params)
    two = make_llm(tiny_models.path("llama"), "mrv2").generate([PROMPT, [5, 6]], params)
    for a, b in zip(one, two, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].cumulative_logprob == pytest.approx(b.outputs[0].cumulative_logprob,
                                                                abs=1e-4)


def test_logprobs_are_the_raw_distributions(tiny_models):
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=6, ignore_eos=True, logprobs=2,
                            presence_penalty=1.0)
    llm = make_llm(tiny_models.path("llama"), recording=True)
    [out] = llm.generate([PROMPT], params)
    completion = out.outputs[0]
    assert completion.logprobs is not None and len(completion.logprobs) == 6
    total = 0.0
    runner = llm.step_loop.runner
    assert isinstance(runner, RecordingRunner)
    for logits, token, entry in zip(runner.logits, completion.token_ids, completion.logprobs,
                                    strict=True):
        expected = torch.log_softmax(logits[0].float(), dim=-1)
        best = expected.topk(2)
        assert list(entry)[:2] == best.indices.tolist()  # the 2 most likely, best first
        assert entry[token].logprob == pytest.approx(float(expected[token]), abs=1e-5)
        assert entry[token].rank == int((expected > expected[token]).sum()) + 1
        assert len(entry) in (2, 3)  # and the sampled token where it is not among them
        total += float(expected[token])
    assert completion.cumulative_logprob == pytest.approx(total, abs=1e-4)
    assert SamplingParams().logprobs is None
    [plain] = llm.generate([PROMPT], SamplingParams(max_tokens=2))
    assert plain.outputs[0].logprobs is None and plain.outputs[0].cumulative_logprob is None


def test_min_p_keeps_only_tokens_near_the_most_likely(tiny_models):
    llm = make_llm(tiny_models.path("llama"), recording=True)
    params = SamplingParams(temperature=1.5, min_p=0.3, seed=11, max_tokens=24, ignore_eos=True)
    [out] = llm.generate([PROMPT], params)
    runner = llm.step_loop.runner
    assert isinstance(runner, RecordingRunner)
    for logits, token in zip(runner.logits, out.token_ids, strict=True):
        probs = torch.softmax(logits[0].float() / 1.5, dim=-1)
        assert probs[token] >= 0.3 * probs.max() - 1e-6
    free = llm.generate([PROMPT], SamplingParams(temperature=1.5, seed=11, max_tokens=24,
                                                 ignore_eos=True))
    assert free[0].token_ids != out.token_ids


def test_a_seed_fixes_the_samples_and_n_draws_independent_ones(tiny_models):
    llm = make_llm(tiny_models.path("llama"))
    params = SamplingParams(n=3, temperature=1.0, seed=42, max_tokens=10, ignore_eos=True)
    [first] = llm.generate([PROMPT], params)
    [again] = make_llm(tiny_models.path("llama")).generate([PROMPT], params)
    assert [c.index for c in first.outputs] == [0, 1, 2]
    assert [c.token_ids for c in first.outputs] == [c.token_ids for c in again.outputs]
    assert len({c.token_ids for c in first.outputs}) == 3  # independent samples
    # completion i is the one seed + i draws alone
    single = SamplingParams(temperature=1.0, seed=43, max_tokens=10, ignore_eos=True)
    assert llm.generate([PROMPT], single)[0].token_ids == first.outputs[1].token_ids
    other = llm.generate([PROMPT], SamplingParams(temperature=1.0, seed=7, max_tokens=10,
                                                  ignore_eos=True))
    assert other[0].token_ids != first.outputs[0].token_ids


def test_the_default_temperature_samples(tiny_models):
    llm = make_llm(tiny_models.path("llama"))
    greedy = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    drawn = llm.generate([PROMPT], SamplingParams(seed=5, max_tokens=16, ignore_eos=True))
    assert greedy[0].token_ids != drawn[0].token_ids


def test_stop_strings_end_the_text_as_vllm_cuts_it(worded):
    llm = make_llm(worded)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    [full] = llm.generate("t007 t093 t012", greedy)
    tokens = full.outputs[0].token_ids
    stop = word(tokens[3])
    assert stop not in " ".join(word(t) for t in tokens[:3])
    [cut] = llm.generate("t007 t093 t012", SamplingParams(temperature=0, max_tokens=12,
                                                          ignore_eos=True, stop=[stop, "zzz"]))
    c = cut.outputs[0]
    assert (c.finish_reason, c.stop_reason) == ("stop", stop)
    assert c.token_ids == tokens[:4]
    assert c.text == " ".join(word(t) for t in tokens[:3]) + " "
    assert cut.prompt == "t007 t093 t012" and cut.finished
    [kept] = llm.generate("t007 t093 t012", SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True, stop=stop, include_stop_str_in_output=True))
    assert kept.outputs[0].text == " ".join(word(t) for t in tokens[:4])


def test_a_stop_token_ends_the_request_and_its_text(worded):
    llm = make_llm(worded)
    [full] = llm.generate("t007 t093", SamplingParams(temperature=0, max_tokens=8,
                                                      ignore_eos=True))
    tokens = full.outputs[0].token_ids
    at = tokens[2]
    [stopped] = llm.generate("t007 t093", SamplingParams(temperature=0, max_tokens=8,
                                                         stop_token_ids=[at]))
    c = stopped.outputs[0]
    end = tokens.index(at)
    assert (c.finish_reason, c.stop_reason, c.token_ids) == ("stop", at, tokens[: end + 1])
    assert c.text == " ".join(word(t) for t in tokens[:end])  # vLLM leaves the stop token out


def test_stop_strings_need_a_tokenizer(tiny_models):
    llm = make_llm(tiny_models.path("llama"))
    with pytest.raises(InputError, match=r"prompts\[0\]: stop=\['x'\]: .* no tokenizer.json"):
        llm.generate([PROMPT], SamplingParams(stop="x"))


def test_max_tokens_none_runs_to_the_model_length(tiny_models):
    llm = make_llm(tiny_models.path("llama"))
    [out] = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=None,
                                                  ignore_eos=True))
    assert len(out.token_ids) == 96 - len(PROMPT) and out.finish_reason == "length"


def test_the_vllm_quickstart_runs_unchanged_apart_from_the_import(worded, capsys):
    model = str(worded)
    # vLLM's quickstart (docs/getting_started/quickstart.md), its one change the import.
    from interlock import LLM, SamplingParams

    prompts = [
        "t001 t002 t003",
        "t010 t020",
        "t100",
        "t050 t060 t070 t080",
    ]
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95)

    llm = LLM(model=model)
    outputs = llm.generate(prompts, sampling_params)

    for output in outputs:
        prompt = output.prompt
        generated_text = output.outputs[0].text
        print(f"Prompt: {prompt!r}, Generated text: {generated_text!r}")
    # --- end of the example
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines] == [f"Prompt: {p!r}" for p in prompts]
    for output in outputs:
        assert len(output.outputs) == 1 and output.finished
        assert output.outputs[0].text and output.outputs[0].finish_reason in ("length", "stop")


def test_penalised_sampling_crosses_to_tensor_parallel_ranks():
    seq = ScheduledSequence(
        request_id="r", token_ids=(4,), start_position=3, block_table=(0,),
        sampling=Sampling(0.7, 5, 0.9, 11, 0.1, 0.5, 0.25, 1.2, 3), step=1,
        prompt_token_ids=(1, 2, 3), output_token_ids=(4,),
    )
    batch = ScheduledBatch((seq,))
    wire = messages.decode(messages.encode(messages.step_message(batch)))
    assert messages.step_batch(wire) == batch


def test_penalties_apply_to_graph_replays_too(tiny_models):
    """mrv2 replaying full graphs: the penalties act on the replayed logits."""
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                            repetition_penalty=1.5, logprobs=1)
    tokens = {}
    for mode in ("none", "full"):
        llm = LLM(str(tiny_models.path("llama")), num_blocks=32, max_model_len=64,
                  max_num_seqs=4, decision=Decision(runner="mrv2", cudagraph=mode))
        tokens[mode] = [o.token_ids for o in llm.generate([PROMPT, [5, 6]], params)]
        graphs = llm.report().graphs
        assert mode == "none" or (graphs is not None and sum(graphs.replays.values()) > 0)
    assert tokens["none"] == tokens["full"]
