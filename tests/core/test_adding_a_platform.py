"""Adding a platform is one entry in interlock/core/platform.py.

A copy of the package gets a new GPU platform ``npu`` in ``PLATFORMS`` and nothing else;
then the policy's domain and ``policy table`` include it, both runner plugins declare it
(mrv2 requiring Triton there, as on every GPU platform), the kernel registry prefers
Triton on it and its torch references serve it, torch.compile and tensor parallelism are
declared unsupported (it has no compiled graphs and no distributed backend), and stage 5
falls back from mrv2 to mrv1 there without Triton.
"""

from __future__ import annotations

from pathlib import Path

from checkout import changed_files, copy_package, python_in

HOME = "interlock/core/platform.py"
#: The last entry of PLATFORMS, and the new one written after it.
ANCHOR = ('        Platform("cpu", "cpu", gpu=False, compiled_graphs=False, '
          'distributed_backend="gloo"),\n')
ENTRY = ('        Platform("npu", "npu", gpu=True, compiled_graphs=False, '
         'distributed_backend=None),\n')

CHECKS = '''
import io, json
from contextlib import redirect_stdout

from interlock.cli import main
from interlock.core.platform import GPU_PLATFORMS, PLATFORM_NAMES, device_for
from interlock.kernels import MODEL_OPS, REGISTRY
from interlock.kernels.registry import default_preference
from interlock.plugins import load_registry
from interlock.plugins.capabilities import capability_stage
from interlock.policy.context import make_context
from interlock.policy.domain import Domain
from interlock.policy.loader import load_policy
from interlock.policy.resolution import resolve

assert PLATFORM_NAMES[-1] == "npu" and "npu" in GPU_PLATFORMS and device_for("npu") == "npu"
policy = load_policy()
assert "npu" in Domain.of(policy).platforms
registry = load_registry()
mrv1, mrv2 = registry.runner("mrv1").spec, registry.runner("mrv2").spec
assert mrv2.platforms["npu"].requires == ("has_triton",), mrv2.platforms["npu"]
assert mrv1.platforms["npu"].requires == ()
assert not mrv1.platforms["npu"].compile and mrv1.platforms["npu"].max_tensor_parallel_size == 1
assert default_preference("npu") == ["triton", "torch"]
for op in MODEL_OPS:
    assert REGISTRY.select(op, "npu", "float32", ["torch"]).impl.backend == "torch"
stage = capability_stage()
context = make_context("LlamaForCausalLM", platform="npu", features={"has_triton": False})
assert resolve(policy, context, capabilities=stage).decision.runner == "mrv1"
out = io.StringIO()
with redirect_stdout(out):
    main(["table", "--format", "json"])
rows = [row for row in json.loads(out.getvalue()) if row["platform"] == "npu"]
assert rows and all(row["runner"] == "mrv2" and row["compile"] is False for row in rows), rows
print("ok")
'''


def test_a_new_platform_is_one_entry_in_core_platform(tmp_path: Path) -> None:
    root = copy_package(tmp_path / "src")
    path = root / HOME
    source = path.read_text()
    assert source.count(ANCHOR) == 1, "the cpu entry of PLATFORMS moved"
    path.write_text(source.replace(ANCHOR, ANCHOR + ENTRY))
    original = copy_package(tmp_path / "original")
    assert changed_files(original / "interlock", root / "interlock") == [HOME]
    (tmp_path / "checks.py").write_text(CHECKS)
    done = python_in(root, str(tmp_path / "checks.py"), cwd=tmp_path,
                     env={"INTERLOCK_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
