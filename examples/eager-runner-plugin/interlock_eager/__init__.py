"""interlock-eager-runner: the runner ``eager`` (every step eager, no graph capture, no compile).

``interlock_eager.plugin`` is what interlock imports to learn about it (cheap,
no torch); ``interlock_eager.runner`` is the runner object, loaded only when a
run starts.
"""
