"""``policy measure MODEL``: measure a model under several decisions, side by side.

``--vary FIELD=V1,V2`` (repeatable) builds the full factorial over decision
fields; the other fields are the policy's decision for this machine. Each
configuration is loaded once; trials run interleaved in blocks; the analysis
(medians with bootstrap intervals, 2^k effects, the fastest configuration) is
printed as a table, and the whole record is written to ``--record FILE`` (else
under the cache directory). torch is imported only inside ``run``.

One concern per module: ``flags`` (the command line), ``orchestrate`` (the run, here or on
a server), ``engines`` (what a run on a serving engine's server takes) and ``output`` (the
record file and the progress bar).
"""

from interlock.commands.measure.flags import add_parser
from interlock.commands.measure.orchestrate import run

__all__ = ["add_parser", "run"]
