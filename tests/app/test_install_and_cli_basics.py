"""Issue 24 item 15: the Makefile takes TORCH_INDEX_URL (the CPU wheel index by default on
Linux without a GPU, where that index answers), ``policy --version``, and a misspelt option
of a subcommand gets its subcommand's usage and a "did you mean"."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import platform
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from interlock import __version__

REPO = Path(__file__).resolve().parents[2]


def dry_install(tmp_path: Path, *assignments: str, path: str | None = None) -> str:
    """The torch install line `make install` would run (``make -n``: nothing is run)."""
    venv = tmp_path / "venv"
    env = {**os.environ, "PATH": path or os.environ["PATH"]}
    env.pop("TORCH_INDEX_URL", None)
    done = subprocess.run(
        ["make", "-n", "-B", f"{venv}/.installed", f"VENV={venv}", *assignments],
        cwd=REPO, capture_output=True, text=True, env=env, check=True,
    )
    (line,) = [x for x in done.stdout.splitlines() if '"torch==' in x and "pip install" in x]
    return line


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


@needs_make
def test_the_index_url_is_passed_to_pip(tmp_path: Path) -> None:
    line = dry_install(tmp_path, "TORCH_SPEC=torch==2.13.0+cu130",
                       "TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130")
    index = "https://download.pytorch.org/whl/cu130"
    assert f'"torch==2.13.0+cu130" --extra-index-url "{index}"' in line


@needs_make
def test_an_empty_index_url_adds_none(tmp_path: Path) -> None:
    assert "--extra-index-url" not in dry_install(tmp_path, "TORCH_INDEX_URL=")


@contextlib.contextmanager
def index_server(root: Path) -> Iterator[str]:
    """A wheel index stand-in on 127.0.0.1: an empty page at /whl/cpu/."""
    (root / "whl" / "cpu").mkdir(parents=True)
    (root / "whl" / "cpu" / "index.html").write_text("<html></html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    finally:
        server.shutdown()
        server.server_close()


@needs_make
@pytest.mark.skipif(platform.system() != "Linux", reason="the default is Linux's")
def test_linux_without_a_gpu_defaults_to_the_cpu_index_where_it_answers(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi") or Path("/dev/kfd").exists():
        pytest.skip("this machine has a GPU")
    with index_server(tmp_path / "index") as index:
        assert f'--extra-index-url "{index}"' in dry_install(tmp_path, f"CPU_TORCH_INDEX={index}")
        fake = tmp_path / "bin"
        fake.mkdir()
        (fake / "nvidia-smi").write_text("#!/bin/sh\n")
        (fake / "nvidia-smi").chmod(0o755)
        with_gpu = dry_install(tmp_path, f"CPU_TORCH_INDEX={index}",
                               path=f"{fake}{os.pathsep}{os.environ['PATH']}")
        assert "--extra-index-url" not in with_gpu
    # The same index, no longer answering: pip is not sent to retry it for every package.
    assert "--extra-index-url" not in dry_install(tmp_path, f"CPU_TORCH_INDEX={index}")


def test_policy_version(cli) -> None:
    res = cli("--version")
    assert res.code == 0 and res.out.strip() == f"policy (interlock) {__version__}"


def test_a_misspelt_option_gets_did_you_mean_and_the_subcommands_usage(cli) -> None:
    res = cli("explain", "X", "--platfrom", "rocm")
    assert res.code == 2
    assert res.err.startswith("usage: policy explain")
    assert "--platfrom: did you mean --platform?" in res.err


def test_a_nested_subcommand_gets_its_own_usage(cli) -> None:
    res = cli("vllm", "args", "--device-arhc", "gfx950", "./M")
    assert res.code == 2 and res.err.startswith("usage: policy vllm args")
    assert "did you mean --device-arch?" in res.err


@needs_make
@pytest.mark.parametrize("lock", ["constraints.txt", ""], ids=["locked", "latest"])
def test_the_project_install_keeps_the_torch_just_installed(tmp_path: Path, lock: str) -> None:
    """accelerate needs torch: without the TORCH_SPEC constraint, an unlocked install let pip
    swap the CPU build for a newer CUDA one."""
    venv = tmp_path / "venv"
    done = subprocess.run(
        ["make", "-n", "-B", f"{venv}/.installed", f"VENV={venv}", f"LOCK={lock}",
         "TORCH_INDEX_URL="],
        cwd=REPO, capture_output=True, text=True, check=True,
    )
    (project,) = [x for x in done.stdout.splitlines() if ' -e ".[' in x]
    assert f"-c {venv}/torch-constraint.txt" in project
    assert project.count("-c ") == (2 if lock else 1)
    assert not lock or f"-c {lock}" in project
    assert f'echo "torch==2.13.0" > {venv}/torch-constraint.txt' in done.stdout
