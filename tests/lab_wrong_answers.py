"""Deliberately wrong answers to the lab exercises: each is a mistake a learner makes, and the check must
name it. Module level, because the ring checks send them to gloo ranks by reference."""
import hashlib
import json
from pathlib import Path

import torch
import torch.distributed as dist

from minimega import comm
from solutions.loss_scaler import LossScaler as _GoodScaler      # labs/solutions/ (on sys.path in the tests)
from solutions.offload import bytes_by_location as _good_location

# ------------------------------------------------------------------------------------------------
# labs/exercises/memory.py: model_state_bytes(param_numels, optimizer)


def _adam(psi, tensors):
    return 8 * psi + 4 * tensors


def memory_forgets_step(numels, optimizer):
    psi = sum(numels)
    return {"params": 4 * psi, "grads": 4 * psi, "optimizer_states": 0 if optimizer == "sgd" else 8 * psi}


def memory_counts_elements(numels, optimizer):
    psi = sum(numels)
    return {"params": psi, "grads": 4 * psi, "optimizer_states": 0 if optimizer == "sgd" else _adam(psi, len(numels))}


def memory_one_moment(numels, optimizer):
    psi = sum(numels)
    return {"params": 4 * psi, "grads": 4 * psi, "optimizer_states": 0 if optimizer == "sgd" else 4 * psi}


def memory_sgd_has_momentum(numels, optimizer):
    psi = sum(numels)
    return {"params": 4 * psi, "grads": 4 * psi,
            "optimizer_states": 4 * psi if optimizer == "sgd" else _adam(psi, len(numels))}


def memory_mixed_precision_k(numels, optimizer):
    psi = sum(numels)
    return {"params": 4 * psi, "grads": 4 * psi, "optimizer_states": 0 if optimizer == "sgd" else 12 * psi}


def memory_no_grads(numels, optimizer):
    psi = sum(numels)
    return {"params": 4 * psi, "grads": 0, "optimizer_states": 0 if optimizer == "sgd" else _adam(psi, len(numels))}


def memory_total_only(numels, optimizer):
    return 16 * sum(numels)


# ------------------------------------------------------------------------------------------------
# labs/exercises/ring_all_reduce.py: ring_all_reduce(tensor, group)


def _padded(tensor, n):
    flat = tensor.reshape(-1)
    pad = (-flat.numel()) % n
    return torch.cat([flat, flat.new_zeros(pad)]) if pad else flat


def ring_no_padding(tensor, group):
    flat = tensor.reshape(-1)
    shard = flat.new_empty(flat.numel() // group.size)
    comm.reduce_scatter(shard, flat, group)
    out = torch.empty_like(flat)
    comm.all_gather(out, shard, group)
    return out.view_as(tensor)


def ring_returns_mean(tensor, group):
    flat = _padded(tensor, group.size)
    shard = flat.new_empty(flat.numel() // group.size)
    comm.reduce_scatter(shard, flat, group)
    out = torch.empty_like(flat)
    comm.all_gather(out, shard, group)
    return (out[:tensor.numel()] / group.size).view_as(tensor)


def ring_skips_all_gather(tensor, group):
    flat = _padded(tensor, group.size)
    k = flat.numel() // group.size
    shard = flat.new_empty(k)
    comm.reduce_scatter(shard, flat, group)
    r = group.rank_of(dist.get_rank())
    out = flat.clone()
    out[r * k:(r + 1) * k] = shard
    return out[:tensor.numel()].view_as(tensor)


def ring_uses_all_reduce(tensor, group):
    return comm.all_reduce(tensor.clone(), group)


def ring_local_only(tensor, group):
    return tensor


def ring_keeps_padding(tensor, group):
    flat = _padded(tensor, group.size)
    shard = flat.new_empty(flat.numel() // group.size)
    comm.reduce_scatter(shard, flat, group)
    out = torch.empty_like(flat)
    comm.all_gather(out, shard, group)
    return out


def ring_only_rank0_communicates(tensor, group):
    if dist.get_rank() == 0:
        return ring_keeps_padding(tensor, group)[:tensor.numel()].view_as(tensor)
    return tensor


# ------------------------------------------------------------------------------------------------
# labs/exercises/tp_regions.py: CopyToTP (f) and ReduceFromTP (g)


class GoodF(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return comm.all_reduce(grad.clone(), ctx.group), None


class GoodG(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return comm.all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class FBackwardIdentity(GoodF):
    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GForwardIdentity(GoodG):
    @staticmethod
    def forward(ctx, x, group):
        return x.view_as(x)


class GForwardMean(GoodG):
    @staticmethod
    def forward(ctx, x, group):
        return comm.all_reduce_mean(x.clone(), group)


class GBackwardAllReduce(GoodG):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return comm.all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return comm.all_reduce(grad.clone(), ctx.group), None


# ------------------------------------------------------------------------------------------------
# labs/exercises/checkpoint.py: Checkpoint.apply(fn, x)


class GoodCheckpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, x):
        ctx.fn, ctx.rng = fn, torch.get_rng_state()
        ctx.save_for_backward(x)
        return fn(x)

    @staticmethod
    def _recompute(ctx, x):
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(ctx.rng)
            with torch.enable_grad():
                return ctx.fn(x)

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        x = x.detach().requires_grad_()
        torch.autograd.backward(GoodCheckpoint._recompute(ctx, x), grad)
        return None, x.grad


class CheckpointForgetsRng(GoodCheckpoint):
    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        x = x.detach().requires_grad_()
        with torch.enable_grad():
            out = ctx.fn(x)
        torch.autograd.backward(out, grad)
        return None, x.grad


class CheckpointReturnsOneGradient(GoodCheckpoint):
    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        x = x.detach().requires_grad_()
        torch.autograd.backward(GoodCheckpoint._recompute(ctx, x), grad)
        return x.grad


class CheckpointRecomputesWithoutGrad(GoodCheckpoint):
    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        x = x.detach().requires_grad_()
        torch.set_rng_state(ctx.rng)
        out = ctx.fn(x)
        torch.autograd.backward(out, grad)
        return None, x.grad


class CheckpointSavesOutput(GoodCheckpoint):
    @staticmethod
    def forward(ctx, fn, x):
        ctx.fn, ctx.rng = fn, torch.get_rng_state()
        out = fn(x)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, _ = ctx.saved_tensors
        x = x.detach().requires_grad_()
        torch.autograd.backward(GoodCheckpoint._recompute(ctx, x), grad)
        return None, x.grad


# ------------------------------------------------------------------------------------------------
# labs/exercises/zero_reduce_scatter.py: reduce_scatter_grads(grads, group)


def _rs(flat, group):
    shard = flat.new_empty(flat.numel() // group.size)
    comm.reduce_scatter(shard, flat, group)
    return shard


def _flat(grads):
    return torch.cat([g.reshape(-1) for g in grads])


def rs_no_padding(grads, group):
    return _rs(_flat(grads), group)


def rs_mean(grads, group):
    return _rs(_padded(_flat(grads), group.size), group) / group.size


def rs_all_reduce_then_slice(grads, group):
    flat = comm.all_reduce(_padded(_flat(grads), group.size).clone(), group)
    k, r = flat.numel() // group.size, group.rank_of(dist.get_rank())
    return flat[r * k:(r + 1) * k].clone()


def rs_pads_each_gradient(grads, group):
    return _rs(torch.cat([_padded(g, group.size) for g in grads]), group)


def rs_reversed_order(grads, group):
    return _rs(_padded(_flat(list(reversed(grads))), group.size), group)


def rs_local_slice(grads, group):
    flat = _padded(_flat(grads), group.size)
    k, r = flat.numel() // group.size, group.rank_of(dist.get_rank())
    return flat[r * k:(r + 1) * k].clone()


def rs_returns_full_buffer(grads, group):
    return comm.all_reduce(_padded(_flat(grads), group.size).clone(), group)


# ------------------------------------------------------------------------------------------------
# labs/exercises/one_f_one_b.py: one_f_one_b_order(p, m, rank)


def _1f1b(m, warmup, backward_first=False):
    warmup = min(warmup, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("B", i), ("F", warmup + i)] if backward_first else [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]


def order_gpipe(p, m, rank):
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def order_warmup_off_by_one(p, m, rank):
    return _1f1b(m, p - rank)


def order_warmup_reversed(p, m, rank):
    return _1f1b(m, rank)


def order_backward_first(p, m, rank):
    if p - rank - 1 == 0:
        return _1f1b(m, 0)
    return _1f1b(m, p - rank - 1, backward_first=True)


def order_warmup_not_capped(p, m, rank):
    warmup = p - rank - 1
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(max(m - warmup, 0), m)]


def order_forgets_cool_down(p, m, rank):
    return _1f1b(m, p - rank - 1)[:m + min(p - rank - 1, m)]


# ------------------------------------------------------------------------------------------------
# labs/exercises/verify_checkpoint.py: verify_checkpoint(directory)



def _step_dir(directory):
    path = Path(directory)
    return path if (path / "manifest.json").exists() else path / (path / "latest").read_text().strip()


def verify_existence_only(directory):
    path = _step_dir(directory)
    return sorted(n for n in json.loads((path / "manifest.json").read_text())["files"] if not (path / n).exists())


def verify_by_size(directory):
    """Flags missing files and ones too small to hold their tensors: a same-size corruption slips through."""
    path = _step_dir(directory)
    return sorted(n for n in json.loads((path / "manifest.json").read_text())["files"]
                  if not (path / n).exists() or (path / n).stat().st_size < 200)


def verify_md5(directory):
    path = _step_dir(directory)
    files = json.loads((path / "manifest.json").read_text())["files"]
    return sorted(n for n, d in files.items()
                  if not (path / n).exists() or hashlib.md5((path / n).read_bytes()).hexdigest() != d["sha256"])


def verify_ignores_latest(directory):
    path = Path(directory)
    files = json.loads((path / "manifest.json").read_text())["files"]
    return sorted(n for n, d in files.items()
                  if not (path / n).exists() or hashlib.sha256((path / n).read_bytes()).hexdigest() != d["sha256"])


def verify_crashes_on_missing(directory):
    path = _step_dir(directory)
    files = json.loads((path / "manifest.json").read_text())["files"]
    return sorted(n for n, d in files.items() if hashlib.sha256((path / n).read_bytes()).hexdigest() != d["sha256"])


def verify_returns_paths(directory):
    path = _step_dir(directory)
    files = json.loads((path / "manifest.json").read_text())["files"]
    return sorted(str(path / n) for n, d in files.items()
                  if not (path / n).exists() or hashlib.sha256((path / n).read_bytes()).hexdigest() != d["sha256"])


# ------------------------------------------------------------------------------------------------
# labs/exercises/loss_scaler.py: LossScaler.update(overflow)



class ScalerNoHysteresis(_GoodScaler):
    def update(self, overflow):
        if overflow:
            self.scale = max(self.scale / self.factor, self.min_scale)
            self.last_overflow = self.iteration
            self.skipped += 1
        elif (self.iteration - self.last_overflow) % self.window == 0:
            self.scale *= self.factor
        self.iteration += 1


class ScalerWindowFromStart(_GoodScaler):
    def update(self, overflow):
        if overflow:
            if self.cur_hysteresis == 1 or self.hysteresis == 1:
                self.scale = max(self.scale / self.factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.skipped += 1
        elif (self.iteration + 1) % self.window == 0:
            self.scale *= self.factor
            self.cur_hysteresis = self.hysteresis
        self.iteration += 1


class ScalerNoFloor(_GoodScaler):
    def update(self, overflow):
        if overflow:
            if self.cur_hysteresis == 1 or self.hysteresis == 1:
                self.scale = self.scale / self.factor
            else:
                self.cur_hysteresis -= 1
            self.last_overflow = self.iteration
            self.skipped += 1
        elif (self.iteration - self.last_overflow) % self.window == 0:
            self.scale *= self.factor
            self.cur_hysteresis = self.hysteresis
        self.iteration += 1


class ScalerNeverGrows(_GoodScaler):
    def update(self, overflow):
        if overflow:
            if self.cur_hysteresis == 1 or self.hysteresis == 1:
                self.scale = max(self.scale / self.factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow = self.iteration
            self.skipped += 1
        self.iteration += 1


class ScalerForgetsSkipped(_GoodScaler):
    def update(self, overflow):
        skipped = self.skipped
        super().update(overflow)
        self.skipped = skipped


# ------------------------------------------------------------------------------------------------
# labs/exercises/offload.py: bytes_by_location(n_params, dp, stage, precision, offload)



def location_keeps_grad_shard(n_params, dp, stage, precision, offload):
    out = _good_location(n_params, dp, stage, precision, offload)
    if offload and stage >= 2:                 # the shard kept on the device until the step, none on the host
        shard = (2 if precision == "fp16" else 4) * n_params // dp        # bf16: reduced in fp32
        out = {"device": out["device"] + shard, "cpu": out["cpu"] - 4 * n_params // dp}
    return out


def location_host_grads_16bit(n_params, dp, stage, precision, offload):
    out = _good_location(n_params, dp, stage, precision, offload)
    if offload and precision != "fp32":
        out["cpu"] -= 2 * n_params // dp
    return out


def location_stage1_grads_moved(n_params, dp, stage, precision, offload):
    out = _good_location(n_params, dp, stage, precision, offload)
    if offload and stage == 1:
        out["device"] -= (2 if precision == "fp16" else 4) * n_params
    return out


def location_bf16_grads_16bit(n_params, dp, stage, precision, offload):
    out = _good_location(n_params, dp, stage, precision, offload)
    if precision == "bf16" and (not offload or stage == 1):    # gradients on the device counted in bf16, not fp32
        out["device"] -= 2 * n_params // (dp if stage >= 2 else 1)
    return out


def location_fp32_master_on_device(n_params, dp, stage, precision, offload):
    out = _good_location(n_params, dp, stage, precision, offload)
    if precision == "fp32" and not offload:
        out["device"] += 4 * n_params // dp
    return out


def location_fp32_offload_no_copy(n_params, dp, stage, precision, offload):
    out = _good_location(n_params, dp, stage, precision, offload)
    if precision == "fp32" and offload:
        out["cpu"] -= 4 * n_params // dp
    return out


def location_optimizer_not_sharded(n_params, dp, stage, precision, offload):
    out = _good_location(n_params, dp, stage, precision, offload)
    key = "cpu" if offload else "device"
    optimizer = out["cpu"] if offload else out["device"] - _good_location(n_params, dp, stage, precision, True)["device"]
    out[key] += (dp - 1) * optimizer
    return out


def location_grads_always_whole(n_params, dp, stage, precision, offload):
    return _good_location(n_params, dp, 1 if stage == 2 else stage, precision, offload)


# ------------------------------------------------------------------------------------------------
# labs/exercises/fsdp_shard.py: fsdp_local_shard(full, world, rank)


def fsdp_flat_shard(full, world, rank):
    flat = _padded(full.reshape(-1), world)
    k = flat.numel() // world
    return flat[rank * k:(rank + 1) * k]


def fsdp_tensor_split(full, world, rank):
    return torch.tensor_split(full, world, dim=0)[rank]


def fsdp_padded_rows(full, world, rank):
    rows = -(-full.shape[0] // world)
    padded = torch.cat([full, full.new_zeros((rows * world - full.shape[0], *full.shape[1:]))])
    return padded[rank * rows:(rank + 1) * rows]


def fsdp_last_dim(full, world, rank):
    return torch.tensor_split(full, world, dim=-1)[rank] if full.dim() > 1 else torch.chunk(full, world)[rank]


def fsdp_crashes_past_the_end(full, world, rank):
    return torch.chunk(full, world, dim=0)[rank]


# ------------------------------------------------------------------------------------------------
# labs/exercises/rank_grid.py: group_ranks(dp, tp, pp, dim)


def _groups_on(order, dp, tp, pp, dim):
    sizes = {"dp": dp, "tp": tp, "pp": pp}
    grid = torch.arange(dp * tp * pp).view(*[sizes[d] for d in order])
    return grid.movedim(order.index(dim), -1).reshape(-1, sizes[dim]).tolist()


def grid_dp_innermost(dp, tp, pp, dim):
    return _groups_on(("pp", "tp", "dp"), dp, tp, pp, dim)


def grid_pp_innermost(dp, tp, pp, dim):
    return _groups_on(("tp", "dp", "pp"), dp, tp, pp, dim)


def grid_one_group(dp, tp, pp, dim):
    return [list(range({"dp": dp, "tp": tp, "pp": pp}[dim]))]


def grid_unsorted(dp, tp, pp, dim):
    return [list(reversed(g)) for g in _groups_on(("pp", "dp", "tp"), dp, tp, pp, dim)]


# ------------------------------------------------------------------------------------------------
# labs/exercises/alpha_beta.py: collective_seconds(op, size_bytes, n, alpha, beta)

def _steps(op, n):
    return {"all_reduce": 2 * (n - 1), "reduce_scatter": n - 1, "all_gather": n - 1}[op]


def alpha_beta_whole_buffer(op, size, n, alpha, beta):
    if op == "send_recv":
        return alpha + size / beta
    return 0.0 if n == 1 else _steps(op, n) * alpha + _steps(op, n) // (n - 1) * size / beta


def alpha_beta_one_alpha(op, size, n, alpha, beta):
    if op == "send_recv":
        return alpha + size / beta
    k = _steps(op, n) // max(n - 1, 1)
    return 0.0 if n == 1 else k * alpha + k * (n - 1) / n * size / beta


def alpha_beta_all_reduce_one_pass(op, size, n, alpha, beta):
    if op == "send_recv":
        return alpha + size / beta
    return 0.0 if n == 1 else (n - 1) * alpha + (n - 1) / n * size / beta


def alpha_beta_single_rank_pays(op, size, n, alpha, beta):
    if op == "send_recv":
        return alpha + size / beta
    return _steps(op, max(n, 2)) * alpha + _steps(op, n) / n * size / beta


def alpha_beta_send_recv_as_ring(op, size, n, alpha, beta):
    if op == "send_recv":
        op = "all_gather"
    return 0.0 if n == 1 else _steps(op, n) * alpha + _steps(op, n) / n * size / beta

def slots_token_major(choices, n_experts, capacity):
    """Queues token by token (both of token 0's choices, then token 1's): not GShard's priority."""
    filled, out = [0] * n_experts, []
    for c in choices:
        out.append([filled[e] if filled[e] < capacity else None for e in c])
        for e in c:
            filled[e] += 1
    return out


def slots_one_too_many(choices, n_experts, capacity):
    """Keeps capacity + 1 tokens per expert (slot <= capacity)."""
    filled = [0] * n_experts
    out = [[None] * len(c) for c in choices]
    for j in range(max(len(c) for c in choices)):
        for t, c in enumerate(choices):
            if filled[c[j]] <= capacity:
                out[t][j] = filled[c[j]]
            filled[c[j]] += 1
    return out


def cp_contiguous(seq_len, cp_rank, cp):
    """Rank r holds the r-th contiguous slice: unbalanced under a causal mask."""
    n = seq_len // cp
    return list(range(cp_rank * n, (cp_rank + 1) * n))


def cp_shifted_pair(seq_len, cp_rank, cp):
    """Pairs chunk r with chunk r + cp instead of its mirror."""
    c = seq_len // (2 * cp)
    return list(range(cp_rank * c, (cp_rank + 1) * c)) + list(range((cp_rank + cp) * c, (cp_rank + cp + 1) * c))


def cp_mirror_first(seq_len, cp_rank, cp):
    """The mirror chunk first: the right tokens in the wrong order."""
    c = seq_len // (2 * cp)
    m = 2 * cp - 1 - cp_rank
    return list(range(m * c, (m + 1) * c)) + list(range(cp_rank * c, (cp_rank + 1) * c))
