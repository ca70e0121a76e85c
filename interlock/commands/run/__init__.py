"""``policy run``: decide how to run a model, run it through the chosen runner plugin, show it.

The decision is resolved for the model's architecture (traits from its
config; ``demo`` is the built-in model) by ``interlock.app.query.decide_query``, the path
``interlock.llm.LLM`` takes too; one line on stderr names the runner, cudagraph
mode and breakable with the policy line that chose each, and the runner is
instantiated through the plugin that registers it. torch is imported only
inside ``run`` (and where the platform is detected).

One concern per module: ``flags`` (the command line), ``orchestrate`` (the run),
``capture`` (the capture sizes a run can use), ``stream`` (text replies as they are
generated) and ``render`` (the JSON document and the text output).
"""

from interlock.commands.run.flags import add_parser
from interlock.commands.run.orchestrate import run

__all__ = ["add_parser", "run"]
