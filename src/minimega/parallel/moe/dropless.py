"""Dropless dispatch: every (token, choice) is kept; tokens are sorted by expert instead of placed in slots.

The capacity path (`minimega.parallel.moe.layer`) builds one-hot (B, T, E, C) dispatch and combine tensors, C ∝ T, so
they grow with s². Production MoE (MegaBlocks, Gale et al. 2022, arXiv:2211.15841; Megatron-core and
DeepSeek's token dispatchers) works with indices instead:

    Phase 1 (sort): the N·k (token, choice) pairs, flattened token-major, are argsorted by expert id
        (stable: token order within an expert); ``counts[e]`` pairs go to expert e.
    Phase 2 (gather): row i of the sorted buffer is the input of pair ``order[i]``'s token, (N·k, D).
    Phase 3 (experts): expert e runs on its contiguous slice of ``counts[e]`` rows; nothing is padded or cut.
        All local experts run as one grouped matmul per weight (`moe.Experts.grouped`, `F.grouped_mm`, the
        kernel torchtitan's MoE calls): one launch for every expert, whatever their row counts.
    Phase 4 (scatter): the outputs go back to (token, choice) order (the inverse permutation) and each
        token sums its k outputs times their gates.

Under expert parallelism the sorted rows of rank i for the experts of rank j are one contiguous block, so
the dispatch is an all-to-all with variable splits. The counts go first (an all-to-all of E integers per
rank), so every rank knows how many rows it will receive from each; the received rows (ordered by source,
then expert) are regrouped by local expert, run, put back in arrival order and sent home by the reverse
all-to-all. Its backward is the same exchange with the splits swapped.

Saved for backward per layer (the estimator's `dropless_mlp_activation_bytes`): the gathered rows N·k·D,
the experts' fc and GELU outputs 2·N·k·4D, their outputs N·k·D and the gates N·k, the int64 gather and
inverse-order indices 2·N·k: no term in N·E·C.
"""
from __future__ import annotations

import torch

from ... import comm
from ...comm import Group


# --8<-- [start:sort_by_expert]
# --8<-- [start:sort_by_expert_c1]
def sort_by_expert(top_i: torch.Tensor, n_experts: int):
# --8<-- [end:sort_by_expert_c1]
    """(…, k) expert ids → order (N·k,): the flat (token, choice) ids sorted by expert, token order kept within
    an expert; counts (E,): how many pairs each expert gets (every one of them: nothing is dropped)."""
    # --8<-- [start:sort_by_expert_c2]
    flat = top_i.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return order, torch.bincount(flat, minlength=n_experts)


def dropless_combine(x: torch.Tensor, top_i: torch.Tensor, gates: torch.Tensor, n_experts: int, run):
    # --8<-- [end:sort_by_expert_c2]
    """y[t] = Σ_j gates[t, j] · expert_{top_i[t, j]}(x[t]) for the (N, D) tokens ``x``, with top_i and gates
    (N, k); ``run(rows, counts)`` applies each expert to its contiguous slice of the sorted rows."""
    # --8<-- [start:sort_by_expert_c3]
    N, k = top_i.shape
    order, counts = sort_by_expert(top_i, n_experts)
    rows = x.index_select(0, order // k)                         # (N·k, D): row i is pair order[i]'s token
    out = run(rows, counts)                                      # (N·k, D), still sorted by expert
    back = out.index_select(0, torch.argsort(order))             # (N·k, D): pair p's output in row p
    return (back.view(N, k, -1) * gates.unsqueeze(-1)).sum(1)    # (N, D): the gate-weighted sum per token
    # --8<-- [end:sort_by_expert_c3]
# --8<-- [end:sort_by_expert]


class _AllToAllV(torch.autograd.Function):
    """All-to-all with variable splits: ``send[j]`` rows to rank j, ``recv[j]`` rows from it. Backward: the
    same exchange of the gradient with the splits swapped."""

    @staticmethod
    def forward(ctx, x, group, send, recv, tag):
        ctx.group, ctx.send, ctx.recv, ctx.tag = group, send, recv, tag
        out = x.new_empty((sum(recv), *x.shape[1:]))
        return comm.all_to_all(out, x.contiguous(), group, tag=tag, send_rows=send, recv_rows=recv)

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        got = comm.all_to_all(out, grad.contiguous(), ctx.group, tag=ctx.tag + "_grad",
                              send_rows=ctx.recv, recv_rows=ctx.send)
        return got, None, None, None, None


# --8<-- [start:dropless_ep]
def run_expert_parallel(experts, rows: torch.Tensor, counts: torch.Tensor, group: Group) -> torch.Tensor:
    """The sorted rows of this rank (counts over all E experts) → their experts' outputs, same order; the
    experts live E/ep per rank over ``group``. Counts first, then the rows, both by all-to-all."""
    ep = group.size
    local = counts.numel() // ep
    got_counts = torch.empty_like(counts)
    comm.all_to_all(got_counts, counts.contiguous(), group, tag="moe_counts")   # (ep·local,): [src, expert]
    send = counts.view(ep, local).sum(1).tolist()
    recv = got_counts.view(ep, local).sum(1).tolist()
    got = _AllToAllV.apply(rows, group, send, recv, "moe_dispatch")             # by source, then expert
    expert = torch.arange(local, device=rows.device).repeat(ep).repeat_interleave(got_counts)
    perm = torch.argsort(expert, stable=True)                                   # regroup by local expert
    out = experts.grouped(got.index_select(0, perm), got_counts.view(ep, local).sum(0))
    back = out.index_select(0, torch.argsort(perm))                             # arrival order again
    return _AllToAllV.apply(back, group, recv, send, "moe_combine")
# --8<-- [end:dropless_ep]
