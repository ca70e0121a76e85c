"""Tensor parallelism on torch.distributed: one model split across processes, GPUs and
machines (``executor`` on rank 0, ``worker`` on the others, ``group`` for the model's
collectives)."""
