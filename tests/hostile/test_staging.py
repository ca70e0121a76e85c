"""GGUF conversion staging folders, third hostile pass (issue 38: the class of item 6): the
pid a staging folder's name carries is parsed with bounds before anything asks about it."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_builders import write_tiny_gguf

from interlock.core import disk_cache
from interlock.runners.model import sources


@pytest.mark.parametrize("pid", ["99999999999999999999", "0", "\u0661\u0662"])
def test_a_staging_name_with_a_pid_out_of_bounds_is_left_alone(
    tmp_path: Path, pid: str
) -> None:
    model = write_tiny_gguf(tmp_path / "tiny.gguf", "llama", "F32").path
    cache = disk_cache.cache_dir()
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    planted = cache / f".gguf-x-v1.{pid}.abc"
    planted.mkdir()
    sources.converted(model)  # sweeps the staging folders first
    assert planted.exists()
