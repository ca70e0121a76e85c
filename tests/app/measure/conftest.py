"""Bench tests: the delay plugin registered for each module (the model they time is the
session's ``shared_tiny_model``, run with dummy weights: speed does not depend on them)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from delay_plugin import DelayPlugin

from interlock import plugins
from interlock.plugins.manager import add_plugin, remove_plugin


@pytest.fixture(scope="module", autouse=True)
def delay_runners(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The runners fast, slow and rigid registered for the module; a private cache; one
    torch thread (the tiny model gains nothing from two, and on a busy machine they wait
    for each other). Module-scoped so that a module can measure once and check often."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        patch.delenv("INTERLOCK_POLICY", raising=False)
        plugins.reset()
        add_plugin(DelayPlugin(), "delay", distribution="tests", version="0")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(threads)
        remove_plugin("delay")
        plugins.reset()
