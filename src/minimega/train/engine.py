"""The engine: one entry point that applies the parallelisms in a documented order and trains.

``initialize(model, config, mesh)`` takes the full reference model (identical on every rank: same
seed) and wraps it, in this order (the order of `Engine.__init__`):

    1. tensor parallel   (tp > 1)  new layers split attention heads and the MLP across the tp group; without
                                   tp a copy: the caller's model is never modified
    2. context parallel  (cp > 1)  ring or Ulysses attention over the cp group, global positions
    3. activation checkpointing    full or selective recomputation (`train.activation_checkpoint`)
    4. mixture of experts (ep)     keep this rank's experts; they sync over the edp group (`parallel.moe.zero`)
    5. pipeline split    (pp > 1)  keep this stage's chunks of blocks (TP never crosses a block, so splitting
                                   after TP keeps the vocab-parallel ends on the first and last stage)
    6. data parallel     per chunk over the dp group (dp × cp under cp: `mesh.grad_group`): DDP at zero_stage 0,
                         ZeRO 1-3 otherwise (16-bit working parameters over fp32 master shards), on `grad_sync`
    7. the optimizer     one `optimizer.Optimizers` over whatever steps the parameters

Any (dp, tp, pp, cp, ep) that `validate` accepts composes; ZeRO-1 under pp is the BLOOM-176B recipe.
``Engine.train_step((x, y))`` takes this dp rank's rows of the global batch (`minimega.data`), keeps this cp rank's
two chunks of each sequence (cp > 1), runs the micro-steps (each backward followed by ``finish_grad_sync()``),
clips, steps the optimizer and returns the global mean loss.
"""
from __future__ import annotations

import copy
import functools
from contextlib import ExitStack

import torch
import torch.nn as nn

from .. import clock, comm, zero
from ..config import TrainConfig
from ..mesh import Mesh
from ..model import GPT
from ..parallel import context as cp_
from ..parallel.data_parallel import DataParallel
from ..parallel.grad_sync import clip_grad_norm_
from ..parallel.rng import RNGStream
from ..parallel.tensor import full_like_param, apply_tensor_parallel
from ..pipeline import Pipeline
from ..run import measure
from .activation_checkpoint import apply_activation_checkpointing
from .observers import BeforeStep, CommPerStep, MemoryWatch, StepEvents, StepObservers
from .optimizer import Optimizers, TorchOptimizer, make_optimizer
from .validate import validate


def _moe():
    """The mixture-of-experts layer module, imported only where a model has experts (or ep > 1 is asked)."""
    from ..parallel.moe import layer
    return layer


def _is_moe(model: nn.Module) -> bool:
    return getattr(model, "moe_config", None) is not None

def _value(t: torch.Tensor) -> float:
    """A 0-d tensor's number; NaN for a meta tensor (`minimega dry-run` builds the engine without values)."""
    return float("nan") if t.is_meta else t.item()


def _tensor_parallel(model: GPT, config: TrainConfig, mesh: Mesh) -> GPT:
    """Step 1: new tensor-parallel layers built from ``model`` (tp > 1), else a copy: the caller's model is kept."""
    if config.tp == 1:
        return copy.deepcopy(model)
    if _is_moe(model):
        return _moe().apply_tensor_parallel(model, mesh)
    return apply_tensor_parallel(model, mesh, config.sequence_parallel)


def _experts(model: nn.Module, config: TrainConfig, mesh: Mesh):
    """Step 4: keep this rank's experts; their gradients sync over edp × cp (`mesh.expert_group`: the ranks
    holding the same experts) divided by dp·cp, ZeRO-1 over that group from stage 1 on; or None."""
    if not _is_moe(model):
        return None
    from ..parallel.moe.zero import ExpertGradSync, ExpertZero1
    _moe().shard_experts(model, mesh.ep_group, mesh.ep_rank)
    for layer in model.moe_layers():             # cp > 1: the aux loss's means pooled over the ring
        layer.cp_group = mesh.cp_group
    group = mesh.expert_group
    if config.zero_stage:         # each edp rank keeps Adam's states for 1/edp of the experts
        return ExpertZero1(model, group, group.rank_of(mesh.rank), mesh.dp_cp_size, mesh.ep_group,
                           functools.partial(make_optimizer, config=config))
    return ExpertGradSync(model, group, mesh.dp_cp_size, mesh.ep_group)


class Engine:
    """Trains one rank's part of the model; see the module docstring for the order of wrapping."""

    def __init__(self, model: GPT, config: TrainConfig, mesh: Mesh):
        validate(model.config, config, mesh.dims, getattr(model, "moe_config", None))
        self.model_config = _moe().MoEGPTConfig.of(model) if _is_moe(model) else model.config
        self._keys = list(model.state_dict())
        self.config, self.mesh = config, mesh
        # --8<-- [start:compose_order]
        model = _tensor_parallel(model, config, mesh).to(mesh.device)            # 1. (or a copy)
        if config.precision == "fp8":                                             # the blocks' linears in fp8
            from . import fp8
            fp8.convert(model)
        cp_.apply_context_parallel(model, mesh, config.cp_attention)              # 2. cp > 1
        apply_activation_checkpointing(model, config.activation_checkpointing, config.checkpoint_every)  # 3.
        self.experts = _experts(model, config, mesh)                              # 4. MoE only
        if config.pp > 1:                                                         # 5. + 6. per chunk
            self.pipeline = Pipeline(model, config, mesh, wrap=self._data_parallel)
            self.model, self.wrapper = self.pipeline.chunks, self.pipeline
            self.parts, self.sync_parts = list(self.pipeline.chunks), list(self.pipeline.wrapped)
        else:                                                                     # 6.
            self.pipeline, self.model, self.wrapper = None, model, self._data_parallel(model)
            self.parts, self.sync_parts = [model], [self.wrapper]
        self.optimizer = Optimizers(self._optimizer_parts())                      # 7.
        # --8<-- [end:compose_order]
        # `model`: this rank's model (its pipeline chunks under pp); `wrapper`: what trains it (DDP or ZeRO, or the
        # pipeline); `parts`: the modules holding this rank's parameters under model.py's names; `sync_parts`:
        # their dp wrappers (see grad_sync), `zero_stages` the same when they are ZeRO's.
        self.zero_stages = self.sync_parts if config.zero_stage else []
        self.memory_at_step: dict = {}
        self.peak_tracker = measure.PeakTracker(self._state_tensors)
        self.comm_log = comm.CommLog()
        self.losses: list[float] = []
        self.grad_norms: list[float] = []
        """The global gradient norm of each applied step (a step skipped by fp16 or a guard logs none)."""
        self.comm_per_step: list[float] = []
        self.timeline: list[dict] = clock.Recent()     # the newest events (a long run stays bounded)
        self.clock = clock.for_device(mesh.device)       # CUDA events on a GPU, resolved in report()
        for wrapper in self.sync_parts:                    # their timelines share it (see report)
            wrapper.clock = self.clock
        self.before_step: list = []
        """Callables ``f(engine)`` run on every rank once the gradients are final (synchronised, unscaled,
        clipped), just before the optimizer step: `full_grad_dict` may be called there (a collective)."""
        self.step = 0
        self.step_guard = None
        """Called as ``step_guard(step, loss, grad_norm)`` before each optimizer step; False skips the step."""
        self._memory = MemoryWatch()
        self.observers = StepObservers([StepEvents(), CommPerStep(), self._memory, BeforeStep()])
        """What watches each step (`train.observers`); append your own (``notify(engine, point, **info)``)."""
        self._saver = None                                # `checkpoint.AsyncSaver`, from the first async save

    def _data_parallel(self, module):
        """Step 6 for one chunk: ZeRO (it shards the optimizer itself and steps it) or DDP."""
        config, mesh = self.config, self.mesh
        if config.zero_stage:
            return zero.wrap(module, config, mesh.grad_group, mesh.dp_cp_rank, self._make_optimizer,
                             model_parallel=(mesh.tp_group, mesh.pp_group))
        return DataParallel(module, mesh.grad_group, bucket_mb=config.bucket_mb, config=config,
                            model_parallel=(mesh.tp_group, mesh.pp_group))

    def _make_optimizer(self, params) -> torch.optim.Optimizer:
        return make_optimizer(params, self.config)

    def _optimizer_parts(self) -> list:
        """Step 7: what steps the parameters. ZeRO wrappers step their own shards (and the experts' ZeRO-1 its
        own); under DDP one torch optimizer steps everything this rank holds, experts included."""
        if not self.config.zero_stage:
            return [TorchOptimizer(self.model, self.config, self.sync_parts)]
        return list(self.sync_parts) + ([self.experts] if self.experts is not None else [])

    def _state_tensors(self) -> dict:
        """The model states by category, for the peak tracker (`measure.state_tensors`)."""
        torch_opt = None if self.config.zero_stage else self.optimizer.parts[0].optimizer
        return measure.state_tensors(self.sync_parts, torch_opt)

    def train_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        """One optimizer step on this dp rank's rows; returns the mean loss over the global batch."""
        # --8<-- [start:train_step]
        x, y = (self._context_shard(t) for t in batch)
        self.wrapper.train()
        # --8<-- [start:step_body]
        with self.observers.step(self) as observe:          # events, comm log, memory (train/observers.py)
            if self.pipeline is not None:                   # the micro-steps, in the schedule's order
                total = self.pipeline.forward_backward(x, y, self.step)
            else:
                total = sum(self._micro_step(xm, ym, i) for i, (xm, ym) in enumerate(self._micro_batches(x, y)))
            observe.notify(self, "optimizer_start")
            norm = self._clip()
            loss = functools.cache(lambda: self._loss_metric(total))     # a collective, taken once when asked
            stepped = observe.allow_step(self, loss, norm) and self.optimizer.step()   # False: skipped
            self._after_optimizer_step(stepped)
            observe.notify(self, "optimizer_step_end")
            self.optimizer.zero_grad(set_to_none=True)
        # --8<-- [end:step_body]
        self.losses.append(loss())
        if stepped and norm is not None:
            self.grad_norms.append(norm)
        self.step += 1
        return self.losses[-1]
        # --8<-- [end:train_step]

    # --8<-- [start:micro_step]
    def _micro_step(self, x: torch.Tensor, y: torch.Tensor, i: int) -> torch.Tensor:
        """Forward and backward of micro-batch i, then the end of its gradient sync; returns its loss."""
        ga = self.config.gradient_accumulation_steps
        with self._accumulating(last=i == ga - 1):
            self.observers.notify(self, "forward_start", micro=i)
            _, loss = self.wrapper(x, y)
            self.observers.notify(self, "backward_start", micro=i)
            self.wrapper.scale_loss(loss / ga).backward()          # fp16: times the loss scale
            self.observers.notify(self, "backward_end", micro=i)
            self.wrapper.finish_grad_sync()                        # the end of this backward (see grad_sync)
            if self.experts is not None:
                self.experts.finish_grad_sync()
        return loss.detach().float()                         # summed in fp32, whatever the compute dtype
    # --8<-- [end:micro_step]

    def _accumulating(self, last: bool) -> ExitStack:
        """DDP and ZeRO-1 accumulate locally and reduce the sum once; ZeRO-2/3 reduce every micro-step; the experts
        (ZeRO-1 at most: full gradients kept) once, after the last."""
        stack = ExitStack()
        if not (last or self.wrapper.reduce_every_micro_step):
            stack.enter_context(self.wrapper.no_sync())
        if self.experts is not None and not last:
            stack.enter_context(self.experts.no_sync())
        return stack

    def _micro_batches(self, x: torch.Tensor, y: torch.Tensor):
        ga = self.config.gradient_accumulation_steps
        if x.shape[0] % ga:
            raise ValueError(f"this rank's {x.shape[0]} rows do not split into gradient_accumulation_steps={ga}")
        return zip(x.chunk(ga), y.chunk(ga))

    def _after_optimizer_step(self, stepped: bool) -> None:
        """What the step itself changes besides the weights: fp8's delayed scales, the MoE routing biases."""
        if stepped and self.config.precision == "fp8":
            from . import fp8
            fp8.update_scales(self.parts)            # delayed scaling: next step's scales
        if self.experts is not None:
            self.experts.after_step(self.mesh.grad_group)   # MoE routing biases follow the load (dp·cp)

    def _loss_metric(self, total: torch.Tensor) -> float:
        """The global mean loss. Every dp·cp rank averaged the same number of tokens: the mean of their means."""
        if self.pipeline is not None:
            total = comm.all_reduce(total.clone(), self.mesh.pp_group)    # the last stage's loss, to every stage
        ga = self.config.gradient_accumulation_steps
        return _value(comm.all_reduce_mean(total / ga, self.mesh.grad_group))

    def grad_norm(self) -> float:
        """The global gradient norm (a collective over the groups that hold different elements; no clipping)."""
        return clip_grad_norm_(self.sync_parts, self.mesh, float("inf"),
                               own=[self.experts] if self.experts is not None else [])

    def _context_shard(self, t: torch.Tensor) -> torch.Tensor:
        """(B, T) rows of this dp rank → (B, T/cp) on the device: this cp rank's chunks r and 2cp-1-r."""
        t = t.to(self.mesh.device)
        return cp_.shard_sequence(t, self.mesh.cp_rank, self.mesh.cp_size) if self.mesh.cp_size > 1 else t

    def _clip(self) -> float | None:
        """Clip by the global gradient norm, whatever the layout (see `grad_sync.clip_grad_norm_`)."""
        if not self.config.gradient_clipping:
            return None
        return clip_grad_norm_(self.sync_parts, self.mesh, self.config.gradient_clipping,
                               own=[self.experts] if self.experts is not None else [])

    @torch.no_grad()
    def eval_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        """Mean loss over the global batch, without touching gradients or optimizer state."""
        x, y = (self._context_shard(t) for t in batch)
        self.wrapper.eval()
        if self.pipeline is not None:
            loss = comm.all_reduce(self.pipeline.forward_backward(x, y, self.step, train=False), self.mesh.pp_group)
        else:
            _, loss = self.wrapper(x, y)
        return _value(comm.all_reduce_mean(loss.detach().clone(), self.mesh.grad_group))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Consolidated fp32 weights with `model.py`'s keys, on every rank (a collective under ZeRO, TP and PP).

        ZeRO gathers each part's shards over dp, TP layers gather their slices over tp, and the stages'
        disjoint parts are merged over pp.
        """
        local = {}
        for part, wrapper in self.holders():
            state = wrapper.full_state_dict() if self.config.zero_stage else part.state_dict()
            local.update({k: self._full(part, k, v).float() for k, v in state.items()})
        if self.experts is not None:          # every expert whole: gathered over ep
            local.update(self.experts.full_state_dict())
        return self._merge_stages(local)

    def full_grad_dict(self) -> dict[str, torch.Tensor]:
        """The fp32 gradients the optimizer step is about to apply, consolidated as `full_state_dict` is (a
        collective); valid only inside a `before_step` callable. A mixture of experts' experts: gathered over ep."""
        local = {}
        for part, wrapper in self.holders():
            grads = wrapper.full_grad_dict() if self.config.zero_stage else {
                n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in part.named_parameters()}
            local.update({k: self._full(part, k, v).float() for k, v in grads.items()})
        if self.experts is not None:
            local.update(self.experts.full_grad_dict())
        return self._merge_stages(local)

    def holders(self):
        """(part, its ZeRO wrapper or None) for each module holding this rank's parameters."""
        return zip(self.parts, self.zero_stages or [None] * len(self.parts))

    def _full(self, part, name: str, t: torch.Tensor) -> torch.Tensor:
        """``t``, shaped like parameter ``name``'s local slice, gathered over tp to full shape, on the CPU."""
        return full_like_param(part, name, t.detach().to(self.mesh.device)).detach().cpu().clone()

    def _merge_stages(self, local: dict) -> dict:
        """Every stage's disjoint entries, on every rank, in `model.py`'s order where the keys are its."""
        if self.pipeline is not None:
            local = {k: v for part in comm.all_gather_object(local, self.mesh.pp_group) for k, v in part.items()}
        return {k: local[k] for k in self._keys if k in local}

    def track_peak(self, steps: int = 1) -> None:
        """Sample the peak bytes by category (``report()["memory_peak"]``) in the next ``steps`` steps too."""
        self._memory.asked = max(self._memory.asked, steps)

    def memory(self) -> dict:
        """Bytes this rank holds right now, by category."""
        return self.optimizer.memory()

    def report(self) -> dict:
        """Everything a lab or test wants to plot: losses, bytes by category, communication, timeline."""
        return {
            "rank": self.mesh.rank,
            "layout": {"dp": self.mesh.dp_size, "tp": self.mesh.tp_size, "pp": self.mesh.pp_size,
                       "cp": self.mesh.cp_size, "ep": self.mesh.ep_size, "zero_stage": self.config.zero_stage},
            "losses": list(self.losses),
            "grad_norms": list(self.grad_norms),
            "memory": self.memory(),
            "memory_at_step": dict(self.memory_at_step),
            "memory_peak": self.peak_tracker.report(),
            "comm": self.comm_log.summary(),
            "comm_per_step": list(self.comm_per_step),
            "comm_events": self.comm_log.events(),
            "timeline": self.clock.resolve(self.timeline + self.wrapper.timeline),
            **({"pipeline": self.pipeline.bubble()} if self.pipeline is not None else {}),
            **({"moe": self.experts.counts()} if self.experts is not None else {}),
        }

    # ---- checkpoints (see minimega.checkpoint): what the layout-free state needs from the engine ------

    def layout(self) -> dict:
        return {"world": self.mesh.world_size, "dp": self.mesh.dp_size, "tp": self.mesh.tp_size,
                "pp": self.mesh.pp_size, "zero_stage": self.config.zero_stage,
                **({"ep": self.mesh.ep_size} if self.experts is not None else {}),
                **({"cp": self.mesh.cp_size} if self.mesh.cp_size > 1 else {})}

    def rng_state(self) -> dict[str, torch.Tensor]:
        """This rank's random states as uint8 tensors: the default CPU generator, the tp dropout stream
        (`rng.RNGStream`, under tp), each CUDA device's generator."""
        out = {"torch": torch.get_rng_state()}
        if (stream := self._tp_stream()) is not None:
            out["tp_stream"] = stream.state[0]
            if stream.state[1] is not None:
                out["tp_stream_cuda"] = stream.state[1]
        if torch.cuda.is_available():
            out.update({f"cuda{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
        return out

    def set_rng_state(self, state: dict[str, torch.Tensor]) -> None:
        torch.set_rng_state(state["torch"])
        if (stream := self._tp_stream()) is not None and "tp_stream" in state:
            stream.state = (state["tp_stream"], state.get("tp_stream_cuda", stream.state[1]))
        cuda = [state[f"cuda{i}"] for i in range(torch.cuda.device_count()) if f"cuda{i}" in state]
        if cuda and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(cuda)

    def _tp_stream(self):
        """The tp dropout stream this rank's parts draw from (one per rank), or None without tp."""
        for part in self.parts:
            for m in part.modules():
                if isinstance(getattr(m, "rng", None), RNGStream):
                    return m.rng
        return None

    def _scalers(self) -> list:
        return [w.scaler for w in self.sync_parts if getattr(w, "scaler", None) is not None]

    def scaler_state(self) -> dict | None:
        """The fp16 loss scaler's state (identical on every rank: overflows are agreed on), or None."""
        scalers = self._scalers()
        return scalers[0].state_dict() if scalers else None

    def load_scaler_state(self, state: dict) -> None:
        for scaler in self._scalers():
            scaler.load_state_dict(state)

    def save(self, directory, keep: int = 3):
        """Atomic sharded checkpoint of everything needed to resume (see `minimega.checkpoint`). With
        ``config.async_save`` it returns once this rank's state is copied; the files are written while the next
        steps train (`checkpoint.async_save`), and the next `save`, `load` or `wait_for_save` waits for them."""
        from .. import checkpoint
        stats: dict = {}
        self.wait_for_save()                                # at most one save in flight
        self.observers.notify(self, "save_start")
        if self.config.async_save:
            self._saver = self._saver or checkpoint.AsyncSaver(self.mesh)
            path = self._saver.start(self, directory, keep=keep)
        else:
            path = checkpoint.save(self, directory, keep=keep, stats=stats)
        self.observers.notify(self, "save_end", bytes=stats.get("bytes_written", 0))
        return path

    def wait_for_save(self) -> None:
        """Block until an asynchronous save in flight is committed on every rank (nothing to do without one)."""
        if self._saver is not None:
            self._saver.wait()

    def load(self, directory) -> int:
        """Resume from a checkpoint saved under any layout; returns its step."""
        from .. import checkpoint
        self.wait_for_save()
        return checkpoint.load(self, directory)



def initialize(model: GPT, config: TrainConfig, mesh: Mesh) -> Engine:
    """Wrap the full reference model for this rank's place in the mesh (see the module docstring)."""
    return Engine(model, config, mesh)
