"""ZeRO-1 for the experts: their Adam states sharded over the expert-data-parallel group (DeepSpeed-MoE).

With ``zero_stage=1`` the non-expert parameters follow `zero.Zero1` over dp. The experts are whole on the
dp/ep ranks of their edp group (`minimega.parallel.moe.layer`), so those ranks are where their optimizer states can be
split: every expert tensor of this rank goes into one flat buffer (`zero.FlatUnit`, padded to a multiple
of edp) and edp rank r keeps Adam's moments for ``[r·N/edp, (r+1)·N/edp)`` of it only:

    Phase 1 (backward): the expert gradients accumulate in a full flat gradient buffer (each ``p.grad`` a
        view of it); when the last one is in, its reduce-scatter over edp starts (async).
    Phase 2 (``finish_grad_sync()``): wait; this rank's shard of the buffer holds the edp sum, divided by dp
        (the experts' gradient is the sum over edp of the ep group's contributions over dp, see
        `moe.zero.ExpertGradSync`; under cp edp × cp and dp·cp). Under ZeRO-2 the dense gradients reduce on
        every micro-step; these accumulate in the flat buffer and reduce once, after the last.
    Phase 3 (step): the optimizer updates this rank's shard (fp32: the parameters' own storage), and an
        all-gather over edp refreshes every expert on every edp rank.

Communication per step, in elements of N (this rank's padded expert count), × (edp-1)/edp: reduce-scatter
N + all-gather N, as the all-reduce it replaces. Adam's moments: 2N/edp fp32 instead of 2N.

Clipping: the gradient shards differ over edp and the experts over ep, so a rank's squares are summed
over both groups (``norm_groups``); tp ranks hold replicas and are not summed over.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ... import comm
from ...run import measure
from ...comm import Group
from ..grad_sync import GradSync
from .layer import MoELayer, expert_params
from .balance import update_routing_bias
from ...zero import FlatUnit, MasterStore


class ExpertGradSync(GradSync):
    """The experts' gradient sync: sum over edp (× cp), divide by dp (· cp) (one bucket: all expert tensors).

    After backward a rank's expert gradients hold Σ over its ep group's tokens of ∂L_r/∂θ (the all-to-all
    brought them); the global loss is the mean of the dp ranks' losses, so the gradient is the sum over
    the edp replicas divided by dp (not by edp's size). Under cp the cp ranks hold the same experts and the
    mean runs over dp·cp losses: the engine passes edp × cp (`mesh.expert_group`) and dp·cp.

    Clipping (`grad_sync.clip_grad_norm_`, ``own``): after the sync the edp replicas (and the tp ranks)
    hold equal expert gradients and the ep ranks different experts, so the squares are summed over ep only.
    """

    grads_sharded = False

    def __init__(self, model: nn.Module, edp_group: Group, dp: int, ep_group: Group):
        self.module, self.group, self.dp, self.ep_group = model, edp_group, dp, ep_group
        self.norm_groups = [ep_group]
        self.params = [p for _, p in expert_params(model)]
        self._handle = self._flat = None
        for p in self.params:
            comm.broadcast(p.data, edp_group.ranks[0], edp_group, tag="init")
        self._watch([self.params])

    def _start(self, i: int) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        self._flat = torch.cat([g.reshape(-1) for g in grads])
        self._handle = comm.all_reduce(self._flat, self.group, async_op=True, tag="experts")

    def _complete(self) -> None:
        self._handle.wait()
        self._flat.div_(self.dp)
        offset = 0
        for p in self.params:
            view = self._flat[offset:offset + p.numel()].view_as(p)
            if p.grad is None:
                p.grad = view.clone()
            else:
                p.grad.copy_(view)
            offset += p.numel()
        self._handle = self._flat = None

    def grad_sq_norm(self, weight=None) -> torch.Tensor:
        """Σ ‖g‖² over this rank's expert gradients (float64, not reduced: see ``norm_groups``)."""
        sq = torch.zeros((), dtype=torch.float64, device=self.params[0].device)
        for p in self.params:
            if p.grad is not None:
                sq += p.grad.detach().double().pow(2).sum()
        return sq

    def scale_grads_(self, coef: float) -> None:
        for p in self.params:
            if p.grad is not None:
                p.grad.mul_(coef)

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every expert tensor whole (E, ...) on every rank: all-gather the ep ranks' slices (a collective); and
        the routing biases (`moe.balance`), equal on every rank, which ZeRO's own state dict does not hold."""
        out = self._gather_ep({name: p.detach() for name, p in expert_params(self.module)})
        out.update({f"{n}.expert_bias": m.expert_bias.detach().float().cpu().clone()
                    for n, m in self.module.named_modules() if isinstance(m, MoELayer) and m.moe.bias_update_rate})
        return out

    @torch.no_grad()
    def full_grad_dict(self) -> dict[str, torch.Tensor]:
        """Every expert gradient whole (E, ...) on every rank, after the sync (a collective)."""
        return self._gather_ep({name: p.grad if p.grad is not None else torch.zeros_like(p)
                                for name, p in expert_params(self.module)})

    def _gather_ep(self, local: dict) -> dict[str, torch.Tensor]:
        out = {}
        for name, t in local.items():
            ep = self.module_ep_group(name)
            full = torch.empty((ep.size * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
            comm.all_gather(full, t.contiguous(), ep, tag="state_dict")
            out[name] = full.float().cpu().clone()
        return out

    def module_ep_group(self, name: str) -> Group:
        layer = self.module.get_submodule(name.rsplit(".experts.", 1)[0])
        return layer.ep_group

    def after_step(self, dp_group: Group) -> None:
        """The routing biases' update from this step's loads, summed over dp (`moe.balance`)."""
        update_routing_bias([m for m in self.module.modules() if isinstance(m, MoELayer)], dp_group)

    def counts(self) -> dict:
        """Per layer, this rank's token-to-expert assignments and drops over all training steps so far."""
        layers = [m for m in self.module.modules() if isinstance(m, MoELayer)]
        return {"routed": [layer.routed.tolist() for layer in layers],
                "dropped": [layer.dropped.tolist() for layer in layers]}


class ExpertZero1(ExpertGradSync):
    """The experts' gradient sync and optimizer under ZeRO-1 over edp (see the module docstring).

    Args:
        model: the model holding this rank's E/ep experts of every layer (`moe.shard_experts`).
        edp_group, edp_rank: the ranks holding the same experts, and this rank's place among them.
        dp: the data-parallel size (the gradient's divisor).
        ep_group: the ranks holding the other experts.
        make_optimizer: ``params -> torch.optim.Optimizer``, applied to this rank's shard.

    Shapes: flat (N_pad,), shard and its gradient (N_pad/edp,), N = Σ this rank's expert tensors' elements.
    """

    grads_sharded = True

    def __init__(self, model: nn.Module, edp_group: Group, edp_rank: int, dp: int, ep_group: Group,
                 make_optimizer):
        super().__init__(model, edp_group, dp, ep_group)          # broadcast over edp, watch the gradients
        self.norm_groups = [ep_group, edp_group]
        self.units = [FlatUnit("experts", expert_params(model), edp_group.size, edp_rank, torch.float32)]
        unit = self.units[0]
        self.shards = [unit.flat[unit.start:unit.end]]            # a view: the parameters themselves
        self.store = MasterStore(self.shards, make_optimizer)
        self.flat_grad = torch.zeros_like(unit.flat)
        for p, view in zip(unit.params, unit.views(self.flat_grad)):
            p.grad = view                                          # autograd accumulates in place
        self.grad_shard = self.flat_grad[unit.start:unit.end]
        self._reducing = None

    @property
    def expert_optimizer(self) -> torch.optim.Optimizer:
        return self.store.optimizer

    def _start(self, i: int) -> None:
        out = torch.empty_like(self.grad_shard)
        self._reducing = out, comm.reduce_scatter(out, self.flat_grad, self.group, async_op=True, tag="experts")

    def _complete(self) -> None:
        out, handle = self._reducing
        handle.wait()
        self.grad_shard.copy_(out).div_(self.dp)
        self._reducing = None

    @torch.no_grad()
    def full_grad_dict(self) -> dict[str, torch.Tensor]:
        """Every expert gradient whole on every rank: the edp shards all-gathered, then the ep slices."""
        unit = self.units[0]
        flat = torch.empty_like(self.flat_grad)
        comm.all_gather(flat, self.grad_shard.contiguous(), self.group, tag="grads")
        return self._gather_ep(dict(zip(unit.names, unit.views(flat))))

    def grad_sq_norm(self, weight=None) -> torch.Tensor:
        """Σ ‖g‖² over this rank's gradient shard (float64; the padding is zero)."""
        return self.grad_shard.detach().double().pow(2).sum()

    def scale_grads_(self, coef: float) -> None:
        self.grad_shard.mul_(coef)

    @torch.no_grad()
    def step(self) -> bool:
        """Phase 3: Adam on this rank's shard, then all-gather the shards over edp."""
        self.store.master[0].grad = self.grad_shard
        self.store.step()
        self._gather_after_step()
        return True

    def _gather_after_step(self) -> None:
        unit = self.units[0]
        comm.all_gather(unit.flat, self.shards[0].clone(), self.group, tag="experts")

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.flat_grad.zero_()
        self.store.zero_grad()

    def memory(self) -> dict:
        """Bytes of the experts: parameters and gradients whole (E/ep), Adam's moments for one edp shard."""
        return {"params": measure.tensor_bytes([self.units[0].flat]), "grads": measure.tensor_bytes([self.flat_grad]),
                **self.store.memory()}
