"""A plugin failure is summarised with the line that raised it: the plugin's own, which for a
built-in plugin or runner is inside interlock's runners; never the host's machinery."""

from __future__ import annotations

import re

from interlock.plugins.discovery import summarize
from interlock.runners.model.checkpoint import resolve_dtype
from interlock.runners.model.demo import demo_config


def caught(fn) -> BaseException:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the point is to summarise whatever it is
        return exc
    raise AssertionError("did not raise")


def test_a_failure_inside_interlocks_runner_code_cites_that_line() -> None:
    exc = caught(lambda: resolve_dtype("float8", demo_config()))
    line = summarize(exc)
    assert re.search(r"\(at .*runners/model/checkpoint\.py:\d+\)$", line), line


def test_a_failure_inside_the_host_machinery_cites_the_callers_line() -> None:
    from interlock.core.decision import Decision

    exc = caught(lambda: Decision(cudagraph="sometimes"))
    line = summarize(exc)
    assert re.search(r"\(at .*test_summarize\.py:\d+\)$", line), line
