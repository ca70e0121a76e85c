"""Model execution: configs, checkpoints, and the Llama-family and MoE model code.

``interlock.runners.model.config`` is torch-free; the other modules import torch.
"""
