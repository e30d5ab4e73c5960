"""Bytes on the wire: the ring model for data parallelism, tensor parallelism, context parallelism and experts.

Algorithmic bytes (what each rank sends under the ring model, nccl-tests' yardstick); `minimega.comm`'s
`CommLog` records the same quantity for every real collective, so the tests compare the two exactly.
"""
from __future__ import annotations

from ..sizes import moe_alltoall_bytes  # noqa: F401  (the experts' all-to-alls: the rule parallel/moe/layer.py uses)
from .memory import CP_ATTENTION, _check_stage_dp


# --8<-- [start:comm_bytes]
def ring_bytes(op: str, size_bytes: float, n: int) -> float:
    """Bytes each rank sends for one collective over `n` ranks on a ring (nccl-tests' model).

    all-reduce: 2(n-1)/n · S (a reduce-scatter then an all-gather); reduce-scatter and all-gather of
    a full buffer of S bytes: (n-1)/n · S each.
    """
    if n <= 1:
        return 0.0
    factor = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0}[op]
    return factor * (n - 1) / n * size_bytes


# --8<-- [start:ring_time]
# --8<-- [start:ring_time_c1]
def ring_time(op: str, size_bytes: float, n: int, alpha: float, bandwidth: float) -> float:
# --8<-- [end:ring_time_c1]
    """Seconds for one ring collective in the α-β model (Thakur, Rabenseifner and Gropp 2005).

    Each of the ring's steps pays a start-up latency α and moves one chunk at `bandwidth` bytes/s:
    all-reduce takes 2(n-1) steps, reduce-scatter and all-gather n-1 each, so
    t = steps·α + `ring_bytes`/bandwidth. The α term grows with n and not with the message, which is
    why many small messages (one per tensor) cost more than a few large buckets.
    """
    # --8<-- [start:ring_time_c2]
    if n <= 1:
        return 0.0
    steps = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}[op] * (n - 1)
    return steps * alpha + ring_bytes(op, size_bytes, n) / bandwidth
    # --8<-- [end:ring_time_c2]
# --8<-- [end:ring_time]


def comm_collectives(stage: int) -> tuple[str, ...]:
    """The collectives one step issues over a full-model-sized buffer (ZeRO paper §7).

    DDP: all-reduce the gradients. ZeRO-1/2: reduce-scatter the gradients, all-gather the updated
    parameters. ZeRO-3: all-gather the parameters in the forward and again in the backward, then
    reduce-scatter the gradients.
    """
    _check_stage_dp(stage, 1)
    return {0: ("all_reduce",), 1: ("reduce_scatter", "all_gather"),
            2: ("reduce_scatter", "all_gather"), 3: ("all_gather", "all_gather", "reduce_scatter")}[stage]


def comm_bytes_per_step(n_params: float, dp: int, stage: int, bytes_per_elem: int = 2, *,
                        grad_bytes: int | None = None) -> float:
    """Bytes each dp rank sends per optimizer step, ring model.

    Stages 0-2 move 2Ψ elements' worth (2(N_d-1)/N_d · Ψ exactly); stage 3 moves 3Ψ, 1.5× DDP.
    ``grad_bytes``: the width gradients are reduced in when it is not the parameters' (4 for a 16-bit model
    that reduces fp32 main grads, as minimega's bf16 does): the all-reduce (DDP) and the reduce-scatters carry
    it, the all-gathers carry parameters. ``n_params``: padded, for a ZeRO that pads its flat buffers.
    """
    _check_stage_dp(stage, dp)
    widths = {"all_gather": bytes_per_elem}
    g = bytes_per_elem if grad_bytes is None else grad_bytes
    return sum(ring_bytes(op, n_params * widths.get(op, g), dp) for op in comm_collectives(stage))
# --8<-- [end:comm_bytes]


def comm_volume_psi(stage: int) -> int:
    """The paper's per-step volume in units of Ψ elements (the large-N_d limit): 2, 2, 2, 3."""
    return sum(2 if op == "all_reduce" else 1 for op in comm_collectives(stage))


# --8<-- [start:tp_comm]
# --8<-- [start:tp_comm_c1]
def tp_comm_elements_per_layer(seq_len: int, micro_batch: int, hidden: int, tp: int) -> float:
# --8<-- [end:tp_comm_c1]
    """Elements each TP rank sends per layer per micro-batch, forward + backward (Narayanan §3.2).

    Two all-reduces forward and two backward, each on a (b, s, h) tensor, ring model: 8bsh(t-1)/t.
    Sequence parallelism swaps each all-reduce for an all-gather + reduce-scatter: the same volume.
    """
    # --8<-- [start:tp_comm_c2]
    return 8 * micro_batch * seq_len * hidden * (tp - 1) / tp
    # --8<-- [end:tp_comm_c2]
# --8<-- [end:tp_comm]


# --8<-- [start:cp_estimate]
def cp_ring_bytes(n_layer: int, rows: int, seq_len: int, d_model: int, cp: int, tp: int = 1,
                  bytes_per_elem: int = 4, recompute: bool = False) -> float:
    """Bytes one rank sends in a training step's ring attention (`minimega.parallel.context`): per layer,
    forward cp-1 K/V blocks, backward cp-1 K/V blocks and cp dK/dV blocks, each block 2 · rows · (T/cp) ·
    (D/tp) elements: (6·cp - 4) · rows · (T/cp) · (D/tp) per layer; ``recompute`` (activation checkpointing
    of every block or of every attention core) runs the forward's ring once more: (8·cp - 6). cp = 1: 0."""
    if cp == 1:
        return 0.0
    blocks = (3 * cp - 2) + (cp - 1 if recompute else 0)                      # K/V-sized blocks sent per layer
    return n_layer * 2 * blocks * rows * (seq_len / cp) * (d_model / tp) * bytes_per_elem


def cp_ulysses_bytes(n_layer: int, rows: int, seq_len: int, d_model: int, cp: int, tp: int = 1,
                     bytes_per_elem: int = 4, recompute: bool = False) -> float:
    """Bytes one rank sends in a training step's Ulysses attention (`minimega.parallel.ulysses`): per layer four
    all-to-alls forward (q, k, v, output) and four backward, each over a rows · (T/cp) · (D/tp) buffer of
    which (cp-1)/cp leaves the rank: 8 · (cp-1)/cp · rows · (T/cp) · (D/tp) per layer; ``recompute`` runs
    the forward's four again (12). cp = 1: 0."""
    if cp == 1:
        return 0.0
    exchanges = 8 + (4 if recompute else 0)                                   # all-to-alls per layer
    return n_layer * exchanges * (cp - 1) / cp * rows * (seq_len / cp) * (d_model / tp) * bytes_per_elem


def cp_bytes(attention: str, *args, **kwargs) -> float:
    """`cp_ring_bytes` or `cp_ulysses_bytes` by ``attention`` ('ring' or 'ulysses', `TrainConfig.cp_attention`)."""
    if attention not in CP_ATTENTION:
        raise ValueError(f"cp attention {attention!r}: expected one of {CP_ATTENTION}")
    return (cp_ring_bytes if attention == "ring" else cp_ulysses_bytes)(*args, **kwargs)
# --8<-- [end:cp_estimate]
