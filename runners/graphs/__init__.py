"""Graph capture shared by the built-in runners.

``modes`` (what each cudagraph mode does with a batch, with and without
breakable capture), ``sizes`` and ``plan`` (capture sizes, graph keys and the
plan interface each runner implements its own way) and ``report`` are
torch-free. ``buffers`` (static inputs), ``segments``, ``backends`` (``cuda``
and ``debug``), ``capture``, ``manager`` and ``runner`` (the base class of
mrv1 and mrv2) import torch.
"""
