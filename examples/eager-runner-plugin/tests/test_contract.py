"""interlock's contract suite, run by this plugin against itself."""

from __future__ import annotations

import interlock_eager.plugin

from interlock.testing import RunnerPluginContract


class TestEagerPlugin(RunnerPluginContract):
    plugin = interlock_eager.plugin
