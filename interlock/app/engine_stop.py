"""How an engine plugin (vLLM's, SGLang's) stops the engine it runs in: the engines log and
swallow a plugin's exceptions, so a plugin that cannot govern exits the process itself."""

from __future__ import annotations

import logging
import sys
from typing import NoReturn

from interlock.core.errors import EXIT_CODES, error_kind


def stop_engine(exc: BaseException, plugin: str, logger: logging.Logger) -> NoReturn:
    """Log the one line, write it to stderr, and exit with interlock's documented code: 5
    for a rule's refusal, 1 for a policy error, a decision log it cannot write or a decision
    the engine cannot run (interlock's errors for the user, named by their message alone), 3
    for any other failure of the plugin. ``plugin``: the engine's name, ``vLLM`` or
    ``SGLang``."""
    if isinstance(exc, SystemExit):
        raise exc
    text = str(exc) if error_kind(exc) else f"{type(exc).__name__}: {exc}"
    message = f"interlock: the {plugin} plugin stops the engine: {text}"
    logger.error("%s", message)
    print(message, file=sys.stderr, flush=True)
    raise SystemExit(EXIT_CODES[error_kind(exc) or "plugin"])
