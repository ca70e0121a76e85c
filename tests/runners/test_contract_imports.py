"""The contract, the engine and the runner packages import without torch (plugin specs rely
on it; only executing a model needs torch)."""

from __future__ import annotations

import subprocess
import sys


def test_contract_engine_and_runner_packages_are_torch_free():
    code = (
        "import sys\n"
        "import interlock.runners, interlock.runners.contract, interlock.runners.mrv1\n"
        "import interlock.runners.model.config, interlock.runners.model.config_json\n"
        "import interlock.runners.batching.step_loop\n"
        "import interlock.runners.batching.scheduler, interlock.runners.batching.kv_cache\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
