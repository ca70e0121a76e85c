"""The LLM API, chat templates and the tokenizer under hostile input (issue 28: C5, C6,
C11-C13, C15, U7, W8)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from gguf_builders import write_tiny_gguf  # noqa: E402

from interlock.app.template_sandbox import MAX_CHARS, RENDER_SECONDS  # noqa: E402
from interlock.app.tokenizer import ChatTemplate  # noqa: E402
from interlock.core.errors import InputError, InterlockError, ModelError  # noqa: E402
from interlock.llm import LLM  # noqa: E402
from interlock.runners.batching.sampling import SamplingParams  # noqa: E402
from interlock.runners.contract import Decision  # noqa: E402

MESSAGES = [{"role": "user", "content": "hi"}]
EAGER = Decision(runner="mrv1", cudagraph="none")


@pytest.fixture(scope="module")
def text_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model with a tokenizer and a chat template (a converted tiny GGUF)."""
    import os

    from interlock.runners.model import sources

    base = tmp_path_factory.mktemp("text")
    os.environ["INTERLOCK_CACHE_DIR"] = str(base / "cache")
    try:
        write_tiny_gguf(base / "m.gguf", "llama", "F32")
        converted = sources.converted(base / "m.gguf")
        directory = base / "model"
        shutil.copytree(converted, directory)
    finally:
        del os.environ["INTERLOCK_CACHE_DIR"]
    return directory


def _with_template(text_model: Path, tmp_path: Path, template: str) -> Path:
    directory = tmp_path / "templated"
    shutil.copytree(text_model, directory)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    return directory


# -- C5, C6: chat templates ---------------------------------------------------------------

C5 = {
    "division-by-zero": "{{ 1/0 }}",
    "include": "{% include 'other' %}",
    "import": "{% import 'other' as o %}",
    "extends": "{% extends 'base' %}",
    "recursion": "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "range-step-0": "{{ range(1, 5, 0)|list }}",
    "cycler-empty": "{{ cycler() }}",
    "lipsum": "{{ lipsum(0) }}",
    "4300-digit-int": "{{ ('1' * 5000)|int + 1 }}{{ 10 ** 5000 }}",
    "memory-doubling": "{% set ns = namespace(s='a') %}{% for i in range(80) %}"
                       "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
}


@pytest.mark.parametrize("case", C5)
def test_c5_any_template_failure_is_a_model_error_naming_the_file(case: str) -> None:
    with pytest.raises(ModelError) as caught:
        ChatTemplate(C5[case], {}, "tokenizer_config.json").render(MESSAGES)
    assert "tokenizer_config.json: chat_template" in str(caught.value)


C6 = {
    "nested-loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                    "{% endfor %}",
    "nested-string-loops": "{% set x = 'ab' * 1000000 %}{% for a in x %}{% for b in x %}"
                           "{% endfor %}{% endfor %}",
    "replace": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
               "{% set ns.s = ns.s.replace('a', 'aa') %}{% endfor %}{{ ns.s }}",
    "percent-width": "{{ '%0*d' % (2000000000, 1) }}",
    "percent-literal-width": "{{ '%02000000000d' % 1 }}",
    "center": "{{ 'a'.center(2000000000) }}",
    "center-filter": "{{ 'a'|center(2000000000) }}",
    "format-width": "{{ '{:>2000000000}'.format(1) }}",
    "string-times": "{{ 'a' * 2000000000 }}",
    "concat-doubling": "{% set ns = namespace(s='a') %}{% for i in range(80) %}"
                       "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "power": "{{ 9 ** 99999999 }}",
    "output": "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
    "join": "{{ ('a' * 4000000)|list|join('bbbb') }}",
}


@pytest.mark.parametrize("case", C6)
def test_c6_templates_are_bounded_in_time_and_size(case: str) -> None:
    import resource

    start = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ModelError) as caught:
        ChatTemplate(C6[case], {}, "tokenizer_config.json").render(MESSAGES)
    assert time.monotonic() - start < RENDER_SECONDS + 3
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kb < 20 * MAX_CHARS // 1024 + 200_000, grown_kb  # no gigabytes
    assert "tokenizer_config.json: chat_template failed" in str(caught.value)


def test_c6_a_real_template_still_renders() -> None:
    from gguf_builders import CHAT_TEMPLATE

    text = ChatTemplate(CHAT_TEMPLATE, {}, "t").render(MESSAGES * 3)
    assert text.count("<|im_start|>user") == 3 and text.endswith("<|im_start|>assistant\n")


def test_c5_c6_through_the_cli_exit_4(cli, text_model: Path, tmp_path: Path) -> None:
    for template in ("{{ 1/0 }}", "{{ 'a'.center(2000000000) }}", "{% include 'x' %}"):
        model = _with_template(text_model, tmp_path, template)
        res = cli("run", "--model", model, "--chat", "--prompt", "hi", "--max-tokens", "1",
                  "--json")
        assert res.code == 4, res.err
        assert "tokenizer_config.json: chat_template" in res.json()["error"]["message"]
        assert "Traceback" not in res.err
        shutil.rmtree(model)


# -- C13: a tokenizer that panics ---------------------------------------------------------


def test_c13_a_tokenizer_panic_is_a_model_error_naming_tokenizer_json(
    text_model: Path, tmp_path: Path
) -> None:
    model = tmp_path / "panicky"
    shutil.copytree(text_model, model)
    path = model / "tokenizer.json"
    data = json.loads(path.read_text())
    data["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(a|a)+$"},
                             "behavior": "Isolated", "invert": False}
    path.write_text(json.dumps(data))
    script = (
        "import sys\nfrom interlock.cli import main\n"
        f"sys.exit(main(['run', '--model', {str(model)!r}, '--prompt', 'a' * 100000 + 'b', "
        "'--max-tokens', '1', '--json']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1",
                                            "INTERLOCK_CACHE_DIR": str(tmp_path / "c")})
    assert done.returncode == 4, done.stderr[-2000:]
    error = json.loads(done.stdout)["error"]
    assert "tokenizer.json: the tokenizer failed: PanicException" in error["message"]
    assert "Traceback" not in done.stderr


# -- C11, W8: prompts and sampling values ------------------------------------------------


def test_c11_a_non_utf8_prompt_is_refused(cli, text_model: Path) -> None:
    llm = LLM(str(text_model), decision=EAGER, max_num_seqs=1, num_blocks=8)
    with pytest.raises(InputError, match="not valid UTF-8"):
        llm.generate("\ud800")
    res = cli("run", "--model", text_model, "--prompt", "ab\udcffcd", "--max-tokens", "1")
    assert res.code == 2 and "--prompt: not valid UTF-8 (byte 0xff" in res.err


def test_w8_bytes_are_not_token_ids_and_tiny_temperatures_are_refused(cli) -> None:
    llm = LLM("demo", decision=EAGER, max_num_seqs=1)
    with pytest.raises(InputError, match="bytes"):
        llm.generate(b"abc")
    for value in (1e-45, 1e-30, 1e-5):
        with pytest.raises(InputError, match="temperature"):
            SamplingParams(temperature=value)
        res = cli("run", "--model", "demo", "--prompt-token-ids", "1,2",
                  "--temperature", str(value), "--json")
        assert res.code == 1 and "temperature" in res.json()["error"]["message"]
    SamplingParams(temperature=0.0)
    SamplingParams(temperature=1e-3)


# -- C12: one LLM, several threads --------------------------------------------------------


def test_c12_concurrent_generate_calls_are_serialised() -> None:
    llm = LLM("demo", decision=EAGER, max_num_seqs=4)
    prompts = [[1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12, 13, 14, 15, 16]]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    expected = [o.token_ids for o in llm.generate(prompts, params)]
    results: dict[int, Any] = {}

    def work(i: int) -> None:
        try:
            results[i] = [o.token_ids for o in llm.generate(prompts, params)]
        except BaseException as exc:  # noqa: BLE001 - reported below
            results[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert all(results[i] == expected for i in range(4)), results


def test_c12_generate_from_its_own_callback_is_refused() -> None:
    llm = LLM("demo", decision=EAGER, max_num_seqs=1)

    def again(index: int, tokens: tuple[int, ...], reason: str | None) -> None:
        llm.generate([[1]], SamplingParams(temperature=0, max_tokens=1))

    with pytest.raises(InputError, match="on_tokens callback"):
        llm.generate([[1, 2]], SamplingParams(temperature=0, max_tokens=2), on_tokens=again)
    assert llm.generate([[1, 2]], SamplingParams(temperature=0, max_tokens=1))  # still usable


# -- C15, U7: LLM(...) arguments ----------------------------------------------------------

U7 = {
    "block_size-float": {"block_size": 2.5},
    "kv_cache_memory-nan": {"kv_cache_memory": math.nan},
    "max_num_seqs-0": {"max_num_seqs": 0},
    "load_format-bogus": {"load_format": "bogus"},
    "device-meta": {"device": "meta"},
    "device-garbage": {"device": "garbage"},
    "device-cuda:x": {"device": "cuda:x"},
    "seed--1": {"seed": -1},
    "seed-2^64": {"seed": 2**64},
    "seed-bool": {"seed": True},
    "dtype-bogus": {"dtype": "float8"},
    "max_model_len-float": {"max_model_len": 3.0},
    "tensor_parallel_size-0": {"tensor_parallel_size": 0},
    "num_blocks-10^12": {"num_blocks": 10**12},
    "max_num_seqs-10^6": {"max_num_seqs": 10**6},
    "max_num_batched_tokens-2^40": {"max_num_batched_tokens": 2**40},
}


@pytest.mark.parametrize("case", U7)
def test_u7_c15_llm_arguments_are_input_errors_named_like_the_cli(case: str) -> None:
    (name, value), = U7[case].items()
    start = time.monotonic()
    with pytest.raises(InputError) as caught:
        LLM("demo", **U7[case])
    assert time.monotonic() - start < 5  # refused before anything is allocated
    assert str(caught.value).startswith(f"{name}={value!r} is invalid; allowed: ")


def test_u7_device_cuda_without_cuda_names_the_device() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this torch sees a CUDA device")
    with pytest.raises(InputError, match="device='cuda': this torch sees no cuda device"):
        LLM("demo", device="cuda")


def test_u7_chat_none_and_decode_of_a_bad_id_are_input_errors(text_model: Path) -> None:
    llm = LLM(str(text_model), decision=EAGER, max_num_seqs=1, num_blocks=8)
    with pytest.raises(InputError, match="chat\\(\\) takes a list"):
        llm.chat(None)  # type: ignore[arg-type]
    for bad in (-1, 2**70, 1.5, 10**6):
        with pytest.raises(InputError, match="token id"):
            llm.decode([bad])
    assert isinstance(llm.decode([1, 2]), str)
    assert issubclass(InputError, InterlockError)


def test_c15_an_explicit_kv_cache_larger_than_memory_is_refused_before_allocating() -> None:
    start = time.monotonic()
    with pytest.raises(InputError, match=r"num_blocks=16777216 is invalid; allowed: a KV "
                       r"cache that fits in memory"):
        LLM("demo", num_blocks=2**24)
    assert time.monotonic() - start < 5
