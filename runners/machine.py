"""What this machine says about the facts a runner's spec may require on a platform
(``PlatformSupport.requires``), for the judge ``RunnerSpec.unserved`` when a run happens
here rather than for a platform named for another machine."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from interlock.core.platform import TRITON_FACT
from interlock.kernels.triton import unavailable as triton_unavailable

#: Each requirable fact: a function of the platform giving why it does not hold here, or
#: None when it does.
MACHINE_FACTS: Mapping[str, Callable[[str], str | None]] = {TRITON_FACT: triton_unavailable}


def why_missing(requires: Iterable[str], platform: str) -> dict[str, str | None]:
    """For each required fact: why it does not hold on ``platform`` here, or None."""
    return {name: MACHINE_FACTS[name](platform) for name in requires}


def machine_facts(requires: Iterable[str], platform: str) -> dict[str, bool]:
    """The required facts as ``RunnerSpec.unserved`` takes them: whether each holds here."""
    return {name: why is None for name, why in why_missing(requires, platform).items()}
