"""Mixture of experts: a GPT whose MLPs are routed experts, and expert parallelism over an ep group.

Each block's MLP becomes E experts (each a D → F → D GELU MLP) and a router (a D → E linear). A token
goes to its top-k experts; the layer's output is their outputs weighted by the gates (GShard's top-2,
Lepikhin et al. 2020, arXiv:2006.16668; Switch's top-1, Fedus et al. 2021, arXiv:2101.03961):

    p = softmax(x W_r)                          (B, T, E) router probabilities
    gates = top-k of p, renormalised to sum to 1 when k > 1 (GShard); k = 1 keeps p_i (Switch), so the
            router still gets a gradient from the loss
    y = Σ_{j ≤ k} gate_j · expert_{i_j}(x)      tokens over capacity skip the expert (y = 0: the
                                                residual stream carries them past the layer)

Capacity. An expert takes at most C = min(T, ceil(capacity_factor · k · T / E)) tokens of each
*routing group*; the rest are dropped. The routing group is one sequence (GShard's groups): the
dropping then depends on nothing but the sequence, so every layout (any dp, any ep) drops exactly the
tokens the single-process model drops. Priority follows GShard: every token's first choice in token
order, then every second choice.

Dropless dispatch (``dispatch='dropless'``, `minimega.parallel.moe.dropless`): no capacity; the (token, choice) pairs
are sorted by expert, each expert runs on its contiguous rows, the outputs go back weighted by the gates;
under ep the all-to-alls carry each rank's variable row counts (the counts are exchanged first).

Fine-grained and shared experts (DeepSeekMoE, Dai et al. 2024, arXiv:2401.06066). ``expert_hidden`` sets F
(default: the dense MLP's 4D): m·E experts of F/m, routed top m·k, cost what E of F routed top k cost but mix
C(mE, mk) ways. ``n_shared_experts`` = S adds S always-active experts, one dense D → S·F → D MLP (``shared``)
that every token passes with no gate: y = shared(x) + Σ_j gate_j · expert_{i_j}(x). The shared MLP is an
ordinary dense parameter, not an expert: under ep it is whole on every rank and synced over dp like attention.

Load balancing (Switch eq. 4, GShard's l_aux with the top-1 fractions): per routing group

    aux = E · Σ_e f_e · P_e,   f_e = share of tokens whose first choice is e,  P_e = mean of p_e,

averaged over the sequences; 1 when the router is uniform, up to E when it collapses onto one expert.
The model's loss is cross-entropy + ``aux_loss_coef`` · Σ_layers aux (Switch uses α = 10⁻²), + ``z_loss_coef``
· Σ_layers z with the router z-loss; ``bias_update_rate`` balances by a routing bias instead (`moe.balance`).

Expert parallelism (ep). The E experts are split over the ep group, E/ep per rank. ep is carved out of
dp, as in DeepSpeed-MoE (Rajbhandari et al. 2022, arXiv:2201.05596) and Megatron-core: the world stays
pp · dp · tp, each run of ep consecutive dp ranks shares one copy of the experts, and the ranks holding
the same experts form the expert-data-parallel group (edp, dp/ep ranks). Per MoE layer:

    Phase 1 (dispatch): each rank lays its tokens out as (E, B·C, D), capacity slots per expert, and an
        all-to-all over ep sends expert e's slots to the rank holding e.
    Phase 2 (experts): each rank runs its E/ep experts on the slots of every rank, (E/ep, ep·B·C, D).
    Phase 3 (combine): the reverse all-to-all brings the outputs home; the gates weight them.

Backward runs the same two all-to-alls on the gradients (an all-to-all with equal splits is its own
adjoint). Gradients: the non-expert parameters are averaged over dp by DDP or ZeRO-1/2 as usual; the
experts' gradients already hold the contributions of every token of their ep group (the all-to-all
brought them), so they are summed over edp and divided by dp (`ExpertGradSync`). With ``zero_stage=1``
their Adam states are sharded over edp as well (DeepSpeed-MoE): a reduce-scatter over edp before the step,
an all-gather after it (`moe.zero.ExpertZero1`). Gradient clipping counts each expert once: its squares
are summed over ep, and over edp only where edp holds shards (`grad_sync.clip_grad_norm_`, ``own``).

Per rank and MoE layer, every all-to-all sends (ep-1)/ep of an (E, B_local·C, D) buffer; forward and
backward run two each: 4 · (ep-1)/ep · E · B_local · C · D · bytes per layer and step (`alltoall_bytes`).

Tensor parallelism splits attention, embeddings and head; the MoE layers stay whole on every tp rank
(`apply_tensor_parallel`); cp with dropless dispatch only (capacity is per sequence; `moe.balance` pools f_e, P_e).
Refused by name (`check`): sequence or pipeline parallelism, ZeRO-3, bf16/fp16 and activation checkpointing.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...comm import Group
from ...config import GPTConfig, _is_int, _is_real
from ...comm.autograd import exchange
from ...model import GPT, MLP
from .balance import sequence_means
from .dropless import dropless_combine, run_expert_parallel
from ...sizes import moe_alltoall_bytes, moe_capacity  # noqa: F401  (integer rules shared with the estimators)


@dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """The mixture-of-experts MLP: how many experts, how many each token uses, how many tokens each takes."""

    n_experts: int = 4
    """E experts per MoE layer (every block's MLP is one)."""
    top_k: int = 2
    """Experts per token (GShard: 2, Switch: 1)."""
    capacity_factor: float = 1.25
    """Slots per expert and sequence = capacity_factor · top_k · T / E (rounded up, at most T)."""
    aux_loss_coef: float = 0.01
    """α, the weight of the load-balancing loss (Switch Transformer: 10⁻²)."""
    dispatch: str = "capacity"
    """'capacity': one-hot slots, tokens over capacity dropped (GShard); 'dropless': sorted by expert, none
    dropped, ``capacity_factor`` unused (`minimega.parallel.moe.dropless`)."""
    z_loss_coef: float = 0.0
    """Weight of the router z-loss, mean over tokens of logsumexp(router logits)² (ST-MoE); 0: off."""
    bias_update_rate: float = 0.0
    """Auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias on the scores picks the top-k (the gates
    stay unbiased), moved by rate · sign(mean load - load) after every step; 0: off."""
    expert_hidden: int | None = None
    """F, each expert's hidden width; None: the dense MLP's (``GPTConfig.mlp_hidden``, 4·D). Fine-grained
    experts (DeepSeekMoE): split each of E experts into m of F/m and route top m·k."""
    n_shared_experts: int = 0
    """S always-active experts (DeepSeekMoE): one dense MLP of hidden S·F run on every token, added ungated."""

    def __post_init__(self):
        for name in ("n_experts", "top_k"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise ValueError(f"MoEConfig.{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.top_k > self.n_experts:
            raise ValueError(f"MoEConfig: top_k={self.top_k} > n_experts={self.n_experts}; a token picks distinct experts")
        if not _is_real(self.capacity_factor) or self.capacity_factor <= 0:
            raise ValueError(f"MoEConfig.capacity_factor must be a finite number > 0, got {self.capacity_factor!r}")
        for name in ("aux_loss_coef", "z_loss_coef", "bias_update_rate"):
            if not _is_real(getattr(self, name)) or getattr(self, name) < 0:
                raise ValueError(f"MoEConfig.{name} must be a finite number >= 0, got {getattr(self, name)!r}")
        if self.expert_hidden is not None and (not _is_int(self.expert_hidden) or self.expert_hidden < 1):
            raise ValueError(f"MoEConfig.expert_hidden must be a positive integer or None, got {self.expert_hidden!r}")
        if not _is_int(self.n_shared_experts) or self.n_shared_experts < 0:
            raise ValueError(f"MoEConfig.n_shared_experts must be an integer >= 0, got {self.n_shared_experts!r}")
        if self.dispatch not in ("capacity", "dropless"):
            raise ValueError(f"MoEConfig.dispatch must be 'capacity' or 'dropless', got {self.dispatch!r}")

    def capacity(self, seq_len: int) -> int:
        """C: slots per expert in one routing group (one sequence of ``seq_len`` tokens)."""
        return moe_capacity(seq_len, self.n_experts, self.top_k, self.capacity_factor)


@dataclass(frozen=True, kw_only=True)
class MoEGPTConfig(GPTConfig):
    """A `GPTConfig` and a `MoEConfig` in one record: what a checkpoint's manifest stores for a MoE model."""

    n_experts: int = 4
    top_k: int = 2
    capacity_factor: float = 1.25
    aux_loss_coef: float = 0.01
    dispatch: str = "capacity"
    z_loss_coef: float = 0.0
    bias_update_rate: float = 0.0
    expert_hidden: int | None = None
    n_shared_experts: int = 0

    def __post_init__(self):
        super().__post_init__()
        self.parts()

    def parts(self) -> tuple[GPTConfig, MoEConfig]:
        names = {f.name for f in fields(MoEConfig)}
        values = asdict(self)
        return (GPTConfig(**{k: v for k, v in values.items() if k not in names}),
                MoEConfig(**{k: v for k, v in values.items() if k in names}))

    @classmethod
    def of(cls, model: "MoEGPT") -> "MoEGPTConfig":
        return cls(**asdict(model.config), **asdict(model.moe_config))

    def build(self) -> "MoEGPT":
        return MoEGPT(*self.parts())




def alltoall_bytes(moe: MoEConfig, n_layer: int, rows: int, seq_len: int, n_embd: int, ep: int,
                   bytes_per_element: int = 4) -> float:
    """`moe_alltoall_bytes` for a `MoEConfig`: what the CommLog of one training step records."""
    return moe_alltoall_bytes(n_layer, rows, seq_len, n_embd, ep, moe.n_experts, moe.top_k,
                              moe.capacity_factor, bytes_per_element)


# --8<-- [start:assign_slots]
def assign_slots(top_i: torch.Tensor, n_experts: int, capacity: int):
    """Each (token, choice)'s place in its expert's queue, and whether it fits (GShard's priority).

    Every token's first choice is queued in token order, then every second choice, and so on; an expert
    keeps the first ``capacity`` assignments of its queue and drops the rest.

    Shapes: top_i (B, T, k) expert ids → choice, slot, kept, each (B, k·T, E), rows in priority order
    (choice j of token t is row j·T + t): choice is one-hot, slot the 0-based place in expert e's queue
    where choice is 1, kept = choice and slot < capacity.
    """
    B, T, k = top_i.shape
    choice = F.one_hot(top_i, n_experts).transpose(1, 2).reshape(B, k * T, n_experts)   # (B, kT, E)
    slot = choice.cumsum(dim=1) - 1
    return choice, slot, (choice == 1) & (slot < capacity)
# --8<-- [end:assign_slots]


class Experts(nn.Module):
    """``n`` GELU MLPs stored stacked: fc (n, F, D) and proj (n, D, F), each expert's slice laid out as an
    ``nn.Linear`` weight, so expert e of a one-expert layer is the dense `model.MLP` weight for weight.

    ``own_grad_sync``: the dp wrappers leave these parameters alone (`grad_sync.dp_named_parameters`).
    """

    own_grad_sync = True

    def __init__(self, n: int, n_embd: int, hidden: int):
        super().__init__()
        self.offset = 0
        self.fc = nn.Parameter(torch.empty(n, hidden, n_embd))
        self.proj = nn.Parameter(torch.empty(n, n_embd, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:      # x: (n, N, D), N tokens per expert
        h = F.gelu(x @ self.fc.transpose(1, 2))              # (n, N, F)
        return h @ self.proj.transpose(1, 2)                 # (n, N, D)

    def grouped(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:   # x: (N, D), sorted by expert
        """Expert e on its ``counts[e]`` contiguous rows of ``x``, every expert in one grouped matmul per weight
        (`F.grouped_mm`: row block e times fc[e]ᵀ, then proj[e]ᵀ; the same sums as one matmul per slice)."""
        ends = counts.cumsum(0).to(torch.int32)                               # where each expert's rows end
        h = F.gelu(F.grouped_mm(x, self.fc.transpose(1, 2), offs=ends))      # (N, F)
        return F.grouped_mm(h, self.proj.transpose(1, 2), offs=ends)         # (N, D)


class MoELayer(nn.Module):
    """Router + experts in place of a block's MLP; see the module docstring for routing and capacity.

    ``shared``: the shared experts' dense `model.MLP` (hidden S·F), or None.
    ``ep_group``: the ranks the experts are split over (`shard_experts` sets it; size one on one process).
    Counters (this rank's tokens, training forwards only): ``routed[e]`` token-to-expert assignments made,
    ``dropped[e]`` those over capacity.
    """

    def __init__(self, config: GPTConfig, moe: MoEConfig):
        super().__init__()
        self.moe = moe
        self.router = nn.Linear(config.n_embd, moe.n_experts, bias=False)
        hidden = moe.expert_hidden or config.mlp_hidden
        if moe.dispatch == "dropless" and (config.n_embd % 4 or hidden % 4):       # `Experts.grouped`'s kernel
            raise ValueError(f"dispatch='dropless' runs the experts as grouped matmuls over 16-byte rows: n_embd="
                             f"{config.n_embd} and the expert width {hidden} must be multiples of 4")
        self.experts = Experts(moe.n_experts, config.n_embd, hidden)
        self.shared = MLP(replace(config, ffn_hidden=moe.n_shared_experts * hidden, mlp_ratio=4, dropout=0.0)) \
            if moe.n_shared_experts else None       # a dense MLP: not an expert, nothing in it matches ".experts."
        self.ep_group, self.cp_group = Group(None, [0], "ep"), None    # cp_group: the aux means pool over it
        self.register_buffer("routed", torch.zeros(moe.n_experts, dtype=torch.int64), persistent=False)
        self.register_buffer("dropped", torch.zeros(moe.n_experts, dtype=torch.int64), persistent=False)
        self.register_buffer("step_load", torch.zeros(moe.n_experts, dtype=torch.int64), persistent=False)
        if moe.bias_update_rate:       # a checkpoint carries it: the routing depends on it
            self.register_buffer("expert_bias", torch.zeros(moe.n_experts))
        self.aux_loss: torch.Tensor | None = None
        self.z_loss: torch.Tensor | None = None

    def take_router_losses(self) -> tuple[torch.Tensor, torch.Tensor | float]:
        """The last forward's load-balancing loss and z-loss (0.0 when off), cleared here: the module never
        keeps a graph alive."""
        aux, z, self.aux_loss, self.z_loss = self.aux_loss, self.z_loss, None, None
        return aux, (0.0 if z is None else z)

    # --8<-- [start:select]
    def select(self, x: torch.Tensor):
        """The router: probabilities (B, T, E), expert ids and gates (B, T, k), the load-balancing loss.

        ``bias_update_rate`` > 0: the experts are the top-k of probs + ``expert_bias`` and the gates the
        unbiased probabilities (DeepSeek-V3). ``z_loss_coef`` > 0: mean logsumexp(logits)² is kept (ST-MoE)."""
        E, k = self.moe.n_experts, self.moe.top_k
        logits = self.router(x)                                                 # (B, T, E)
        probs = F.softmax(logits, dim=-1)
        if self.moe.bias_update_rate:
            top_i = (probs.detach() + self.expert_bias).topk(k, dim=-1).indices  # the bias only picks
            top_p = probs.gather(-1, top_i)                                    # (B, T, k)
        else:
            top_p, top_i = probs.topk(k, dim=-1)                               # (B, T, k)
        gates = top_p / top_p.sum(-1, keepdim=True) if k > 1 else top_p
        if self.moe.z_loss_coef:
            self.z_loss = torch.logsumexp(logits, dim=-1).square().mean()
        f, P = sequence_means(top_i[..., 0], probs, self.cp_group)            # (B, E) each, over the whole T
        aux = E * (f * P).sum(-1).mean()                                      # per sequence, then mean
        return probs, top_i, gates, aux
    # --8<-- [end:select]

    def _count(self, routed: torch.Tensor, dropped: torch.Tensor) -> None:
        if self.training:
            self.routed += routed
            self.dropped += dropped
            self.step_load += routed

    # --8<-- [start:route]
    def route(self, x: torch.Tensor):
        """Top-k routing with capacity. Returns dispatch (B, T, E, C) in {0, 1}, combine (B, T, E, C) = gate
        where dispatched, the load-balancing loss, and per expert the assignments made and dropped."""
        B, T, _ = x.shape
        E, k, C = self.moe.n_experts, self.moe.top_k, self.moe.capacity(T)
        probs, top_i, gates, aux = self.select(x)                             # (B, T, E), (B, T, k) ×2
        choice, slot, kept = assign_slots(top_i, E, C)                        # (B, kT, E) each
        place = F.one_hot(slot.clamp(0, C - 1), C) * kept.unsqueeze(-1)       # (B, kT, E, C)
        place = place.view(B, k, T, E, C).to(x.dtype)
        dispatch = place.sum(1)                                                # (B, T, E, C): distinct experts
        combine = torch.einsum("bktec,btk->btec", place, gates)               # (B, T, E, C)
        return dispatch, combine, aux, choice.sum((0, 1)), (choice.sum((0, 1)) - kept.sum((0, 1)))
    # --8<-- [end:route]

    # --8<-- [start:moe_forward]
    def forward(self, x: torch.Tensor) -> torch.Tensor:                       # x: (B, T, D)
        y = self.forward_dropless(x) if self.moe.dispatch == "dropless" else self.forward_capacity(x)
        return y if self.shared is None else y + self.shared(x)               # shared experts: every token, no gate

    def forward_capacity(self, x: torch.Tensor) -> torch.Tensor:              # x: (B, T, D)
        B, T, D = x.shape
        E, C = self.moe.n_experts, self.moe.capacity(T)
        dispatch, combine, self.aux_loss, routed, dropped = self.route(x)
        self._count(routed, dropped)
        slots = torch.einsum("btec,btd->ebcd", dispatch, x).reshape(E, B * C, D)   # (E, B·C, D)
        out = self.run_experts(slots)                                              # (E, B·C, D)
        return torch.einsum("btec,ebcd->btd", combine, out.view(E, B, C, D))      # (B, T, D)

    def run_experts(self, slots: torch.Tensor) -> torch.Tensor:
        """(E, N, D) slots of this rank's tokens → the experts' outputs, same shape; all-to-all under ep."""
        ep = self.ep_group.size
        if ep == 1:
            return self.experts(slots)
        E, N, D = slots.shape
        local = E // ep
        got = exchange(slots, self.ep_group, "moe_dispatch")                  # chunk i: rank i's slots
        got = got.view(ep, local, N, D).transpose(0, 1).reshape(local, ep * N, D)  # (E/ep, ep·N, D)
        out = self.experts(got).view(local, ep, N, D).transpose(0, 1).reshape(E, N, D)
        return exchange(out, self.ep_group, "moe_combine")                    # (E, N, D), home again
    # --8<-- [end:moe_forward]

    # --8<-- [start:forward_dropless]
    def forward_dropless(self, x: torch.Tensor) -> torch.Tensor:              # x: (B, T, D)
        """Every (token, choice) kept: sorted by expert, run, scattered back (`moe.dropless`)."""
        B, T, D = x.shape
        E, k = self.moe.n_experts, self.moe.top_k
        _, top_i, gates, self.aux_loss = self.select(x)
        routed = torch.bincount(top_i.reshape(-1), minlength=E)
        self._count(routed, torch.zeros_like(routed))
        if self.ep_group.size == 1:
            run = self.experts.grouped
        else:
            def run(rows, counts):
                return run_expert_parallel(self.experts, rows, counts, self.ep_group)
        y = dropless_combine(x.reshape(B * T, D), top_i.reshape(B * T, k), gates.reshape(B * T, k), E, run)
        return y.view(B, T, D)
    # --8<-- [end:forward_dropless]


class MoEGPT(GPT):
    """`model.GPT` with every block's MLP a `MoELayer`; the loss adds α · Σ_layers aux.

    Parameters (bias=False): GPT's, with each block's 8D² MLP replaced by E · 2DF experts + E·D router
    (+ S · 2DF shared). ``torch.manual_seed(s)`` before construction fixes the initialisation (the experts
    are drawn after the dense model, in block order: router, fc, proj, then the shared fc and proj).
    """

    def __init__(self, config: GPTConfig, moe: MoEConfig | None = None):
        if config.bias:
            raise ValueError("MoEGPT: the experts carry no biases; use GPTConfig(bias=False)")
        if config.mlp != "gelu":
            raise ValueError(f"MoEGPT: the experts are GELU MLPs (fc, proj); GPTConfig.mlp={config.mlp!r} is not "
                             f"built for them, use mlp='gelu'")
        super().__init__(config)
        self.moe_config = moe = moe or MoEConfig()
        for block in self.blocks:
            block.mlp = MoELayer(config, moe)
            nn.init.normal_(block.mlp.router.weight, mean=0.0, std=0.02)
            nn.init.normal_(block.mlp.experts.fc, mean=0.0, std=0.02)
            nn.init.normal_(block.mlp.experts.proj, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
            if block.mlp.shared is not None:
                nn.init.normal_(block.mlp.shared.fc.weight, mean=0.0, std=0.02)
                nn.init.normal_(block.mlp.shared.proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def moe_layers(self) -> list[MoELayer]:
        return [m for m in self.modules() if isinstance(m, MoELayer)]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.head(x)                                                  # (B, T, V)
        losses = [layer.take_router_losses() for layer in self.moe_layers()]
        if targets is None:
            return logits, None
        aux, z = sum(a for a, _ in losses), sum(z for _, z in losses)
        return logits, (self.loss(logits, targets) + self.moe_config.aux_loss_coef * aux
                        + self.moe_config.z_loss_coef * z)


def apply_tensor_parallel(model: MoEGPT, mesh) -> "nn.Module":
    """Attention, embeddings and head split over tp as in `tensor.ParallelGPT`; the MoE layers stay
    whole on every tp rank. Their input (the residual stream after attention's all-reduce) is the same on
    every tp rank, so each runs the same routing, all-to-alls (within its own ep group: ep is carved out
    of dp, whose groups hold one tp rank) and experts; their gradients are tp replicas, like a LayerNorm's."""
    from ..tensor import ParallelGPT

    class ParallelMoEGPT(ParallelGPT):
        forward = MoEGPT.forward
        moe_layers = MoEGPT.moe_layers

    out = ParallelMoEGPT(model, mesh.tp_group, False)
    out.moe_config = model.moe_config
    return out


def is_moe(model: nn.Module) -> bool:
    return isinstance(getattr(model, "moe_config", None), MoEConfig)


def check(moe: MoEConfig | None, config, dims) -> None:
    """What the engine builds with a MoE model (or with ep > 1); everything else is refused by name."""
    if moe is None:
        if dims.ep > 1:
            raise ValueError(f"ep={dims.ep} needs a mixture-of-experts model (minimega.parallel.moe.layer.MoEGPT, or "
                             f"`minimega train --experts N`); a dense model has no experts to split")
        return
    if moe.n_experts % dims.ep:
        raise ValueError(f"ep={dims.ep} does not divide n_experts={moe.n_experts}: each ep rank holds E/ep experts")
    refused = [("sequence_parallel", config.sequence_parallel,
                "sequence_parallel=False (routing groups are whole sequences; sp would cut them over tp)"),
               ("pp", config.pp != 1, "pp=1"),
               ("zero_stage", config.zero_stage > 2, "zero_stage 0, 1 or 2 (ZeRO-3 would shard the non-expert weights "
                "only: the experts' stay whole on every edp rank, their ZeRO is ZeRO-1 over edp)"),
               ("cp", dims.cp > 1 and moe.dispatch != "dropless",
                "dispatch='dropless' (MoEConfig; capacity is a budget per whole sequence, which cp splits) or cp=1"),
               ("precision", config.precision != "fp32", "precision='fp32'"),
               ("activation_checkpointing", config.activation_checkpointing != "none",
                "activation_checkpointing='none' (recomputation would repeat the all-to-alls and the counts)")]
    for name, bad, fix in refused:
        if bad:
            raise ValueError(f"TrainConfig.{name}={getattr(config, name)!r} is not supported with a "
                             f"mixture-of-experts model; use {fix}")


def shard_experts(model: MoEGPT, ep_group: Group, ep_rank: int) -> None:
    """Keep this rank's E/ep experts of every layer (in place: the engine's own copy) and set the ep group."""
    for layer in model.moe_layers():
        local = layer.moe.n_experts // ep_group.size
        keep = slice(ep_rank * local, (ep_rank + 1) * local)
        layer.experts.offset = keep.start            # its first expert's index: where its rows sit globally
        layer.experts.fc = nn.Parameter(layer.experts.fc.data[keep].clone())
        layer.experts.proj = nn.Parameter(layer.experts.proj.data[keep].clone())
        layer.ep_group = ep_group


def expert_params(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of every expert tensor, under `model.py`-style keys."""
    return [(n, p) for n, p in model.named_parameters() if ".experts." in f".{n}"]

