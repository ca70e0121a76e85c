"""Model execution: configs, checkpoints, and the Llama-family and MoE model code.

``interlock.runners.model.config`` and ``.config_json`` are torch-free; the other modules
import torch.
"""
