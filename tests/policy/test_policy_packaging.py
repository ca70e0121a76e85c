"""The shipped policy reaches non-editable installs: policy/policies.yaml is package data."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_package_link_points_at_the_top_level_file() -> None:
    link = REPO / "policy" / "policies.yaml"
    assert link.is_symlink() and os.readlink(link) == "../policies.yaml"
    every = REPO / "policy" / "vllm-all-releases.yaml"
    assert every.is_symlink() and os.readlink(every) == "../examples/vllm-all-releases.yaml"
    sglang = REPO / "policy" / "sglang.yaml"
    assert sglang.is_symlink() and os.readlink(sglang) == "../examples/sglang.yaml"


def test_wheel_carries_the_policy_as_a_regular_file(tmp_path, interlock_wheel) -> None:
    wheel = interlock_wheel
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read("interlock/policy/policies.yaml") == (REPO / "policies.yaml").read_bytes()
        # @all-releases, the policy of every vLLM release read, ships beside it.
        assert zf.read("interlock/policy/vllm-all-releases.yaml") == (
            REPO / "examples" / "vllm-all-releases.yaml").read_bytes()
        # @sglang, the shipped SGLang policy, too.
        assert zf.read("interlock/policy/sglang.yaml") == (
            REPO / "examples" / "sglang.yaml").read_bytes()
        # Everything installs under the interlock namespace: no bare policy/, kernels/, ...
        assert {name.split("/")[0] for name in zf.namelist()} == {
            "interlock",
            "-".join(wheel.name.split("-")[:2]) + ".dist-info",
        }
        # The native CPU kernels, where a compiler built them, make the wheel platform-specific.
        native = [n for n in zf.namelist() if n.startswith("interlock/kernels/native/_cpu.")]
        built = not wheel.name.endswith("-none-any.whl")
        assert sorted(n.rsplit(".", 1)[-1] for n in native) == (["pyi", "so"] if built else ["pyi"])
        zf.extractall(tmp_path / "site")
    site = str(tmp_path / "site")
    code = (
        "import interlock.policy as policy, interlock.policy.loader as l\n"
        "from interlock.policy import load_policy\n"
        f"assert policy.__file__.startswith({site!r}), policy.__file__\n"
        "assert not l.shipped_policy_path().is_symlink()\n"
        "print(load_policy(use_cache=False).version)\n"
        "print(load_policy(['@all-releases'], use_cache=False).version)\n"
    )
    # -S (no .pth files) and cwd outside the checkout: nothing may shadow the unpacked wheel.
    path = os.pathsep.join([str(tmp_path / "site"), sysconfig.get_paths()["purelib"]])
    env = {**os.environ, "PYTHONPATH": path}
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["vllm-0.33.0..0.34.0", "vllm-0.27.1..0.34.0"]
