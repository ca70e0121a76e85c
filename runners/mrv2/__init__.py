"""mrv2: model runner V2 (request state on the device, input preparation by device kernels).

Torch-free on import; the runner itself lives in ``interlock.runners.mrv2.runner``, its capture plan
in ``interlock.runners.mrv2.graphs``.
"""
