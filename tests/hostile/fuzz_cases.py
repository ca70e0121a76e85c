"""The cases of ``test_fuzz_files_and_numbers.py``, run by :func:`hostile.bounded.bounded` in a
spawned child: module-level functions of picklable arguments, importing what they use."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

from interlock.core.errors import EXIT_CODES


def cli_json(argv: list[str]) -> int:
    """``policy ARGV --json``: its exit code is documented and its stdout parses."""
    from interlock.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*argv, "--json"])
    assert code in EXIT_CODES.values() and code != EXIT_CODES["internal"], err.getvalue()
    json.loads(out.getvalue())
    return code


def render_chat_template(source: str) -> int:
    """The length of ``source`` rendered as a chat template over one user message."""
    from interlock.app.tokenizer import ChatTemplate

    template = ChatTemplate(source, {"bos_token": "<s>"}, "tokenizer_config.json")
    return len(template.render([{"role": "user", "content": "hi"}]))


def build_meta_model(config: dict[str, Any]) -> int:
    """The number of parameters of the model ``config`` describes, built on the meta device."""
    from interlock.runners.dispatch import build_kernel_table
    from interlock.runners.model.checkpoint import build_model
    from interlock.runners.model.config_json import parse_config

    parsed = parse_config(config)
    model = build_model(parsed, build_kernel_table("cpu", "float32"), "float32", "meta",
                        min(parsed.max_position_embeddings, 64))
    return sum(1 for _ in model.parameters())


def generate_with_llm(arguments: dict[str, Any]) -> str:
    """``LLM("demo", **arguments)`` generates one token."""
    from interlock.llm import LLM
    from interlock.runners.batching.sampling import SamplingParams

    llm = LLM("demo", **arguments)
    llm.generate([[1, 2]], SamplingParams(temperature=0, max_tokens=1))
    return "ran"
