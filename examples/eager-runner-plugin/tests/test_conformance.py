"""interlock's conformance suite, run by this plugin against itself."""

from __future__ import annotations

import interlock_eager.plugin

from interlock.testing import RunnerPluginConformance


class TestEagerPlugin(RunnerPluginConformance):
    plugin = interlock_eager.plugin
