"""The family registry: one module per family, found by scanning; a new one is one file."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from tiny_models import NEW_TOKENS, PROMPTS

from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision
from interlock.runners.model import families
from interlock.runners.model.config import ConfigError
from interlock.runners.model.config_json import parse_config

TOY = "ToyLlamaForCausalLM"
# The whole of what adding a Llama-shaped family takes: this module in families/.
TOY_MODULE = textwrap.dedent('''
    """Toy: Llama's layers, with its own default rope base and a window in every layer."""

    from interlock.runners.model.family import Defaults, Family, window_everywhere

    FAMILIES = (
        Family("ToyLlamaForCausalLM", Defaults(rope_theta=123456.0, sliding_window=64),
               windows=window_everywhere),
    )
''')


@pytest.fixture
def toy_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """families/ as if toy.py had been added to it."""
    folder = tmp_path / "more_families"
    folder.mkdir()
    (folder / "toy.py").write_text(TOY_MODULE)
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(folder)])
    families.registry.cache_clear()
    yield
    families.registry.cache_clear()
    sys.modules.pop(f"{families.__name__}.toy", None)


def test_every_builtin_family_comes_from_its_family_module():
    declared = {
        name: next(m for m in ("llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral",
                               "deepseek_v2", "deepseek_v3", "deepseek_v32", "glm_moe_dsa",
                               "kimi_linear")
                   if family in sys.modules[f"{families.__name__}.{m}"].FAMILIES)
        for name, family in families.registry().items()
    }
    assert declared == {
        "LlamaForCausalLM": "llama", "MistralForCausalLM": "llama",
        "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
        "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3MoeForCausalLM": "qwen3_moe",
        "MixtralForCausalLM": "mixtral",
        "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
        "DeepseekV32ForCausalLM": "deepseek_v32", "GlmMoeDsaForCausalLM": "glm_moe_dsa",
        "KimiLinearForCausalLM": "kimi_linear",
    }
    assert families.checkpoint_names("MixtralForCausalLM").experts == ("w1", "w3", "w2")


def test_an_unknown_architecture_lists_the_registered_ones():
    with pytest.raises(ConfigError, match="'FooForCausalLM' is not supported; supported: .*"
                       "LlamaForCausalLM.*MixtralForCausalLM"):
        parse_config({"architectures": ["FooForCausalLM"]})


def test_a_new_family_module_is_all_a_llama_shaped_family_needs(toy_family, tiny_models, tmp_path):
    base = {"architectures": [TOY], "vocab_size": 16, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2}
    config = parse_config(base)
    assert (config.rope.theta, config.sliding_windows) == (123456.0, (64, 64))
    assert TOY in families.architectures()

    # Llama's tiny checkpoint relabelled: the toy family runs it token for token as
    # transformers runs Llama (windows wider than any sequence here change nothing).
    model = tmp_path / "toy"
    shutil.copytree(tiny_models.path("llama"), model)
    raw = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**raw, "architectures": [TOY]}))
    llm = LLM(str(model), dtype="float32", block_size=4, num_blocks=128, max_model_len=128,
              decision=Decision())
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=NEW_TOKENS,
        ignore_eos=True))
    assert [list(o.token_ids) for o in outputs] == tiny_models.oracle("llama").tokens


def test_a_family_module_without_families_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "empty_family.py").write_text("X = 1\n")
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(folder)])
    families.registry.cache_clear()
    try:
        with pytest.raises(TypeError, match="empty_family defines no FAMILIES tuple of Family"):
            families.registry()
    finally:
        families.registry.cache_clear()
        sys.modules.pop(f"{families.__name__}.empty_family", None)
