"""A plugin's or an engine's failure is not a policy error: each has a base of its own, says
where as a policy error does, and keeps its documented exit code."""

from __future__ import annotations

import pytest

from interlock.core.errors import EXIT_CODES, LocatedError, PolicyError, error_kind
from interlock.plugins import PluginError
from interlock.vllm.plugin import PluginRefusal
from interlock.vllm.process import EngineFailed
from interlock.vllm.version import DetectionError


@pytest.mark.parametrize(("failure", "code"), [
    (PluginError, 3),  # a plugin that must stop the caller
    (EngineFailed, 4),  # a started engine that did not come up
    (PluginRefusal, 1),  # a decision the engine cannot run, as docs/vllm.md says
    (DetectionError, 1),  # the vLLM install could not be asked, like other input
])
def test_a_failure_says_where_without_being_a_policy_error(
    failure: type[LocatedError], code: int
) -> None:
    error = failure("it broke", file="site.yaml", line=3, details=("the way out",))
    assert not isinstance(error, PolicyError)
    assert str(error) == "site.yaml:3: it broke\nthe way out"
    assert error.location() == {"file": "site.yaml", "line": 3, "col": None, "path": None}
    kind = error_kind(error)
    assert kind is not None and EXIT_CODES[kind] == code
