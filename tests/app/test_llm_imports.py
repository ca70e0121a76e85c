"""Issue 24 item 13, the parts done: ``from interlock import LLM, SamplingParams`` (lazily, so
``import interlock`` and ``interlock.policy`` never import torch), an ``LLM`` docstring, and
``device="cuda"`` on a CPU build of torch is a clear error. (vLLM's SamplingParams fields and
defaults, and vLLM-shaped outputs, are not done: see the engineer's report.)"""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_from_interlock_import_llm_and_sampling_params() -> None:
    from interlock import LLM, SamplingParams
    from interlock.llm import LLM as Direct
    from interlock.runners.batching.sampling import SamplingParams as Engine

    assert LLM is Direct and SamplingParams is Engine
    [out] = LLM("demo").generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=3))
    assert len(out.token_ids) == 3


def test_import_interlock_and_the_policy_stay_torch_free() -> None:
    code = (
        "import sys, interlock, interlock.policy; "
        "from interlock.policy import load_policy; load_policy(); "
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"


def test_an_unknown_name_is_an_attribute_error() -> None:
    import interlock

    with pytest.raises(AttributeError, match="no attribute 'LLMs'"):
        interlock.LLMs  # noqa: B018


def test_llm_has_a_docstring() -> None:
    from interlock import LLM

    doc = LLM.__doc__ or ""
    assert "generate(prompts, sampling_params)" in doc and "from interlock import LLM" in doc


def test_cuda_on_a_cpu_torch_is_a_clear_error() -> None:
    import torch

    from interlock import LLM
    from interlock.core.errors import InputError

    if torch.cuda.is_available():
        pytest.skip("this torch sees a GPU")
    with pytest.raises(InputError, match="device='cuda': this torch sees no cuda device"):
        LLM("demo", device="cuda")
