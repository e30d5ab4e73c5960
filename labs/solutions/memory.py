"""Reference solution to ``labs/exercises/memory.py``."""
from __future__ import annotations

FP32 = 4   # bytes per element


def model_state_bytes(param_numels: list[int], optimizer: str) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer states after one fp32 training step."""
    psi = sum(param_numels)
    if optimizer == "sgd":
        states = 0                    # plain SGD (no momentum) keeps nothing between steps
    elif optimizer in ("adam", "adamw"):
        # exp_avg and exp_avg_sq: one fp32 value each per element; `step`: one fp32 scalar per tensor.
        states = 2 * FP32 * psi + FP32 * len(param_numels)
    else:
        raise ValueError(f"optimizer={optimizer!r}; choose 'sgd', 'adam' or 'adamw'")
    return {"params": FP32 * psi, "grads": FP32 * psi, "optimizer_states": states}
