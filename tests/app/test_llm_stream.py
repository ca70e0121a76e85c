"""``LLM.stream``: deltas after each step that join to ``generate``'s outputs (tokens,
text, logprobs, finish reasons), ``n`` > 1, stop strings held back, a stream closed early
aborting what runs, and the LLM held while a stream is open."""

from __future__ import annotations

import shutil
from collections import defaultdict

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from interlock.core.errors import InputError
from interlock.llm import LLM, StreamOutput
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def worded(tiny_models, tmp_path_factory) -> LLM:
    """The tiny llama with a word-level tokenizer: token i is the text ``wi``."""
    directory = shutil.copytree(tiny_models.path("llama"), tmp_path_factory.mktemp("m") / "m")
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(128)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    return LLM(str(directory), num_blocks=32, max_model_len=64, decision=Decision())


def joined(stream: list[StreamOutput]) -> dict[tuple[int, int], dict]:
    """Per (prompt, completion): the deltas' tokens, text, logprobs joined; finish reasons."""
    out: dict[tuple[int, int], dict] = defaultdict(
        lambda: {"tokens": (), "text": "", "logprobs": [], "reasons": []})
    for step in stream:
        for delta in step.outputs:
            entry = out[step.prompt_index, delta.index]
            entry["tokens"] += delta.token_ids
            entry["text"] += delta.text or ""
            entry["logprobs"] += delta.logprobs or []
            entry["reasons"].append(delta.finish_reason)
            entry["stop_reason"] = delta.stop_reason
    return dict(out)


def test_the_deltas_join_to_what_generate_returns(worded):
    prompts = ["w4 w5 w6", [7, 8]]
    params = [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)]
    expected = worded.generate(prompts, params)
    stream = list(worded.stream(prompts, params))
    parts = joined(stream)
    assert set(parts) == {(0, 0), (1, 0)}
    for p, want in enumerate(expected):
        got = parts[p, 0]
        assert got["tokens"] == want.token_ids and got["text"] == want.text
        # One token a step, each step's delta unfinished but the last.
        assert got["reasons"] == [None] * (len(want.token_ids) - 1) + ["length"]
    assert parts[0, 0]["logprobs"] == expected[0].outputs[0].logprobs
    assert parts[1, 0]["logprobs"] == []  # not asked for: None in every delta
    # A prompt's outputs say finished only in its last one; prompt text is kept.
    for p in (0, 1):
        mine = [s for s in stream if s.prompt_index == p]
        assert [s.finished for s in mine] == [False] * (len(mine) - 1) + [True]
        assert all(s.request_id == mine[0].request_id for s in mine)
    assert stream[0].prompt == "w4 w5 w6" and stream[0].prompt_token_ids == (4, 5, 6)
    assert not worded.step_loop.has_unfinished()


def test_n_completions_stream_each(worded):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=5, ignore_eos=True)
    [expected] = worded.generate("w1 w2", params)
    parts = joined(list(worded.stream("w1 w2", params)))
    assert sorted(parts) == [(0, 0), (0, 1), (0, 2)]
    for completion in expected.outputs:
        assert parts[0, completion.index]["tokens"] == completion.token_ids
        assert parts[0, completion.index]["text"] == completion.text


def test_a_stop_string_is_never_streamed(worded):
    [free] = worded.generate("w4 w5 w6", GREEDY)
    words = free.text.split()
    stop = " ".join(words[2:4])  # two words: held back until it cannot be a stop
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, stop=[stop])
    [cut] = worded.generate("w4 w5 w6", params)
    stream = list(worded.stream("w4 w5 w6", params))
    texts = [d.text for s in stream for d in s.outputs]
    assert "".join(texts) == cut.text == " ".join(words[:2]) + " "
    assert all(stop not in t for t in texts)
    last = stream[-1].outputs[-1]
    assert (last.finish_reason, last.stop_reason) == ("stop", stop)


def test_without_a_tokenizer_the_deltas_are_tokens(tiny_models):
    llm = LLM(str(tiny_models.path("llama")), num_blocks=16, max_model_len=64,
              decision=Decision())
    [expected] = llm.generate([[4, 5]], GREEDY)
    stream = list(llm.stream([[4, 5]], GREEDY))
    assert all(d.text is None for s in stream for d in s.outputs)
    assert sum((d.token_ids for s in stream for d in s.outputs), ()) == expected.token_ids


def test_closing_a_stream_aborts_what_runs_and_frees_the_llm(worded):
    allocator = worded.step_loop.scheduler.allocator
    free_blocks = allocator.num_free
    stream = worded.stream(["w1 w2", "w3"], SamplingParams(temperature=0, max_tokens=20,
                                                            ignore_eos=True))
    first = next(stream)
    assert not first.finished and allocator.num_free < free_blocks
    stream.close()
    assert not worded.step_loop.has_unfinished()
    assert allocator.num_free == free_blocks  # the aborted requests' blocks are back
    # break out of a for loop closes it as well, and the LLM serves the next call.
    for _ in worded.stream("w1", GREEDY):
        break
    assert not worded.step_loop.has_unfinished()
    assert len(worded.generate("w1", GREEDY)[0].token_ids) == 6


def test_the_llm_is_held_while_its_stream_is_open(worded):
    stream = worded.stream("w1", GREEDY)
    next(stream)
    with pytest.raises(InputError, match="inside a stream's loop"):
        worded.generate("w2", GREEDY)
    with pytest.raises(InputError, match="inside a stream's loop"):
        next(worded.stream("w2", GREEDY))
    assert len(joined(list(stream))[0, 0]["tokens"]) == 5  # the rest of it still comes
    assert len(worded.generate("w2", GREEDY)[0].token_ids) == 6


def test_a_bad_request_is_refused_at_the_first_next_and_nothing_runs(worded):
    stream = worded.stream(["w1", "w2"], [GREEDY, "greedy"])  # type: ignore[list-item]
    with pytest.raises(InputError, match=r"prompts\[1\]: expected SamplingParams"):
        next(stream)
    assert not worded.step_loop.has_unfinished()
    with pytest.raises(InputError, match="1 sampling params for 2 prompts"):
        next(worded.stream(["w1", "w2"], [GREEDY]))
