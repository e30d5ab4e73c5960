"""Exercise (lab 01-memory): count the bytes of the model states one rank holds.

Complete `model_state_bytes`, then run the check cell of the lab. The check trains real models with
torch's optimizers and compares your numbers with the bytes `minimega.run.measure` counts, tensor by tensor.
"""
from __future__ import annotations


def model_state_bytes(param_numels: list[int], optimizer: str) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer states after one fp32 training step.

    Args:
        param_numels: the element count of every parameter tensor of the model, e.g.
            ``[p.numel() for p in model.parameters()]`` (Ψ = their sum).
        optimizer: ``"sgd"`` (torch.optim.SGD, no momentum), ``"adam"`` or ``"adamw"`` (torch's Adam/AdamW).

    Returns:
        ``{"params": ..., "grads": ..., "optimizer_states": ...}`` in bytes. Everything is float32.
        Hint: look at what ``optimizer.state[p]`` holds for one parameter after a step.
    """
    raise NotImplementedError("exercise: complete model_state_bytes in labs/exercises/memory.py")
