"""A virtual environment planted on disk with a vLLM dist-info: what `policy vllm` reads a
version from without running anything (its interpreter leaves a mark if it is run)."""

from __future__ import annotations

from pathlib import Path


def planted_venv(root: Path, dist: str | None, version: str = "0.32.0") -> Path:
    """A virtual environment on disk: pyvenv.cfg, a `python3` that leaves a mark when run,
    a `vllm` script naming it, and the dist-info of ``dist`` (none when None)."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    python = bin_dir / "python3"
    python.write_text(f"#!/bin/sh\ntouch {root / 'RAN'}\necho '{{\"version\": \"9.9.9\"}}'\n")
    python.chmod(0o755)
    vllm = bin_dir / "vllm"
    vllm.write_text(f"#!{python}\nimport sys\n")
    vllm.chmod(0o755)
    site = root / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    if dist is not None:
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n\nLong text\n"
        )
    return vllm
