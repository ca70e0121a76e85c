"""The registry questions `policy check` asks: which graph modes are served where."""

from __future__ import annotations

from plugin_builders import EAGER_ONLY, EVERY_MODE, registry_of, spec

from interlock.plugins.checks import unserved_cudagraph

REGISTRY = registry_of(
    spec("eager", {"cpu": EAGER_ONLY, "cuda": EAGER_ONLY}),
    spec("graphs", {"cuda": EVERY_MODE}),
)


def test_served_somewhere_by_some_runner_is_fine() -> None:
    assert unserved_cudagraph(REGISTRY, "full", ["cuda"]) == []
    assert unserved_cudagraph(REGISTRY, "none", ["cpu", "cuda"]) == []


def test_no_runner_serves_the_mode_on_a_platform() -> None:
    assert unserved_cudagraph(REGISTRY, "full", ["cpu", "cuda"]) == [
        "no registered runner serves cudagraph=full on cpu (eager serves none): "
        "stage 5 downgrades it there"
    ]


def test_the_rules_own_runner_is_what_counts() -> None:
    assert unserved_cudagraph(REGISTRY, "piecewise", ["cuda"], runner="eager") == [
        "runner eager does not serve cudagraph=piecewise on cuda (eager serves none): "
        "stage 5 downgrades it there"
    ]
    assert unserved_cudagraph(REGISTRY, "piecewise", ["cuda"], runner="graphs") == []


def test_platform_nobody_serves() -> None:
    assert unserved_cudagraph(REGISTRY, "none", ["tpu"]) == [
        "no registered runner serves platform tpu, so cudagraph=none cannot be served there"
    ]


def test_unregistered_runner_is_left_to_the_unknown_runner_check() -> None:
    assert unserved_cudagraph(REGISTRY, "full", ["cpu"], runner="ghost") == []
