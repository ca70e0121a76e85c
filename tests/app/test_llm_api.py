"""The Python API: prompts as ids or text, outputs, reports, and what it refuses."""

from __future__ import annotations

import shutil

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.batching.scheduler import RequestRejected
from interlock.runners.contract import Decision, Runner
from interlock.runners.mrv1.runner import MRV1Runner, RunnerError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)


@pytest.fixture
def llama_llm(tiny_models) -> LLM:
    return LLM(str(tiny_models.path("llama")), num_blocks=16, max_model_len=64,
               decision=Decision())


def test_prompts_as_one_or_many_token_lists(llama_llm):
    [single] = llama_llm.generate([4, 5, 6], GREEDY)
    many = llama_llm.generate([[4, 5, 6], [7, 8]], [GREEDY, SamplingParams(temperature=0,
        max_tokens=2)])
    assert many[0].token_ids == single.token_ids and len(many[1].token_ids) == 2
    assert single.prompt_token_ids == (4, 5, 6)
    assert single.finish_reason == "length" and single.text is None
    assert single.ttft_s > 0 and single.tpot_s > 0
    with pytest.raises(ValueError, match="1 sampling params for 2 prompts"):
        llama_llm.generate([[1], [2]], [GREEDY])
    with pytest.raises(ValueError, match="text prompts need a tokenizer.json"):
        llama_llm.generate("hello", GREEDY)


def test_text_in_and_out_with_a_tokenizer(tiny_models, tmp_path):
    directory = shutil.copytree(tiny_models.path("llama"), tmp_path / "llama")
    vocab = {f"w{i}": i for i in range(128)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    llm = LLM(str(directory), num_blocks=16, max_model_len=64, decision=Decision())
    [from_text] = llm.generate("w4 w5 w6", GREEDY)
    [from_ids] = llm.generate([[4, 5, 6]], GREEDY)
    assert from_text.token_ids == from_ids.token_ids
    assert from_text.text == " ".join(f"w{t}" for t in from_ids.token_ids)


def test_an_oversized_request_is_rejected_before_anything_runs(tiny_models):
    llm = LLM(str(tiny_models.path("llama")), num_blocks=2, max_model_len=64,
              decision=Decision())
    with pytest.raises(RequestRejected, match=r"needs 4 KV blocks .* the cache has only 2"):
        llm.generate([[1, 2], list(range(60))], [GREEDY, SamplingParams(temperature=0,
            max_tokens=4)])
    assert not llm.step_loop.has_unfinished()
    assert len(llm.generate([[1, 2]], GREEDY)[0].token_ids) == GREEDY.max_tokens


def test_report_names_every_kernel_choice(llama_llm):
    report = llama_llm.report()
    assert (report.runner, report.device, report.dtype, report.cudagraph) == (
        "mrv1", "cpu", "float32", "none")
    ops = {k.op: k for k in report.kernels}
    assert {"rms_norm", "paged_attention", "paged_decode_attention", "sample"} <= set(ops)
    assert ops["rms_norm"].reason


def test_mrv1_is_a_runner_that_refuses_what_its_spec_does_not_serve(tiny_models):
    assert isinstance(MRV1Runner(), Runner)
    with pytest.raises(RunnerError, match="mrv1 does not serve torch.compile on cpu"):
        LLM(str(tiny_models.path("llama")), num_blocks=16, max_model_len=64,
            decision=Decision(cudagraph="full", compile=True))
    with pytest.raises(ValueError, match="cudagraph: bad value 'fast'; allowed: none, "
                       "piecewise"):
        Decision(cudagraph="fast")
    with pytest.raises(ValueError, match="max_model_len=1000 is invalid; allowed: 1..256"):
        LLM(str(tiny_models.path("llama")), max_model_len=1000)
