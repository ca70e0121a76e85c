"""bench/bench_kernels.py: its cases compare the two implementations correctly, at shrunken
model sizes in the interpreter; without a GPU it says so and exits 0. On a GPU, every case
runs at full size: Triton and torch timed side by side, and their outputs must agree."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from kernel_checks import ACCUMULATING_TOLERANCES, DEVICE, PLATFORM

SCRIPT = Path(__file__).parents[2] / "bench" / "bench_kernels.py"


def _load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_kernels", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


bench = _load_bench()
FIRST_CASE_OF_EACH_OP = list({case.op: case for case in reversed(bench.CASES)}.values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_without_a_gpu_it_says_so_and_exits_zero() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "needs a CUDA or ROCm GPU" in result.stdout


def test_an_unknown_op_is_an_error_listing_the_known_ones() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--op", "layer_norm"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "unknown op(s) ['layer_norm']; known: fused_add_rms_norm" in result.stderr


@pytest.mark.parametrize("case", [
    # paged_attention's case takes ~25 s in the interpreter on a 2-core machine.
    pytest.param(case, marks=pytest.mark.slow) if case.op == "paged_attention" else case
    for case in FIRST_CASE_OF_EACH_OP
], ids=lambda c: c.op)
def test_case_compares_triton_with_torch_at_small_sizes(
    case: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = {"HIDDEN": 64, "Q_HEADS": 2, "KV_HEADS": 1, "HEAD": 32, "INTER": 48,
             "EXPERTS": 8, "TOP_K": 2, "MOE_HIDDEN": 32, "MOE_INTER": 16, "VOCAB": 3000}
    for name, value in small.items():
        monkeypatch.setattr(bench, name, value)
    torch.manual_seed(0)
    setup = case.build(torch.device(DEVICE), torch.float32)
    assert setup.bytes_moved > 0
    compared = bench.max_difference(setup, *bench.implementations(case.op, PLATFORM,
                                                                   torch.float32))
    assert compared is not None
    diff, reference_max = compared
    tolerance = ACCUMULATING_TOLERANCES[torch.float32]
    assert diff <= (0 if setup.exact else tolerance["atol"] + tolerance["rtol"] * reference_max)


@pytest.fixture(scope="module")
def gpu_roofline() -> tuple[torch.device, torch.Tensor, float | None, float]:
    device = torch.device("cuda")
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    return device, flush, bench.peak_bandwidth(device), bench.copy_bandwidth(device, flush)


@pytest.mark.gpu
@pytest.mark.parametrize("case", bench.CASES, ids=lambda c: f"{c.op}[{c.shape}]")
def test_gpu_kernel_timed_against_torch(case: object, gpu_roofline: tuple) -> None:
    row = bench.run_case(case, torch.bfloat16, 10, *gpu_roofline)
    print(f"\n{row}")
    if row.max_abs_diff is None:
        return  # random sampling: covered by test_triton_sampling on the device
    if row.exact:
        assert row.max_abs_diff == 0, row
    else:
        # A coarse check at full size (the unit tests, which also run on the device, are the
        # precise one): four bfloat16 ulps of the largest output, since the reference rounds
        # partial sums (e.g. each expert's contribution) to bfloat16 and the kernels do not.
        assert row.max_abs_diff <= 2**-5 * row.reference_max, row
