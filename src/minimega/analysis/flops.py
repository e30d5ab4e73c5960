"""Parameters, FLOPs, MFU, and the time, GPU-hours and money of a training run (PaLM App. B, Narayanan et al.)."""
from __future__ import annotations

from .memory import model_state_bytes


def gpt_params(n_layer: int, d_model: int, vocab: int, seq_len: int, *, tied: bool = True,
               bias: bool = True) -> int:
    """Parameters of a GPT-2-shaped model (learned positions, 4h MLP, final LayerNorm).

    With biases (GPT-2): per block 12h² + 13h; plus token (Vh) and position (sh) embeddings, the final
    LayerNorm (2h) and an untied head (Vh) when `tied` is False. Narayanan et al. Eq. 2 counts the
    same terms without the final LayerNorm: 12Lh²(1 + 13/(12h) + (V+s)/(12Lh)). Without biases
    (minimega's `GPTConfig` default, untied head): 12h² + 2h per block and h for the final LayerNorm.
    """
    h = d_model
    per_block = 12 * h * h + (13 * h if bias else 2 * h)
    final_ln = 2 * h if bias else h
    return n_layer * per_block + vocab * h + seq_len * h + final_ln + (0 if tied else vocab * h)


# --8<-- [start:moe_estimate]


def moe_params(n_layer: int, d_model: int, vocab: int, seq_len: int, n_experts: int, *,
               expert_hidden: int | None = None, n_shared: int = 0) -> tuple[int, int]:
    """(non-expert, expert) parameters of minimega's `MoEGPT` (no biases, untied head).

    Each block's 8D² MLP becomes E experts of 2·D·F (F = ``expert_hidden``, 4D by default: 8D²) and a D·E
    router; the rest is `gpt_params`'s GPT. S = ``n_shared`` shared experts are one dense MLP of 2·D·S·F,
    counted with the non-expert parameters: they are synced over dp, not split over ep.
    """
    D, F = d_model, expert_hidden or 4 * d_model
    dense = gpt_params(n_layer, D, vocab, seq_len, tied=False, bias=False)
    experts = n_layer * n_experts * 2 * D * F
    return dense - n_layer * 8 * D * D + n_layer * D * n_experts + n_layer * 2 * D * n_shared * F, experts


def moe_model_state_bytes(n_dense: float, n_expert: float, dp: int, ep: int, stage: int,
                          precision: str = "mixed") -> float:
    """Model-state bytes per rank with expert parallelism carved out of dp.

    The non-expert parameters follow ZeRO over dp (`model_state_bytes`); a rank holds E/ep of the experts,
    whole, on each of the dp/ep ranks of its edp group. From stage 1 on their optimizer states are sharded
    over that group (ZeRO-1 over edp, `moe.zero.ExpertZero1`); their parameters and gradients stay whole.
    """
    if dp % ep:
        raise ValueError(f"ep={ep} must divide dp={dp}")
    return (model_state_bytes(n_dense, dp, stage, precision)
            + model_state_bytes(n_expert / ep, dp // ep, min(stage, 1), precision))


# --8<-- [end:moe_estimate]


# --8<-- [start:flops]
# --8<-- [start:flops_c1]
def flops_per_token(n_params: float, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> float:
# --8<-- [end:flops_c1]
    """Training FLOPs per token, PaLM App. B: 6N + 12·L·H·Q·T (forward 1/3, backward 2/3).

    N should exclude the position embedding (it does no matmul). GPT-2 124M: 855.1 MFLOP/token.
    """
    # --8<-- [start:flops_c2]
    return 6 * n_params + 12 * n_layer * n_head * head_dim * seq_len


def mfu(tokens_per_s: float, flops_per_tok: float, peak_flops: float) -> float:
    # --8<-- [end:flops_c2]
    """Model FLOPs utilisation: achieved model FLOP/s over the hardware peak (PaLM App. B)."""
    # --8<-- [start:flops_c3]
    return tokens_per_s * flops_per_tok / peak_flops


def megatron_model_flops(batch: int, seq_len: int, n_layer: int, hidden: int, vocab: int) -> float:
    # --8<-- [end:flops_c3]
    """Model FLOPs per iteration, Korthikanti et al. App. A: 72·B·L·s·h²·(1 + s/(6h) + V/(12hL))."""
    # --8<-- [start:flops_c4]
    s, h, L = seq_len, hidden, n_layer
    return 72 * batch * L * s * h * h * (1 + s / (6 * h) + vocab / (12 * h * L))
    # --8<-- [end:flops_c4]
# --8<-- [end:flops]


def moe_extra_flops(cfg) -> float:
    """Model FLOPs a MoE step adds to the dense formula (`estimate.megatron_model_flops`): each token's MLP runs
    in k experts and S shared ones of width F instead of one of 4h (12·B·s·L·h·F per expert, forward and backward,
    less the dense 48·B·s·L·h²) and through the router (6·B·s·L·h·E). Useful work only: empty capacity slots and
    the dense dispatch are not counted. F = 4h and S = 0: 48·B·s·L·h²·(k - 1) + 6·B·s·L·h·E."""
    if not cfg.experts:
        return 0.0
    tokens_layers, h = cfg.global_batch * cfg.seq_len * cfg.layers, cfg.hidden
    f = cfg.expert_ffn or 4 * h
    per_token = 12 * h * f * (cfg.top_k + cfg.shared_experts) - 48 * h * h + 6 * h * cfg.experts
    return tokens_layers * per_token


def moe_mlp_flops_per_token(d_model: int, n_experts: int, top_k: int, *, expert_hidden: int | None = None,
                            n_shared: int = 0) -> float:
    """Training FLOPs (forward + backward = 3 × forward, 2 per multiply-add) one token spends in one MoE layer's
    matmuls, useful work only: the router's D·E, its k routed experts' 2·D·F each and the S shared experts'
    2·D·F each (every token pays them): 6·D·(E + 2F·(k + S)). k = 1, S = 0, F = 4D is the dense MLP's 48D² plus
    the router. DeepSeekMoE's fine-grained split (E, F, k → mE, F/m, mk) leaves it unchanged but the router's."""
    F = expert_hidden or 4 * d_model
    return 6 * d_model * (n_experts + 2 * F * (top_k + n_shared))


# ----------------------------------------------------------------------------------------------
# Time, GPU-hours and money for a training run

# --8<-- [start:cost]
def megatron_hardware_flops(batch: int, seq_len: int, n_layer: int, hidden: int, vocab: int) -> float:
    """FLOPs per iteration with full recomputation, Narayanan et al. Eq. 3: 96·B·s·l·h²·(1 + s/(6h) + V/(16lh)).

    This is what Megatron-DeepSpeed's logs print as "TFLOPs" (hardware FLOPs, the forward counted
    twice). BLOOM's log line (B = 2048, s = 2048, l = 70, h = 14336, V = 250880, 104.70 s per
    iteration on 384 GPUs) gives back its 149.77 TFLOP/s per GPU.
    """
    s, h, l = seq_len, hidden, n_layer
    return 96 * batch * s * l * h * h * (1 + s / (6 * h) + vocab / (16 * l * h))


def achieved_flops_per_gpu(flops_per_iteration: float, seconds_per_iteration: float, n_gpus: int) -> float:
    """FLOP/s each GPU sustains: the iteration's FLOPs over its time and the GPUs that share it."""
    return flops_per_iteration / seconds_per_iteration / n_gpus


# --8<-- [start:training_seconds]
# --8<-- [start:training_seconds_c1]
def training_seconds(tokens: float, n_params: float, n_gpus: int, flops_per_gpu: float, *,
                     recompute: bool = True) -> float:
# --8<-- [end:training_seconds_c1]
    """End-to-end training time, Narayanan et al. Eq. 4: 8·T·P / (n·X) seconds.

    T tokens, P parameters, n GPUs each sustaining X FLOP/s. The 8 is 2 (forward) + 4 (backward) + 2
    (the forward again, recomputed); without recomputation it is 6. Restarts, evaluation and a
    batch-size ramp-up come on top: the real run is longer than this.
    """
    # --8<-- [start:training_seconds_c2]
    return (8 if recompute else 6) * tokens * n_params / (n_gpus * flops_per_gpu)
    # --8<-- [end:training_seconds_c2]
# --8<-- [end:training_seconds]


def gpu_hours(n_gpus: int, seconds: float) -> float:
    """GPU-hours: what clusters bill and what papers report, n GPUs held for `seconds`."""
    return n_gpus * seconds / 3600


def run_cost(gpu_hours_: float, price_per_gpu_hour: float, *, overhead: float = 0.0) -> float:
    """Money for a run: GPU-hours × the price of one, plus an `overhead` share (storage, network,
    failed and exploratory runs, people on call), e.g. 0.3 for 30% on top."""
    if price_per_gpu_hour < 0 or overhead < 0:
        raise ValueError("price_per_gpu_hour and overhead must be >= 0")
    return gpu_hours_ * price_per_gpu_hour * (1 + overhead)
# --8<-- [end:cost]


# ----------------------------------------------------------------------------------------------
# Batch arithmetic of a launch (ds_config.json, Megatron's command line)

def data_parallel_size(world: int, tp: int = 1, pp: int = 1) -> int:
    """dp = N / (tp · pp): the replicas a launch of `world` ranks leaves once tensor and pipeline
    parallelism have taken theirs. Refuses a world that the two degrees do not divide."""
    if min(world, tp, pp) < 1 or world % (tp * pp):
        raise ValueError(f"world={world} is not a positive multiple of tp*pp = {tp}*{pp}")
    return world // (tp * pp)


def accumulation_steps(global_batch: int, micro_batch: int, dp: int) -> int:
    """k = B / (b · dp): DeepSpeed's gradient_accumulation_steps, and the micro-batches m each pipeline
    runs per step under Megatron. DeepSpeed refuses a config where B != b · k · dp; so does this."""
    if min(global_batch, micro_batch, dp) < 1 or global_batch % (micro_batch * dp):
        raise ValueError(f"global_batch={global_batch} is not a positive multiple of micro_batch*dp = "
                         f"{micro_batch}*{dp}")
    return global_batch // (micro_batch * dp)
