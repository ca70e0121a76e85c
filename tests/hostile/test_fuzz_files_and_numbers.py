"""Hypothesis fuzzing of the surfaces of the second hostile pass: GGUF files, chat
templates, conformance snapshots, evidence records, config.json numbers and ``LLM(...)``.

The invariants of ``test_fuzz.py``, each case run in a spawned child under CPU, memory and
wall-time limits (``bounded.py``): only documented errors (an ``InterlockError`` whose
kind has an exit code; never a traceback), a bounded time, bounded memory, and ``--json``
output that parses. ``INTERLOCK_FUZZ_EXAMPLES`` sets the examples per test (default 30 as
in ``test_fuzz.py``; a few of these run fewer: each builds a model).
"""

from __future__ import annotations

import json
import os
import struct
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile import fuzz_cases
from hostile.bounded import bounded

EXAMPLES = int(os.environ.get("INTERLOCK_FUZZ_EXAMPLES", "30"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=timedelta(seconds=60),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=not os.environ.get("INTERLOCK_FUZZ_RANDOM"),
)
FEW = settings(FUZZ, max_examples=max(3, EXAMPLES // 5))
# -- GGUF files -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def valid_gguf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    from gguf_builders import write_tiny_gguf

    path = tmp_path_factory.mktemp("fuzz-gguf") / "tiny.gguf"
    write_tiny_gguf(path, "llama", "Q8_0")
    return path.read_bytes()


def _header_fields(data: bytes) -> list[tuple[int, int]]:
    """(offset, size) of the fixed-size numbers of the header: version, counts, and the
    first key-value pairs' lengths and types (the places a mutation hurts most)."""
    fields = [(4, 4), (8, 8), (16, 8)]
    at = 24
    for _ in range(6):
        (length,) = struct.unpack_from("<Q", data, at)
        fields.append((at, 8))
        at += 8 + length
        fields.append((at, 4))
        (kind,) = struct.unpack_from("<I", data, at)
        at += 4
        if kind == 8:
            fields.append((at, 8))
            (size,) = struct.unpack_from("<Q", data, at)
            at += 8 + size
        elif kind == 9:
            fields += [(at, 4), (at + 4, 8)]
            break
        else:
            at += {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}[kind]
    return fields


BIG = st.sampled_from([0, 1, 2, 7, 8, 9, 12, 13, 255, 2**31 - 1, 2**32 - 1, 2**62, 2**63,
                       2**64 - 1])


@FUZZ
@given(
    st.lists(st.tuples(st.integers(0, 10**9), BIG), min_size=1, max_size=3),
    st.lists(st.tuples(st.integers(0, 10**9), st.binary(min_size=1, max_size=8)), max_size=3),
    st.sampled_from([None, 24, 100, 1000, 5000, -64]),
)
def test_gguf_mutations(tmp_path_factory, valid_gguf: bytes, numbers, splices, cut) -> None:  # type: ignore[no-untyped-def]
    """Counts, lengths, types and offsets of a valid tiny GGUF replaced by hostile numbers,
    bytes spliced anywhere (tokenizer metadata, tensor descriptions), the file cut."""
    data = bytearray(valid_gguf)
    fields = _header_fields(valid_gguf)
    for pick, value in numbers:
        at, size = fields[pick % len(fields)]
        data[at : at + size] = (value % (1 << (8 * size))).to_bytes(size, "little")
    for pick, raw in splices:
        at = pick % len(data)
        data[at : at + len(raw)] = raw
    if cut is not None:
        data = data[:cut]
    directory = tmp_path_factory.mktemp("gguf-case")
    path = directory / "m.gguf"
    path.write_bytes(bytes(data))
    os.environ["INTERLOCK_CACHE_DIR"] = str(directory / "cache")
    try:
        bounded(fuzz_cases.cli_json, ["explain", "--model", str(path), "--platform", "cpu"])
    finally:
        del os.environ["INTERLOCK_CACHE_DIR"]


# -- chat templates -------------------------------------------------------------------------

_ATOMS = ["'a'", "'%0*d'", "1", "2000000000", "messages", "m", "m.content", "range(99999)",
          "namespace(s='ab')", "ns.s", "[1, 2]", "{'k': 1}", "none", "9", "0", "'{:>9}'",
          "cycler()", "lipsum", "x", "loop.index"]
_BINOPS = ["*", "**", "+", "~", "%", "/", "//", "-"]
_CALLS = [".center({})", ".replace('a', {})", ".ljust({})", "|center({})", "|indent({})",
          "|join({})", "|list", "|int", "|string", "|length", ".format({})", "|format({})"]


def _expr(depth: int) -> st.SearchStrategy[str]:
    atom = st.sampled_from(_ATOMS)
    if depth == 0:
        return atom
    inner = _expr(depth - 1)
    return st.one_of(
        atom,
        st.builds(lambda a, op, b: f"({a} {op} {b})", inner, st.sampled_from(_BINOPS), inner),
        st.builds(lambda a, call, b: f"{a}{call.format(b)}", inner, st.sampled_from(_CALLS),
                  inner),
    )


def _template(depth: int) -> st.SearchStrategy[str]:
    expr = _expr(2)
    leaf = st.one_of(expr.map(lambda e: "{{ " + e + " }}"), st.just("text"),
                     expr.map(lambda e: "{% set ns = namespace(s=" + e + ") %}"),
                     expr.map(lambda e: "{% set ns.s = " + e + " %}"))
    if depth == 0:
        return leaf
    inner = st.lists(_template(depth - 1), min_size=1, max_size=3).map("".join)
    return st.one_of(
        leaf,
        st.builds(lambda e, body: "{% for x in " + e + " %}" + body + "{% endfor %}", expr,
                  inner),
        st.builds(lambda e, body: "{% if " + e + " %}" + body + "{% endif %}", expr, inner),
        inner.map(lambda b: "{% macro f(n) %}" + b + "{{ f(n) }}{% endmacro %}{{ f(1) }}"),
        st.sampled_from(["{% include 'x' %}", "{% import 'x' as y %}", "{% extends 'x' %}"]),
        inner.map(lambda b: "{% set ns = namespace(s='ab') %}{% for i in range(64) %}" + b
                  + "{% endfor %}"),
    )


@FUZZ
@given(_template(2))
def test_chat_template_grammar(source: str) -> None:
    """Any template either renders (at most 4 M characters) or is a model error, within
    the render bound, under the memory limit."""
    from interlock.app.template_sandbox import MAX_CHARS

    outcome = bounded(fuzz_cases.render_chat_template, source)
    if outcome[0] == "ok":
        assert outcome[1] <= MAX_CHARS
    else:
        assert outcome[1] == "model"


# -- snapshots and evidence records ---------------------------------------------------------

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(),
                    st.text(max_size=12), st.sampled_from(["", "\n", "cuda", "mrv1", "\x00"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
ROW = {"architecture": "LlamaForCausalLM", "platform": "cuda", "device_arch": "sm_90",
       "env": {}, "runner": "mrv2", "cudagraph": "full_and_piecewise", "breakable": False,
       "compile": True, "capture_sizes": None, "outcome": "decided", "task": "generate"}


@FUZZ
@given(
    st.lists(st.dictionaries(st.sampled_from(sorted({*ROW, "refusal", "probe_error",
                                                      "surrogate"})), VALUES, max_size=4),
             max_size=4),
    st.one_of(st.none(), st.binary(max_size=200)),
)
def test_snapshots(tmp_path_factory, edits, raw) -> None:  # type: ignore[no-untyped-def]
    directory = tmp_path_factory.mktemp("snap")
    path = directory / "s.jsonl"
    lines = [json.dumps({"snapshot": {"vllm": "0"}})]
    lines += [json.dumps({**ROW, **edit}, allow_nan=True) for edit in edits]
    path.write_bytes("\n".join(lines).encode() + (raw or b""))
    code = bounded(fuzz_cases.cli_json, ["conformance", str(path)])
    assert code[0] == "ok"


@pytest.fixture(scope="module")
def bench_record(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from interlock.measure import Workload, run

    directory = tmp_path_factory.mktemp("rec")
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64}))
    return run(directory, vary={"runner": ["mrv1", "mrv2"]},
               workload=Workload(prompt_len=4, max_tokens=2, trials=2, warmup=0),
               load_format="dummy")


EVIDENCE_POLICY = """\
schema_version: 1
version: "f1"
catalog:
  LlamaForCausalLM: {family: llama, attention: gqa, moe: false}
defaults: {runner: mrv2, cudagraph: none, breakable: false, compile: false}
rules:
  - id: cpu-llama
    when: {platform: cpu, architecture: LlamaForCausalLM}
    set: {runner: mrv1}
    reason: mrv1 measured faster on this machine in the cited record
    ref: https://example.invalid/measured
    evidence: [r.json]
"""


def _mutate(tree: Any, path: list[Any], value: Any) -> Any:
    if not path or not isinstance(tree, (dict, list)) or not tree:
        return value
    keys = list(tree) if isinstance(tree, dict) else list(range(len(tree)))
    key = keys[path[0] % len(keys)]
    copy = dict(tree) if isinstance(tree, dict) else list(tree)
    copy[key] = _mutate(tree[key], path[1:], value)
    return copy


@FEW
@given(st.lists(st.tuples(st.lists(st.integers(0, 50), max_size=5), VALUES), min_size=1,
                max_size=3), st.booleans())
def test_evidence_records(tmp_path_factory, bench_record, edits, as_bytes) -> None:  # type: ignore[no-untyped-def]
    directory = tmp_path_factory.mktemp("evidence")
    record: Any = bench_record
    for path, value in edits:
        record = _mutate(record, path, value)
    text = json.dumps(record, allow_nan=True).encode()
    (directory / "r.json").write_bytes(text[: len(text) // 2] if as_bytes else text)
    (directory / "policy.yaml").write_text(EVIDENCE_POLICY)
    argv = ["check", "--policy", str(directory / "policy.yaml")]
    assert bounded(fuzz_cases.cli_json, argv)[0] == "ok"


# -- config.json numbers over the ranges ------------------------------------------------------

NUMBERS = st.one_of(
    st.integers(-(2**64), 2**64), st.floats(allow_nan=False),
    st.sampled_from([0, -1, 1, 15, 2**31, 2**62, 2**63, 1e-300, 1e300, 1e39, 3.5e38, -0.0]),
)
KEYS = ["hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
        "num_hidden_layers", "max_position_embeddings", "rope_theta", "rms_norm_eps",
        "sliding_window", "intermediate_size", "vocab_size"]
ROPE_KEYS = ["factor", "original_max_position_embeddings", "low_freq_factor",
             "high_freq_factor", "beta_fast", "beta_slow", "attention_factor", "mscale"]


@FUZZ
@given(
    st.dictionaries(st.sampled_from(KEYS), NUMBERS, max_size=3),
    st.one_of(st.none(), st.tuples(st.sampled_from(["linear", "llama3", "yarn"]),
                                   st.dictionaries(st.sampled_from(ROPE_KEYS), NUMBERS,
                                                   max_size=3))),
    st.sampled_from(["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"]),
)
def test_config_numbers_over_their_ranges(tmp_path_factory, numbers, rope, arch) -> None:  # type: ignore[no-untyped-def]
    """A config either builds a (meta) model or is a model error naming a key: never a
    ZeroDivisionError, OverflowError or MemoryError from model construction."""
    config: dict[str, Any] = {"architectures": [arch], "vocab_size": 64, "hidden_size": 32,
                              "intermediate_size": 48, "num_hidden_layers": 1,
                              "num_attention_heads": 4, "num_key_value_heads": 2,
                              "max_position_embeddings": 64, **numbers}
    if rope is not None:
        kind, params = rope
        config["rope_scaling"] = {"rope_type": kind, "factor": 2.0, **params}
    bounded(fuzz_cases.build_meta_model, config)


# -- LLM(...) arguments -----------------------------------------------------------------------

ARGUMENTS = {
    "dtype": st.sampled_from(["auto", "float32", "bfloat16", "float8", "", 3]),
    "load_format": st.sampled_from(["auto", "dummy", "bogus", None]),
    "device": st.sampled_from([None, "cpu", "cuda", "meta", "garbage", "cpu:0", "cuda:x", 7]),
    "seed": st.one_of(st.integers(-(2**65), 2**65), st.floats(), st.booleans()),
    "block_size": st.one_of(st.integers(-2, 10**6), st.floats()),
    "num_blocks": st.one_of(st.none(), st.integers(-2, 10**13)),
    "kv_cache_memory": st.one_of(st.none(), st.integers(-2, 10**15), st.floats()),
    "max_num_seqs": st.one_of(st.integers(-2, 10**7), st.floats()),
    "max_num_batched_tokens": st.integers(-2, 2**41),
    "max_model_len": st.one_of(st.none(), st.integers(-2, 2**40), st.floats()),
    "tensor_parallel_size": st.integers(-1, 3),
}


@FEW
@given(st.fixed_dictionaries({}, optional=ARGUMENTS))
def test_llm_arguments(arguments: dict[str, Any]) -> None:
    """LLM("demo", **arguments) builds, or is refused as a documented error, quickly."""
    arguments.setdefault("load_format", "dummy")
    if arguments.get("tensor_parallel_size", 1) > 1:
        arguments["tensor_parallel_size"] = 1  # starting ranks is the TP tests' job
    bounded(fuzz_cases.generate_with_llm, arguments)
