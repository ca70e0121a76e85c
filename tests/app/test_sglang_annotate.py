"""tools/sglang_probe/annotate.py on a small package laid out as SGLang's: the refs it cites, the
catalog it lists, what it refuses to guess, and that it leaves the rest of the file alone.
(The shipped policy against the installed SGLang: tests/app/test_sglang_probe.py.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
URL = "https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/"

POLICY = """\
# a comment the tool keeps
schema_version: 1
version: "sglang-0.5.23"

defaults: {decode_cuda_graph: full}

rules:
  # cuda
  - id: cuda-defaults
    when: {platform: cuda}
    set: {attention_backend: fa3}
    reason: SGLang 0.5.23 resolves these (_attention_backend_default, _handle_gpu_memory_settings)
  - id: cuda-sizes
    when: {architecture: [AForCausalLM, BModel], platform: cuda}
    set: {prefill_cuda_graph_max_bs: 512}
    reason: SGLang 0.5.23 resolves this (_handle_gpu_memory_settings)
  - id: cpu-refused
    when: {platform: cpu}
    refuse: "ValueError: no"
    reason: SGLang 0.5.23 refuses it in _handle_gpu_memory_settings
"""

OVERRIDES = """\
from typing import Any


def _attention_backend_default(view: Any) -> dict:
    return {}
"""

MEMORY = """\
def handle_gpu_memory_settings(server_args):
    declare_resolution(server_args, "_handle_gpu_memory_settings", chunked_prefill_size=1)

    def later():
        declare_resolution(server_args, "_later_label", x=1)

    declare_resolution(server_args, "_handle_gpu_memory_settings", cuda_graph_config=None)
"""


@pytest.fixture(scope="module")
def annotate() -> ModuleType:
    path = ROOT / "tools" / "sglang_probe" / "annotate.py"
    spec = importlib.util.spec_from_file_location("sglang_annotate", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A package with SGLang's layout: two steps, and a registry of three modules."""
    root = tmp_path / "sglang"
    files = {
        "srt/arg_groups/overrides.py": OVERRIDES,
        "srt/arg_groups/memory_hook.py": MEMORY,
        "srt/models/a.py": "class AForCausalLM:\n    pass\n\n\nEntryClass = [AForCausalLM]\n",
        "srt/models/b.py": "from sglang.srt.models.common import BModel\n\nEntryClass = BModel\n",
        "srt/models/utils.py": "def helper():\n    pass\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_each_rule_cites_the_line_that_declares_its_first_step(
    annotate: ModuleType, package: Path
) -> None:
    text = annotate.annotate(POLICY, package, "0.5.23")
    refs = [line.strip() for line in text.splitlines() if line.strip().startswith("ref:")]
    assert refs == [
        # A function of that name.
        f"ref: {URL}srt/arg_groups/overrides.py#L4",
        # A source label: the function whose declarations carry it.
        f"ref: {URL}srt/arg_groups/memory_hook.py#L1",
        f"ref: {URL}srt/arg_groups/memory_hook.py#L1",
    ]
    # Each ref right under its rule's reason, in the reason's indent.
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("ref:"):
            assert lines[i - 1].startswith("    reason: ") and line.startswith("    ref: ")


def test_the_catalog_is_the_registrys_names_and_the_rest_stays(
    annotate: ModuleType, package: Path
) -> None:
    text = annotate.annotate(POLICY, package, "0.5.23")
    catalog = "\ncatalog:\n  AForCausalLM: {}\n  BModel: {}\n"
    assert text.endswith(catalog)
    # Nothing else changed: without the lines it added, the file is what it was.
    kept = [line for line in text.removesuffix(catalog).splitlines(keepends=True)
            if not line.startswith("    ref: ")]
    assert "".join(kept) == POLICY
    # A second run, and a run on a file whose refs and catalog went stale, give the same.
    assert annotate.annotate(text, package, "0.5.23") == text
    stale = text.replace("overrides.py#L4", "overrides.py#L9").replace("  BModel: {}\n", "")
    assert annotate.annotate(stale, package, "0.5.23") == text


def test_a_name_found_nowhere_is_an_error_naming_it(annotate: ModuleType, package: Path) -> None:
    policy = POLICY.replace("_attention_backend_default", "_attention_backend_defualt")
    with pytest.raises(annotate.AnnotateError, match=r"rule cuda-defaults: "
                       r"'_attention_backend_defualt' is neither a function"):
        annotate.annotate(policy, package, "0.5.23")


def test_a_name_with_two_places_is_an_error_naming_both(
    annotate: ModuleType, package: Path
) -> None:
    (package / "srt" / "arg_groups" / "other.py").write_text(OVERRIDES)
    with pytest.raises(annotate.AnnotateError, match=r"'_attention_backend_default' is defined "
                       r"2 times \(srt/arg_groups/other.py:4, srt/arg_groups/overrides.py:4\)"):
        annotate.annotate(POLICY, package, "0.5.23")
    (package / "srt" / "arg_groups" / "other.py").write_text(
        "def elsewhere(args):\n    declare_resolution(args, '_handle_gpu_memory_settings')\n"
    )
    with pytest.raises(annotate.AnnotateError,
                       match="'_handle_gpu_memory_settings' is declared from 2 functions"):
        annotate.annotate(POLICY.replace("_attention_backend_default, ", ""), package, "0.5.23")


def test_a_reason_naming_no_step_is_an_error(annotate: ModuleType, package: Path) -> None:
    policy = POLICY.replace("refuses it in _handle_gpu_memory_settings", "refuses it")
    with pytest.raises(annotate.AnnotateError, match="rule cpu-refused: its reason names no step"):
        annotate.annotate(policy, package, "0.5.23")


def test_an_entry_class_whose_name_is_not_its_class_is_an_error(
    annotate: ModuleType, package: Path
) -> None:
    (package / "srt" / "models" / "c.py").write_text(
        "from sglang.srt.models.a import AForCausalLM\n\nCModel = AForCausalLM\n"
        "EntryClass = [CModel]\n"
    )
    with pytest.raises(annotate.AnnotateError, match=r"EntryClass lists CModel \(c.py:4\)"):
        annotate.annotate(POLICY, package, "0.5.23")


def test_a_policy_for_another_release_is_refused(annotate: ModuleType, package: Path) -> None:
    with pytest.raises(annotate.AnnotateError, match="not sglang-0.5.24"):
        annotate.annotate(POLICY, package, "0.5.24")
