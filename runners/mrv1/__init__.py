"""mrv1: the classic model runner (host-side input preparation into static buffers).

Torch-free on import; the runner itself lives in ``interlock.runners.mrv1.runner``, its capture plan
in ``interlock.runners.mrv1.graphs``.
"""
