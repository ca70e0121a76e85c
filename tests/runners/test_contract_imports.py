"""The contract, the engine and the runner packages import without torch (plugin specs rely
on it; only executing a model needs torch)."""

from __future__ import annotations

import subprocess
import sys


def test_contract_engine_and_runner_packages_are_torch_free():
    code = (
        "import sys\n"
        "import runners, runners.contract, runners.mrv1, runners.model.config\n"
        "import runners.engine.engine, runners.engine.scheduler, runners.engine.kv_cache\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
