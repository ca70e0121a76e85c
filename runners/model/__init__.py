"""Model execution: configs, checkpoints, and the Llama-family and MoE model code.

``runners.model.config`` is torch-free; the other modules import torch.
"""
