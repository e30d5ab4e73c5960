"""Ulysses attention: context parallelism by all-to-all over heads (DeepSpeed-Ulysses, arXiv:2309.14509).

The layout is ring attention's (`parallel.context`): cp rank r holds chunks r and 2·cp-1-r of the 2·cp
chunks of every sequence, and everything but attention runs on those T/cp tokens. Attention needs every
earlier key but no other head, so Ulysses trades the sequence split for a head split around it:

    Phase 1 (forward): three all-to-alls over cp, of q, k and v: (B, nh, T/cp, hs) → (B, nh/cp, T, hs).
        Head group j (nh/cp heads) goes to cp rank j; each rank receives every rank's two chunks of its
        heads, and puts them back in sequence order (chunks 0, 1, …, 2·cp-1), so the causal mask is exact.
    Phase 2: ordinary causal attention (`scaled_dot_product_attention`, a fused kernel) over all T tokens.
    Phase 3: one all-to-all of the output, (B, nh/cp, T, hs) → (B, nh, T/cp, hs), chunks back in rank order.
    Backward: the same four exchanges of the gradients (an all-to-all is its own transpose).

Bytes one rank sends per layer and step (`estimate.cp_ulysses_bytes`): eight all-to-alls of a (B, nh/tp,
T/cp, hs) buffer, each sending (cp-1)/cp of it: 8 · (cp-1)/cp · B · (T/cp) · (D/tp) elements (12 with
recomputation, which runs the forward's four again). Ring attention sends (6·cp - 4) · B · (T/cp) · (D/tp):
Ulysses' volume per rank falls as 1/cp, the ring's stays ~6·B·T·D/tp; but every all-to-all is on the
critical path (nothing computes while it runs), and cp can grow only to nh/tp.

Memory: one (B, T/cp, D/tp) tensor per layer more than ring attention: the kernel keeps its output in the
head-split layout for its backward, and the output projection keeps its input in the sequence-split one.

Composes with tp (each tp rank's nh/tp heads split over cp: n_head divisible by tp·cp) and dp/ZeRO over dp·cp,
like ring attention; refused by name (`check`): n_head not divisible by tp·cp, and what ring attention refuses.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..comm import Group
from ..comm.autograd import exchange


# --8<-- [start:exchange]
def seq_to_heads(x: torch.Tensor, group: Group, tag: str) -> torch.Tensor:
    """(B, nh, T/cp, hs) this rank's chunks (r, 2cp-1-r) of all nh heads → (B, nh/cp, T, hs) the whole
    sequence, in order, of head group r."""
    cp = group.size
    B, nh, Tl, hs = x.shape
    # Head group j (nh/cp heads) goes to rank j; what comes back from rank j is rank j's tokens of my group.
    x = x.reshape(B, cp, nh // cp, Tl, hs).transpose(0, 1)                        # (cp, B, nh/cp, T/cp, hs)
    x = exchange(x, group, tag)                                                   # (cp, B, nh/cp, T/cp, hs)
    x = x.unflatten(3, (2, Tl // 2))                                              # (cp, B, nh/cp, 2, c, hs)
    # Rank j sent chunks j and 2cp-1-j: the early chunks come in rank order, the late ones in reverse.
    early, late = x[:, :, :, 0].movedim(0, 2), x[:, :, :, 1].flip(0).movedim(0, 2)  # 2 × (B, nh/cp, cp, c, hs)
    return torch.cat([early, late], dim=2).flatten(2, 3)                          # (B, nh/cp, T, hs)


def heads_to_seq(y: torch.Tensor, group: Group, tag: str) -> torch.Tensor:
    """The inverse of `seq_to_heads`: (B, nh/cp, T, hs) → (B, nh, T/cp, hs), laid out (B, T/cp, nh, hs) in
    memory so the caller's transpose(1, 2).reshape to (B, T/cp, D) is a view."""
    cp = group.size
    B, h, T, hs = y.shape
    y = y.unflatten(2, (2 * cp, T // (2 * cp)))                                   # (B, nh/cp, 2cp, c, hs)
    early, late = y[:, :, :cp].movedim(2, 0), y[:, :, cp:].flip(2).movedim(2, 0)  # 2 × (cp, B, nh/cp, c, hs)
    # Rank j's two chunks go back to rank j; what comes back from rank j is head group j of my tokens.
    y = torch.stack([early, late], dim=3)                                         # (cp, B, nh/cp, 2, c, hs)
    y = exchange(y, group, tag).flatten(3, 4)                                     # (cp, B, nh/cp, T/cp, hs)
    y = y.permute(1, 3, 0, 2, 4).reshape(B, T // cp, cp * h, hs)                  # (B, T/cp, nh, hs)
    return y.transpose(1, 2)                                                      # (B, nh, T/cp, hs)
# --8<-- [end:exchange]


# --8<-- [start:ulysses_attention]
def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Group) -> torch.Tensor:
    """Causal attention of this rank's chunks over the whole sequence, heads split over ``group`` for it.

    Shapes: q, k, v (B, nh, T/cp, hs), this rank's chunks (r, 2cp-1-r) → (B, nh, T/cp, hs).
    Communication: four all-to-alls forward (q, k, v, output), four backward.
    """
    if group.size == 1:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if q.shape[1] % group.size:
        raise ValueError(f"Ulysses attention: {q.shape[1]} local heads do not split over cp={group.size}")
    q, k, v = (seq_to_heads(t, group, tag) for t, tag in ((q, "cp_q"), (k, "cp_k"), (v, "cp_v")))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)               # (B, nh/cp, T, hs)
    return heads_to_seq(y, group, "cp_out")
# --8<-- [end:ulysses_attention]


def check(model_config, config, dims) -> None:
    """What Ulysses needs beyond ring attention's rules (`parallel.context.check`)."""
    if dims.cp == 1 or config.cp_attention != "ulysses":
        return
    if model_config.n_head % (dims.tp * dims.cp):
        raise ValueError(f"cp_attention='ulysses' with cp={dims.cp}, tp={dims.tp}: n_head={model_config.n_head} is "
                         f"not divisible by tp*cp = {dims.tp * dims.cp} (each rank attends with n_head/(tp*cp) "
                         f"heads); use cp_attention='ring' or a cp that divides n_head/tp")
