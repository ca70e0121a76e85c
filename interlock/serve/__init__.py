"""``policy serve``: an OpenAI-compatible HTTP server over interlock's runners.

``step_thread`` steps the continuous-batching step loop on a thread of its own; ``app``
answers HTTP (Starlette on uvicorn) from it; ``protocol`` checks the OpenAI request bodies
and shapes the answers; ``metrics`` is ``/metrics``. Needs the ``serve`` extra.
"""

# The defaults here, not in ``protocol`` or ``app``, so that the command line reads them
# without the serve extra.

#: vLLM's default bound on ``logprobs`` / ``top_logprobs`` (its ``--max-logprobs``).
MAX_LOGPROBS = 20
#: Connections open at once, by default: a flood of half-open ones past it costs an accept
#: and a close each, so it is set above what a busy server holds.
MAX_CONNECTIONS = 2048
