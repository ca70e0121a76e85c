"""``policy serve``: an OpenAI-compatible HTTP server over interlock's runners.

``engine_loop`` steps one continuous-batching engine on a thread of its own; ``app``
answers HTTP (Starlette on uvicorn) from it; ``protocol`` checks the OpenAI request bodies
and shapes the answers; ``metrics`` is ``/metrics``. Needs the ``serve`` extra.
"""
