"""Hypothesis fuzzing of the surfaces that read untrusted input: the policy loader, the
config.json reader, the safetensors header parser and the command line.

Invariants: only the documented error types escape (never a traceback), every case finishes
within a time bound, the exit code is a documented one, and ``--json`` output always parses.
``INTERLOCK_FUZZ_EXAMPLES`` sets the examples per test (a few dozen by default, so that the
suite stays well under two minutes on a small CI machine; raise it to fuzz for longer).
"""

from __future__ import annotations

import json
import os
import struct
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from interlock.core.errors import EXIT_CODES, ModelError, PolicyError
from interlock.policy.loader import load_policy_text, shipped_policy_path

EXAMPLES = int(os.environ.get("INTERLOCK_FUZZ_EXAMPLES", "30"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=timedelta(seconds=20),  # a hang fails the case; generous for a loaded machine
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=not os.environ.get("INTERLOCK_FUZZ_RANDOM"),
)
SHIPPED = shipped_policy_path().read_bytes()
HOSTILE_TEXT = st.sampled_from(
    [
        "",
        "-",
        "--",
        "\x1b[2J",
        "\u202e",
        "\x00",
        "a" * 5000,
        "nan",
        "inf",
        "1e20",
        "0x10",
        "-4",
        "../../etc/passwd",
        "/dev/zero",
        "::",
        "git:--output=/tmp/x",
        "é",
        "True",
        " ",
    ]
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20), HOSTILE_TEXT
)
trees = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=25,
)


def _loads_or_policy_error(data: bytes) -> None:
    try:
        load_policy_text(data, "fuzz.yaml")
    except PolicyError as exc:
        assert str(exc)  # a message, never empty


@FUZZ
@given(st.binary(max_size=2000))
def test_policy_loader_random_bytes(data: bytes) -> None:
    _loads_or_policy_error(data)


@FUZZ
@given(trees)
def test_policy_loader_random_yaml_trees(tree: object) -> None:
    _loads_or_policy_error(yaml.safe_dump(tree, allow_unicode=True).encode())


@FUZZ
@given(
    st.lists(
        st.tuples(st.integers(0, len(SHIPPED)), st.integers(0, 40), st.binary(max_size=12)),
        min_size=1,
        max_size=4,
    )
)
def test_policy_loader_mutations_of_the_shipped_policy(edits) -> None:  # type: ignore[no-untyped-def]
    data = bytearray(SHIPPED)
    for at, cut, insert in edits:
        data[at : at + cut] = insert
    _loads_or_policy_error(bytes(data))


@FUZZ
@given(st.one_of(st.binary(max_size=500), trees.map(lambda t: json.dumps(t).encode())))
def test_config_json_reader(tmp_path_factory, data: bytes) -> None:  # type: ignore[no-untyped-def]
    from interlock.policy.context import make_context
    from interlock.runners.model.config_json import load_config

    directory = tmp_path_factory.mktemp("cfg")
    (directory / "config.json").write_bytes(data)
    try:
        make_context(model=directory, platform="cpu")
    except PolicyError:
        pass
    try:
        load_config(directory)
    except ModelError:
        pass


LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 8,
    "hidden_size": 8,
    "intermediate_size": 8,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
}


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(
            sorted(
                {
                    *LLAMA,
                    "rope_scaling",
                    "rope_parameters",
                    "rms_norm_eps",
                    "eos_token_id",
                    "layer_types",
                    "max_position_embeddings",
                    "head_dim",
                }
            )
        ),
        trees,
        max_size=4,
    )
)
def test_config_values(changes: dict) -> None:  # type: ignore[type-arg]
    from interlock.runners.model.config_json import parse_config

    try:
        parse_config({**LLAMA, **changes})
    except ModelError:
        pass


headers = st.one_of(
    st.binary(max_size=200),
    st.dictionaries(
        st.text(max_size=8),
        st.one_of(
            trees,
            st.fixed_dictionaries(
                {
                    "dtype": st.sampled_from(["F32", "BF16", "I32", "BOOL", "X", 3]),
                    "shape": st.lists(st.integers(-2, 10), max_size=3),
                    "data_offsets": st.lists(st.integers(-5, 10**12), max_size=3),
                }
            ),
        ),
        max_size=3,
    ).map(lambda h: json.dumps(h).encode()),
)


@FUZZ
@given(headers, st.binary(max_size=64), st.booleans())
def test_safetensors_header_parser(tmp_path_factory, header, body, honest_length) -> None:  # type: ignore[no-untyped-def]
    import torch

    from interlock.runners.model.weights import FLOAT_DTYPES, SafetensorsFiles

    directory = tmp_path_factory.mktemp("st")
    length = len(header) if honest_length else len(header) + 1000
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", length) + header + body)
    try:
        files = SafetensorsFiles(directory)
        for name in sorted(files.names()):
            files.shape(name)
            stored = files.dtype(name)
            whole = files.get(name)
            if stored in FLOAT_DTYPES:  # what loading reads into a weight: the same values
                out = torch.empty_like(whole)
                files.copy_into(name, out)
                bits = [t.reshape(-1).view(torch.uint8) for t in (out, whole)]
                assert torch.equal(*bits)
    except ModelError:
        pass


COMMANDS = ["explain", "resolve", "table", "check", "test", "diff", "schema", "plugins", "run"]
FLAGS = [
    "--platform",
    "--device-arch",
    "--feature",
    "--env",
    "--set",
    "--policy",
    "--model",
    "--json",
    "--format",
    "--strict",
    "--fields",
    "--exit-code",
    "--prompt-token-ids",
    "--max-tokens",
    "--temperature",
    "--seed",
    "--min-coverage",
]
VALUES = st.one_of(
    HOSTILE_TEXT,
    st.sampled_from(
        [
            "cuda",
            "rocm",
            "cpu",
            "json",
            "LlamaForCausalLM",
            "GlmMoeDsaForCausalLM",
            "runner=mrv1",
            "capture_sizes=1,2",
            "tensor_parallel_size=2",
            "has_triton=false",
            "policies.yaml",
            "demo",
            "1,2,3",
            "0",
            "git:HEAD",
        ]
    ),
    st.text(max_size=15),
)


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[2])


@FUZZ
@given(
    st.sampled_from(COMMANDS),
    st.lists(st.one_of(st.sampled_from(FLAGS), VALUES), max_size=6),
    st.booleans(),
)
def test_command_line_surface(cli, in_repo, command, args, json_mode) -> None:  # type: ignore[no-untyped-def]
    if command == "run":  # keep a run cheap when it gets that far
        args = [*args, "--max-tokens", "1", "--set", "cudagraph=none"]
    argv = [command, *args, *(["--json"] if json_mode else [])]
    res = cli(*argv)
    assert res.code in set(EXIT_CODES.values()) - {EXIT_CODES["internal"]}, (argv, res.err)
    assert "Traceback" not in res.err, (argv, res.err)
    if json_mode and res.out.strip() and command not in ("schema",):
        json.loads(res.out)
