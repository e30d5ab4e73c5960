"""Exercise (lab 05-offload): where a rank's model-state bytes live, with and without optimizer offload.

minimega's ZeRO keeps on each rank (Ψ = the padded parameter count, n = dp):

    parameters           in the precision's dtype (fp32: 4 bytes, bf16/fp16: 2); whole, or Ψ/n at stage 3
    gradients            fp32 (4 bytes) under fp32 and bf16 (bf16 sums and reduces its gradients in an fp32
                         buffer, Megatron's main_grad), fp16: 2; whole at stage 1, Ψ/n at stages 2 and 3
    fp32 master shard    Ψ/n × 4 bytes: a separate copy for bf16/fp16; for fp32 the parameter shard *is* the
                         master (no extra bytes) — unless it is offloaded, which always makes a host copy
    Adam's moments       Ψ/n × 8 bytes (exp_avg, exp_avg_sq), fp32

``offload_optimizer=True`` (ZeRO-Offload) moves the master shard and the moments to the CPU and runs the step there.
Each unit's reduced gradient shard goes to the CPU too, as soon as it is reduced, and is summed there in fp32
(Ψ/n × 4 bytes, whatever the precision); from stage 2 on no gradient stays on the device. Stage 1 does not shard
gradients: its whole gradient buffer, which the backward accumulates into, stays on the device. The parameters stay
on the device. Adam's 4-byte step counters are left out here.

Complete ``bytes_by_location``; the lab's check measures real 2-rank jobs in every combination and compares.
"""
from __future__ import annotations


def bytes_by_location(n_params: int, dp: int, stage: int, precision: str, offload: bool) -> dict:
    """Model-state bytes one rank holds on the device and on the CPU.

    Args:
        n_params: Ψ, the parameter count after padding (a multiple of dp).
        dp: data-parallel ranks n.
        stage: ZeRO stage, 1, 2 or 3.
        precision: 'fp32', 'bf16' or 'fp16'.
        offload: ``TrainConfig.offload_optimizer``.

    Returns:
        ``{"device": bytes, "cpu": bytes}``.
    """
    raise NotImplementedError("exercise: complete bytes_by_location in labs/exercises/offload.py")
