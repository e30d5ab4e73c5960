"""Saved activations per layer (Korthikanti et al. 2022, Table 2), recomputation's working set, and the experts'."""
from __future__ import annotations

from ..sizes import moe_capacity
from .memory import RECOMPUTE


# --8<-- [start:activations]
ATTENTION = ("unfused", "fused")


def activation_bytes_per_layer(seq_len: int, micro_batch: int, hidden: int, heads: int, *, tp: int = 1,
                               sp: bool = False, recompute: str = "none", attention: str = "unfused",
                               act_bytes: int = 2, mask_bytes: int = 1, kv_heads: int | None = None,
                               ffn: int | None = None, mlp: str = "gelu") -> float:
    """Bytes one transformer layer keeps for its backward, per micro-batch (Korthikanti Table 2).

    With 16-bit activations, 1-byte dropout masks and unfused attention this is the paper's table:

        none                    sbh(34 + 5as/h)
        TP                      sbh(10 + 24/t + 5as/(ht))
        TP + SP                 sbh(34/t + 5as/(ht))
        TP + selective          sbh(10 + 24/t)
        TP + SP + selective     sbh·34/t
        full recompute          2sbh (only the layer input; /t when SP shards it)

    The terms, in elements of `act_bytes` plus masks of `mask_bytes` (paper §4.1):
        kept whole under TP: 2 LayerNorm inputs, QKV input, MLP input (4sbh) + 2 dropout masks (2sbh)
        split by TP:         Q, K, V, projection input (4sbh), MLP up and GeLU outputs (8sbh)
        attention core:      softmax and its dropout (2as²b) + the dropout mask (as²b), split by TP
    Sequence parallelism splits the first group over t too; selective recompute drops the core.

    Other block shapes (`shapes`): under grouped-query attention K and V are k = kv_heads·h/a wide, not h, so
    the split group holds Q and the projection input (2sbh) and K, V (2sbk); the MLP keeps 2sbf for a GELU
    of width f (8sbh at f = 4h) and 4sbf for SwiGLU (the gate's output, its SiLU, the up-projection's output
    and their product, as PyTorch's autograd saves them; a fused SwiGLU kernel saves 3sbf).

    ``attention="fused"`` (FlashAttention, PyTorch SDPA, Megatron-core's default kernel) never stores
    the s² scores: the kernel recomputes them in its backward from Q, K, V and one fp32 log-sum-exp
    per row and head, 4asb bytes (/t). The quadratic term is then gone without any recomputation
    policy, and selective recomputation has only that log-sum-exp left to save.
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute {recompute!r}: expected one of {RECOMPUTE}")
    if attention not in ATTENTION:
        raise ValueError(f"attention {attention!r}: expected one of {ATTENTION}")
    s, b, h, a, t = seq_len, micro_batch, hidden, heads, tp
    sbh = s * b * h
    if recompute == "full":
        return act_bytes * sbh / (t if sp else 1)
    whole = sbh * (4 * act_bytes + 2 * mask_bytes) / (t if sp else 1)
    split = s * b * _split_width(h, a, kv_heads, ffn, mlp) * act_bytes / t
    if recompute == "selective":
        core = 0.0
    elif attention == "fused":
        core = 4 * a * s * b / t
    else:
        core = a * s * s * b * (2 * act_bytes + mask_bytes) / t
    return whole + split + core


def recompute_working_bytes(seq_len: int, micro_batch: int, hidden: int, heads: int, *, tp: int = 1,
                            sp: bool = False, recompute: str = "none", attention: str = "unfused",
                            act_bytes: int = 2, mask_bytes: int = 1, kv_heads: int | None = None,
                            ffn: int | None = None, mlp: str = "gelu") -> float:
    """Bytes recomputation brings back during the backward, one layer and one micro-batch at a time.

    Full: the backward reruns one layer's forward and holds that layer's activations again, as if
    nothing were recomputed: `activation_bytes_per_layer(recompute="none")` (sbh(34 + 5as/h) on one
    GPU; the layer input it counts is shared with the checkpoint, and the gradient arriving from the
    layer above is the same size). Selective: that layer's attention core again (5as²b/t unfused).
    None: nothing. This term is added once, not per layer or per micro-batch in flight.
    """
    kw = dict(tp=tp, sp=sp, attention=attention, act_bytes=act_bytes, mask_bytes=mask_bytes, kv_heads=kv_heads,
              ffn=ffn, mlp=mlp)
    args = (seq_len, micro_batch, hidden, heads)
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute {recompute!r}: expected one of {RECOMPUTE}")
    if recompute == "none":
        return 0.0
    full = activation_bytes_per_layer(*args, recompute="none", **kw)
    if recompute == "full":
        return full
    return full - activation_bytes_per_layer(*args, recompute="selective", **kw)
# --8<-- [end:activations]


def _split_width(h: int, a: int, kv_heads: int | None, ffn: int | None, mlp: str) -> int:
    """Elements per token that tensor parallelism splits: Q, K, V and the projection input (2h + 2k), the MLP's
    2f (GELU) or 4f (SwiGLU). 12h for GPT's block."""
    if mlp not in ("gelu", "swiglu"):
        raise ValueError(f"mlp {mlp!r}: expected 'gelu' or 'swiglu'")
    k, f = kv_heads * (h // a) if kv_heads else h, ffn or 4 * h       # h without GQA, whether or not a divides it
    return 2 * h + 2 * k + (4 if mlp == "swiglu" else 2) * f


# --8<-- [start:gpt_activations]
def gpt_activation_bytes_per_layer(seq_len: int, micro_batch: int, hidden: int, heads: int, *, tp: int = 1,
                                   sp: bool = False, recompute: str = "none", act_bytes: int = 4,
                                   mask_bytes: int | None = None, dropout: bool = False,
                                   attention: str = "math", kv_heads: int | None = None, ffn: int | None = None,
                                   mlp: str = "gelu") -> float:
    """Bytes one block of minimega's GPT (``model.py``) keeps for backward, per tp rank.

    `activation_bytes_per_layer` above is the paper's table; this is the same count adapted to the
    exact tensors our block saves, and the tests measure it (``saved_tensors_hooks``) to within 5%.
    Per element (e = `act_bytes`, m = `mask_bytes`: e for PyTorch's CPU dropout, 1 for its CUDA kernel):

        replicated region   LN inputs 2·sbh·e, their mean and rstd 4·sb·4 B (fp32), and with dropout two residual
                            masks 2·sbh·m: all /t under sequence parallelism.
                            The inputs of qkv and fc, 2·sbh·e, stay whole: the column-parallel matmul keeps the
                            gathered input (Megatron re-gathers instead; we trade that all-gather for memory).
        split over tp       qkv output 3·sbh·e (q, k, v are views of it), proj input sbh·e, fc output 4·sbh·e,
                            GELU output 4·sbh·e: 12·sbh·e / t.
        attention core      "math": softmax as²b·e, with dropout also its mask as²b·m and output as²b·e;
                            "flash" (fused, no dropout): only the log-sum-exp, asb·4 B; all /t (heads split).

    Against the paper (e = 2, m = 1, dropout, "math"): equal to `activation_bytes_per_layer` plus 16sb for the
    LayerNorm statistics it neglects, and under sequence parallelism plus 2sbh·e·(1 − 1/t) more for the kept
    gathered input: sbh(4 + 30/t + 5as/(ht)) rather than sbh(34/t + 5as/(ht)). ``recompute="selective"``
    drops the attention-core term; ``"full"`` keeps only the block input sbh·e (/t with SP), as in the paper.
    With ``kv_heads``, ``ffn`` and ``mlp`` (`activation_bytes_per_layer`'s shapes) the split group is the qkv
    output (h + 2k), the projection input h and the MLP's 2f (GELU) or 4f (SwiGLU): the tests measure a
    GQA + SwiGLU block built in plain PyTorch.
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute {recompute!r}: expected one of {RECOMPUTE}")
    if attention not in ("math", "flash"):
        raise ValueError(f"attention {attention!r}: expected 'math' or 'flash'")
    s, b, h, a, t, e = seq_len, micro_batch, hidden, heads, tp, act_bytes
    m = e if mask_bytes is None else mask_bytes
    rep = t if sp else 1
    if recompute == "full":
        return s * b * h * e / rep
    replicated = (2 * s * b * h * e + 16 * s * b + (2 * s * b * h * m if dropout else 0)) / rep
    replicated += 2 * s * b * h * e
    split = s * b * _split_width(h, a, kv_heads, ffn, mlp) * e / t
    if attention == "flash":
        core = a * s * b * 4 / t
    else:
        core = a * s * s * b * (e + (m + e if dropout else 0)) / t
    return replicated + split + (0 if recompute == "selective" else core)
# --8<-- [end:gpt_activations]


def moe_mlp_activation_bytes(seq_len: int, micro_batch: int, hidden: int, n_experts: int, top_k: int,
                             capacity_factor: float, *, act_bytes: int = 4, dispatch: str = "capacity",
                             expert_hidden: int | None = None, n_shared: int = 0) -> float:
    """Bytes one `moe.MoELayer` keeps for backward, one micro-batch, any ep (measured exactly in the tests).

    With N = s·b tokens, R = b·E·C slots (C = `moe_capacity`), e = `act_bytes`:

        router      its input N·h, the softmax output N·E, the top-k indices 8·N·k (int64); for k > 1 the
                    chosen probabilities and their sum N·(k + 1) (the gates are renormalised)
        aux loss    the per-sequence top-1 fractions b·E
        one-hot     the (token, choice) → slot map N·k·E·C for the combine weights, the dispatch mask and the
                    combine weights N·E·C each: N·E·C·(k + 2), GShard's dense dispatch, quadratic in s
        experts     their input R·h, the fc output and GELU output 2·R·F, their output R·h for the combine
        shared      S shared experts (one MLP of hidden S·F on every token): its fc and GELU outputs 2·N·S·F
                    (its input is the router's)

    F = ``expert_hidden`` (None: 4h), S = ``n_shared`` (DeepSeekMoE's fine-grained and shared experts).

    The slot buffers hold b·E·C rows on every rank whatever ep is: the all-to-all moves rows, it does not
    change how many there are. Against a dense MLP's s·b·h·(1 + 8/t) (input, fc and GELU outputs) this
    is roughly (1 + 10·k·capacity_factor)·sbh plus the one-hot term.

    ``dispatch='dropless'``: `dropless_mlp_activation_bytes` (no slots, no one-hot term).
    """
    if dispatch == "dropless":
        return dropless_mlp_activation_bytes(seq_len, micro_batch, hidden, n_experts, top_k, act_bytes=act_bytes,
                                             expert_hidden=expert_hidden, n_shared=n_shared)
    if dispatch != "capacity":
        raise ValueError(f"dispatch={dispatch!r}: expected 'capacity' or 'dropless'")
    s, b, h, E, k = seq_len, micro_batch, hidden, n_experts, top_k
    N, C, f = s * b, moe_capacity(seq_len, n_experts, top_k, capacity_factor), expert_hidden or 4 * hidden
    R = b * E * C
    routing = N * h + N * E + (N * (k + 1) if k > 1 else 0) + b * E + N * E * C * (k + 2)
    return act_bytes * (routing + R * (2 * h + 2 * f) + 2 * N * n_shared * f) + 8 * N * k


# --8<-- [start:dropless_activations]
def dropless_mlp_activation_bytes(seq_len: int, micro_batch: int, hidden: int, n_experts: int, top_k: int,
                                  *, act_bytes: int = 4, expert_hidden: int | None = None,
                                  n_shared: int = 0) -> float:
    """Bytes one `moe.MoELayer` with ``dispatch='dropless'`` keeps for backward, one micro-batch, ep = 1
    (under ep a rank keeps the rows its experts received: this on average, exactly when the load is even).

    With N = s·b tokens and e = `act_bytes`: the router's terms as in `moe_mlp_activation_bytes`, then the
    N·k sorted rows (the experts' input), their fc and GELU outputs 2·N·k·F (F = ``expert_hidden``, 4h by
    default) and outputs N·k·h, the gates N·k, two int64 index vectors of N·k (the gather and the inverse
    order), the E int32 ends of the experts' row blocks (the grouped matmuls' offsets), and the shared
    experts' 2·N·S·F. Linear in s: no N·E·C.
    """
    s, b, h, E, k = seq_len, micro_batch, hidden, n_experts, top_k
    N, f = s * b, expert_hidden or 4 * hidden
    routing = N * h + N * E + (N * (k + 1) if k > 1 else 0) + b * E
    return act_bytes * (routing + N * k * (2 * h + 2 * f) + N * k + 2 * N * n_shared * f) + 8 * 3 * N * k + 4 * E
# --8<-- [end:dropless_activations]


def moe_activation_delta(seq_len: int, micro_batch: int, hidden: int, n_experts: int, top_k: int,
                         capacity_factor: float, *, tp: int = 1, act_bytes: int = 4,
                         dispatch: str = "capacity", expert_hidden: int | None = None, n_shared: int = 0) -> float:
    """What a block's activations gain when its MLP becomes minimega's MoE layer: `moe_mlp_activation_bytes`
    (the layer runs whole on every tp rank) less the dense MLP's input (kept whole) and fc and GELU outputs
    (split over tp). The dense MLP's dropout mask stays: the MoE output is dropped out the same way."""
    sbh = seq_len * micro_batch * hidden
    dense = act_bytes * sbh * (1 + 8 / tp)
    return moe_mlp_activation_bytes(seq_len, micro_batch, hidden, n_experts, top_k, capacity_factor,
                                    act_bytes=act_bytes, dispatch=dispatch, expert_hidden=expert_hidden,
                                    n_shared=n_shared) - dense
