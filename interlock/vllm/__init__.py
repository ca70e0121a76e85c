"""Everything interlock knows about vLLM, in one wing.

- :mod:`~interlock.vllm.version`: which release is installed and the knob table: each of
  vLLM's environment knobs, the decision field it carries and the texts vLLM reads;
- :mod:`~interlock.vllm.flags`: what a ``vllm serve`` command line says to the policy;
- :mod:`~interlock.vllm.model`: the model argument as vLLM takes it;
- :mod:`~interlock.vllm.command`: the ``vllm serve`` command line of a decision;
- :mod:`~interlock.vllm.startup_log`: a running engine's log lines, checked against the decision;
- :mod:`~interlock.vllm.supervise`: ``policy vllm serve``, the engine run with that check;
- :mod:`~interlock.vllm.process`: an engine run as a child process, as a measurement starts it;
- :mod:`~interlock.vllm.verify`: the same check after the fact, on a saved log;
- :mod:`~interlock.vllm.plugin`: interlock inside vLLM (entry points ``vllm.general_plugins``
  and ``vllm.stat_logger_plugins``).

vLLM loads the plugin in every process it starts, so this face imports nothing.
"""
