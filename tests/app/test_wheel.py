"""The wheel installs beside Hugging Face's ``kernels`` package: both import, ours intact.

Before everything moved under ``interlock.``, the wheel put a top-level ``kernels`` package
into site-packages, and installing Hugging Face's overwrote it. Needs PyPI (CI has it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from checkout import python_in

pytestmark = pytest.mark.usefixtures("isolated_env")

#: Hugging Face's package of the same top-level name (a transformers optional dependency).
HF_KERNELS = "kernels==0.17.2"

CHECKS = """
import sys
from pathlib import Path

import kernels
import interlock
from interlock.kernels import REGISTRY

target = Path(sys.argv[1]).resolve()
assert Path(interlock.__file__).resolve().is_relative_to(target), interlock.__file__
assert Path(kernels.__file__).resolve() == target / "kernels" / "__init__.py", kernels.__file__
assert callable(kernels.get_kernel), "Hugging Face's kernels package"
assert {"rms_norm", "paged_attention", "sample"} <= set(REGISTRY.ops()), REGISTRY.ops()
print("ok")
"""


def pip(*args: str, cwd: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True, text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"pip {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


@pytest.mark.slow
def test_the_wheel_installs_beside_hugging_face_kernels(
    tmp_path: Path, interlock_wheel: Path
) -> None:
    target = tmp_path / "target"
    pip("install", "--no-deps", "--target", str(target), str(interlock_wheel), HF_KERNELS,
        cwd=tmp_path)

    top = {p.name for p in target.iterdir() if not p.name.endswith(".dist-info")}
    assert top - {"bin"} == {"interlock", "kernels"}
    done = python_in(target, "-c", CHECKS, str(target), cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
    done = python_in(
        target, "-m", "interlock.cli", "run", "--model", "demo", "--max-tokens", "4",
        "--prompt-token-ids", "1,2,3", cwd=tmp_path,
        env={"INTERLOCK_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[0] prompt [1, 2, 3]\n    -> [" in done.stdout and "(length)" in done.stdout


def _documented_install() -> list[str]:
    """The lines of docs/vllm.md that build interlock's wheel and install it into vLLM's
    venv (issue 52: the page said `pip install --no-deps interlock`, which no index has)."""
    page = (Path(__file__).parents[2] / "docs" / "vllm.md").read_text()
    lines = [line.split("#")[0].strip() for line in page.splitlines()]
    wanted = [line for line in lines
              if line.startswith(("pip wheel ", "$VENV/bin/pip install --no-deps"))]
    assert len(wanted) == 4 and wanted[:2] == wanted[2:], wanted  # the quickstart, the plugin
    return wanted[:2]


@pytest.mark.slow  # builds the wheel (its C kernels) and a venv
def test_the_documented_wheel_installs_the_plugin_into_a_venv(tmp_path: Path) -> None:
    import os
    import shutil

    from checkout import REPO, WHEEL_SOURCES

    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in WHEEL_SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, checkout / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
        else:
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, checkout / name)
    venv = tmp_path / "vllm-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # As the page says: the checkout's .venv active (its pip first on PATH), VENV vLLM's.
    env = {**os.environ, "VENV": str(venv),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for line in _documented_install():
        done = subprocess.run(["bash", "-c", line], cwd=checkout, env=env, capture_output=True,
                              text=True, timeout=600, check=False)
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
    code = ("import importlib.metadata as m; print(sorted(e.value for e in "
            "m.entry_points(group='vllm.general_plugins')))")
    done = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                          text=True, timeout=60, check=True, cwd=tmp_path)
    assert done.stdout.strip() == "['interlock.vllm.plugin:register']"
