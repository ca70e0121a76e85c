"""mrv1: the classic model runner (host-side input preparation, eager execution).

Torch-free on import; the runner itself lives in ``runners.mrv1.runner``.
"""
