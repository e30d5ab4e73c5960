"""Check cells of the labs: parity tests of your exercise code against minimega, with the fix in words.

A check runs your function where the reference runs (real models, real optimizers, real gloo ranks),
compares the two, and either prints one line starting with ✓ or raises `ExerciseError` whose message
lists every problem found, each with what to change.

``exercise(name)`` imports ``labs/exercises/<name>.py`` — or ``labs/solutions/<name>.py`` when the
environment variable ``MINIMEGA_LAB_SOLUTIONS=1`` is set (the test suite runs the labs that way).
It reloads the module, so edits you make while the kernel runs are picked up.
"""
from __future__ import annotations

import importlib
import os
import re
from functools import lru_cache

import torch
import torch.distributed as dist

import minimega as mm
from minimega import comm, data
from minimega.run import measure
from minimega.train.engine import make_optimizer

SOLUTIONS_ENV = "MINIMEGA_LAB_SOLUTIONS"


class ExerciseError(AssertionError):
    """Your exercise does not match minimega yet; the message says where and what to change.

    ``detail``: the traceback of the rank where your code raised, if it did (shown after the explanation).
    """

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail

    def _render_traceback_(self) -> list[str]:
        """What Jupyter shows when a check cell fails (IPython's hook): the explanation first, once.

        Not the frames of checks.py and minimega.run.launch the check ran through, nor the rank's exception
        chained in front of the explanation; the rank's traceback, when there is one, comes after it.
        """
        lines = [f"{type(self).__name__}: {self}"]
        if self.detail:
            lines += ["", "Where your code raised (for reference):", self.detail.rstrip()]
        return lines


def exercise(name: str):
    """The module holding exercise ``name``: yours, or the reference when MINIMEGA_LAB_SOLUTIONS=1."""
    package = "solutions" if os.environ.get(SOLUTIONS_ENV, "") not in ("", "0") else "exercises"
    return importlib.reload(importlib.import_module(f"{package}.{name}"))


MAX_PROBLEMS = 8
"""A check lists at most this many distinct problems (the rest are counted)."""


def _fail(what: str, problems: list[str], detail: str = "") -> None:
    """Raise the `ExerciseError` listing `problems`, each explanation once; never chained to the error that
    led here (a rank's exception is passed as ``detail`` instead, and shown after the explanation)."""
    merged = _merge(problems)
    head = f"{what}: {len(merged)} problem{'s' if len(merged) > 1 else ''}"
    lines = [head] + [f"  - {p}" for p in merged[:MAX_PROBLEMS]]
    if len(merged) > MAX_PROBLEMS:
        lines.append(f"  ... and {len(merged) - MAX_PROBLEMS} more; fix these first")
    raise ExerciseError("\n".join(lines), detail) from None


def _merge(problems: list[str]) -> list[str]:
    """One entry per distinct explanation.

    Problems read ``"<where>: <what to change>"``. A check that runs on several ranks and several units finds
    the same mistake at each (3 ranks x 3 units: 9 times); it is said once, followed by where it was seen.
    """
    groups: dict[str, list[str]] = {}
    for problem in dict.fromkeys(problems):
        where, sep, what = problem.partition(": ")
        groups.setdefault(what if sep else problem, []).append(where if sep else "")
    merged = []
    for what, wheres in groups.items():
        if len(wheres) == 1:
            merged.append(f"{wheres[0]}: {what}" if wheres[0] else what)
        else:
            merged.append(f"{what}\n      (seen at {_places(wheres)})")
    return merged


def _places(wheres: list[str]) -> str:
    """``"unit A, rank 0"``, ``"unit A, rank 1"``, ``"unit B, rank 0"`` … as ``"ranks 0, 1; unit A; unit B"``."""
    parsed = [re.fullmatch(r"(?:(.*), )?rank (\d+)", w) for w in wheres]
    if not all(parsed):
        return "; ".join(wheres)
    ranks = sorted({int(m.group(2)) for m in parsed})
    rest = [m.group(1) for m in parsed if m.group(1)]
    return "; ".join([f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}",
                      *dict.fromkeys(rest)])


def _not_done(exc: BaseException, where: str) -> str | None:
    if isinstance(exc, NotImplementedError) or type(exc).__name__ == "NotImplementedError":
        return (f"not done yet: {where} still raises NotImplementedError; replace the `raise` line "
                "with your code (or set MINIMEGA_LAB_SOLUTIONS=1 to see the reference run)")
    return None


# ------------------------------------------------------------------------------------------------
# Lab 01: bytes of the model states.

# (model, optimizer) runs the check measures: SGD and both Adams, on models with different tensor counts.
_MEMORY_RUNS = [("tiny", mm.GPTConfig.tiny(), "sgd"), ("tiny", mm.GPTConfig.tiny(), "adam"),
                ("2-layer tiny with biases", mm.GPTConfig.tiny(bias=True, n_layer=2), "adamw")]


def measured_model_state_bytes(model_config: mm.GPTConfig, optimizer: str) -> tuple[tuple[int, ...], dict]:
    """One real fp32 training step; the parameter sizes and the bytes `minimega.run.measure` counts afterwards."""
    torch.manual_seed(0)
    model = mm.GPT(model_config)
    opt = make_optimizer(model.parameters(), mm.TrainConfig(optimizer=optimizer))
    x, y = data.global_batch(0, 2, 16)
    model(x, y)[1].backward()
    opt.step()
    return tuple(p.numel() for p in model.parameters()), measure.model_state_bytes(model, opt)


def _measure_runs(runs: list[tuple]) -> list[tuple]:
    return [measured_model_state_bytes(model_config, optimizer) for _, model_config, optimizer in runs]


@lru_cache(maxsize=1)
def _memory_oracle() -> list[tuple]:
    """The measured runs, in one fresh rank (a clean process, with torch's optimizer imports preloaded)."""
    return mm.launch(_measure_runs, 1, _MEMORY_RUNS, timeout=120)[0]


def _memory_problem(key: str, got, want: int, numels: list[int], optimizer: str) -> str | None:
    psi, tensors = sum(numels), len(numels)
    if got == want:
        return None
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        return f"{key}: got {got!r}; return a number of bytes (an int)"
    if want and got * 4 == want:
        return (f"{key}: {got:,} is the element count, not bytes: float32 stores 4 bytes per element")
    if want and got == want / 2:
        return f"{key}: {got:,} is half the measured {want:,}: 2 bytes per element is bf16/fp16, these runs are fp32"
    if key == "grads" and got == 0:
        return "grads: 0, but after backward every trainable parameter holds a .grad the size of the parameter"
    if key == "optimizer_states":
        if optimizer == "sgd":
            return (f"optimizer_states for sgd: {got:,}, measured 0: torch.optim.SGD without momentum keeps no "
                    "state between steps")
        if got == 0:
            return f"optimizer_states for {optimizer}: 0, but Adam keeps two running moments for every element"
        if got == 2 * 4 * psi:
            return (f"optimizer_states for {optimizer}: {got:,} is {4 * tensors:,} bytes short: besides exp_avg and "
                    f"exp_avg_sq, torch's Adam keeps a `step` counter per parameter *tensor* (a float32 scalar, "
                    f"4 bytes × {tensors} tensors here)")
        if got in (4 * psi, 4 * psi + 4 * tensors):
            return (f"optimizer_states for {optimizer}: you counted one moment; Adam keeps two per element "
                    "(exp_avg and exp_avg_sq, 4 bytes each) plus a step counter per tensor")
        if got in (12 * psi, 12 * psi + 4 * tensors):
            return (f"optimizer_states for {optimizer}: 12 bytes per element is the ZeRO paper's mixed-precision K "
                    "(an fp32 master copy + two moments); here the parameters are already fp32, so there is "
                    "no separate master copy")
    return f"{key} for {optimizer}: got {got:,} bytes, measured {want:,} (Ψ = {psi:,} elements in {tensors} tensors)"


def check_model_state_bytes(fn) -> None:
    """Compare ``fn(param_numels, optimizer)`` with measured bytes after one real step, for several models."""
    try:
        fn([1], "adam")
    except Exception as exc:  # noqa: BLE001 - the learner's code: report, never crash the check
        if (msg := _not_done(exc, "model_state_bytes")):
            _fail("model_state_bytes", [msg])
    problems = []
    for (label, _, optimizer), (numels, measured) in zip(_MEMORY_RUNS, _memory_oracle()):
        # The exercise counts Adam's per-tensor `step` counters with its states; `measure` lists them apart.
        want = {"params": measured["params"], "grads": measured["grads"],
                "optimizer_states": measured["optimizer_states"] + measured.get("optimizer_step_counters", 0)}
        try:
            got = fn(list(numels), optimizer)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"model '{label}', {optimizer}: raised {type(exc).__name__}: {exc}")
            continue
        if not isinstance(got, dict) or set(got) != set(want):
            problems.append(f"returned {got!r}; return a dict with exactly the keys {sorted(want)}")
            continue
        for key in ("params", "grads", "optimizer_states"):
            if (msg := _memory_problem(key, got[key], want[key], numels, optimizer)):
                problems.append(f"model '{label}': {msg}")
    if problems:
        _fail("model_state_bytes", problems)
    print("✓ model_state_bytes matches the bytes measured after a real step: "
          + "; ".join(f"{label} with {optimizer}" for label, _, optimizer in _MEMORY_RUNS))


# ------------------------------------------------------------------------------------------------
# Lab 02: an all-reduce made of a reduce-scatter and an all-gather.

RING_SHAPES = [(6, 4), (7,), (2, 5)]      # divisible by the group size, and not
_SAME_COLLECTIVES = "every rank must call the same collectives, in the same order, with the same sizes"


def _ring_worker(fn, shapes: list[tuple]) -> list[dict]:
    """On each rank: run ``fn`` and `comm.all_reduce` on the same inputs; return both and fn's CommLog."""
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    results = []
    for i, shape in enumerate(shapes):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(1000 * i + mesh.rank))
        expected = comm.all_reduce(x.clone(), mesh.dp_group)
        log = comm.CommLog()
        with log:
            got = fn(x.clone(), mesh.dp_group)
        got = got.detach().clone() if isinstance(got, torch.Tensor) else repr(got)
        results.append({"shape": shape, "input": x, "expected": expected, "got": got, "events": log.events()})
    return results


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def _ring_value_problem(case: dict, rank: int, n: int) -> str | None:
    x, want, got = case["input"], case["expected"], case["got"]
    where = f"shape {case['shape']}, rank {rank}"
    if not isinstance(got, torch.Tensor):
        return f"{where}: returned {got} instead of a tensor: return the summed tensor"
    if got.shape != x.shape:
        return (f"{where}: returned shape {tuple(got.shape)} for an input of shape {tuple(x.shape)}: drop the "
                "padding and reshape the result to the input's shape")
    if _close(got, want):
        return None
    if _close(got, x):
        return f"{where}: the result equals this rank's own input: nothing was summed across ranks"
    if _close(got, want / n):
        return (f"{where}: the result is the mean, not the sum: an all-reduce sums; dividing by n is the "
                "caller's job (DDP divides afterwards)")
    size = x.numel()
    k = -(-size // n)
    own = slice(rank * k, min((rank + 1) * k, size))
    flat_got, flat_want = got.reshape(-1), want.reshape(-1)
    if own.start < size and _close(flat_got[own], flat_want[own]):
        return (f"{where}: only this rank's own chunk (elements {own.start}..{own.stop - 1}) holds the sum: "
                "phase 2, the all-gather of the summed shard, is missing or gathers the wrong tensor")
    bad = int((flat_got - flat_want).abs().argmax())
    return (f"{where}: differs from comm.all_reduce by up to {(flat_got - flat_want).abs().max():.3g} "
            f"(flat element {bad}: got {flat_got[bad]:.4f}, expected {flat_want[bad]:.4f})")


def _ring_traffic_problem(case: dict, n: int) -> str | None:
    ops = [e["op"] for e in case["events"]]
    if "all_reduce" in ops:
        return "calls comm.all_reduce: build the all-reduce from comm.reduce_scatter followed by comm.all_gather"
    if ops != ["reduce_scatter", "all_gather"]:
        return (f"shape {case['shape']}: issued {ops or 'no collective'}; a ring all-reduce is exactly one "
                "comm.reduce_scatter then one comm.all_gather")
    padded = 4 * n * -(-case["input"].numel() // n)
    sent, want = sum(e["sent_bytes"] for e in case["events"]), 2 * (n - 1) / n * padded
    if abs(sent - want) > 1e-6:
        return (f"shape {case['shape']}: sends {sent:g} bytes per rank; a ring all-reduce of the padded buffer "
                f"({padded} bytes) sends 2(n-1)/n · {padded} = {want:g}: pad to the next multiple of n only")
    return None


def check_ring_all_reduce(fn, world: int = 3, timeout: float = 60) -> None:
    """Run ``fn(tensor, group)`` on ``world`` gloo ranks; compare with `comm.all_reduce` and the ring's bytes."""
    try:
        fn(torch.ones(3), comm.Group(None, [0], "dp"))         # one rank: no process group needed
    except Exception as exc:  # noqa: BLE001
        if (msg := _not_done(exc, "ring_all_reduce")):
            _fail("ring_all_reduce", [msg])
    try:
        results = mm.launch(_ring_worker, world, fn, RING_SHAPES, timeout=timeout)
    except mm.LaunchTimeout:
        _fail("ring_all_reduce", [f"the {world} ranks hung for {timeout:g} s: {_SAME_COLLECTIVES}"])
    except mm.WorkerError as exc:
        head = str(exc).splitlines()[0]
        if "elements, expected" in head:
            head += ": pad the flat tensor with zeros to a multiple of group.size before the reduce-scatter"
        elif not exc.exc_type:       # gloo aborts a rank whose peers sent messages of another size
            head += f" (gloo aborts a rank when its peers run different collectives): {_SAME_COLLECTIVES}"
        _fail("ring_all_reduce", [head], exc.remote_traceback)
    problems = [p for rank, cases in enumerate(results) for case in cases
                for p in [_ring_value_problem(case, rank, world)] if p]
    problems += [p for case in results[0] for p in [_ring_traffic_problem(case, world)] if p]
    if problems:
        _fail("ring_all_reduce", problems)
    print(f"✓ ring_all_reduce equals comm.all_reduce on {world} ranks for shapes {RING_SHAPES}, "
          f"and sends 2(n-1)/n · S bytes per rank, like the ring")


# ------------------------------------------------------------------------------------------------
# Lab 07: Megatron's f and g around a tensor-parallel MLP.

_MLP = dict(batch=2, seq=3, d=8, hidden=16)


def _tp_mlp_worker(f, g) -> dict:
    """Every rank: the unsplit MLP, this rank's shard of it wrapped in ``f``/``g``, and the no-communication part."""
    tp = dist.get_world_size()
    mesh = mm.init_mesh(mm.ParallelDims(tp=tp))
    group, r = mesh.tp_group, mesh.tp_rank
    torch.manual_seed(0)
    fc, proj = torch.nn.Linear(_MLP["d"], _MLP["hidden"]), torch.nn.Linear(_MLP["hidden"], _MLP["d"], bias=False)
    x = torch.randn(_MLP["batch"], _MLP["seq"], _MLP["d"])                 # (B, T, D), same on every rank
    upstream = torch.randn_like(x)                                         # dL/dy of L = (y · upstream).sum()
    gelu = torch.nn.functional.gelu

    x_ref = x.clone().requires_grad_()
    y_ref = proj(gelu(fc(x_ref)))
    (y_ref * upstream).sum().backward()

    w1 = fc.weight.detach().chunk(tp, 0)[r].clone().requires_grad_()     # (F/tp, D): rows split over tp
    b1 = fc.bias.detach().chunk(tp, 0)[r].clone().requires_grad_()       # (F/tp,)
    w2 = proj.weight.detach().chunk(tp, 1)[r].clone().requires_grad_()   # (D, F/tp): columns split over tp

    def local(inp):
        return torch.nn.functional.linear(gelu(torch.nn.functional.linear(inp, w1, b1)), w2)

    x_alone = x.clone().requires_grad_()                                   # this rank's term, no communication
    y_alone = local(x_alone)
    x_alone_grad, = torch.autograd.grad((y_alone * upstream).sum(), x_alone)

    forward_log, backward_log = comm.CommLog(), comm.CommLog()
    x_tp = x.clone().requires_grad_()
    with forward_log:
        y = g.apply(local(f.apply(x_tp, group)), group)
    with backward_log:
        (y * upstream).sum().backward()
    grad = lambda t: None if t.grad is None else t.grad.detach().clone()    # noqa: E731
    return {
        "y": y.detach(), "y_ref": y_ref.detach(), "y_alone": y_alone.detach(),
        "x_grad": grad(x_tp), "x_grad_ref": x_ref.grad, "x_grad_alone": x_alone_grad,
        "w1_grad": grad(w1), "w1_grad_ref": fc.weight.grad.chunk(tp, 0)[r].clone(),
        "w2_grad": grad(w2), "w2_grad_ref": proj.weight.grad.chunk(tp, 1)[r].clone(),
        "forward_ops": [e["op"] for e in forward_log.events()],
        "backward_ops": [e["op"] for e in backward_log.events()],
    }


def _tp_problems(res: dict, rank: int, tp: int) -> list[str]:
    where, problems = f"rank {rank}", []
    y, ref = res["y"], res["y_ref"]
    if not _close(y, ref):
        if _close(y, res["y_alone"]):
            problems.append(f"{where}: the output is only this rank's partial sum X_r A_r: g's forward must "
                            "all-reduce (sum) it over the tp group")
        elif _close(y, ref / tp):
            problems.append(f"{where}: the output is the mean of the partial sums: g's forward must sum, not average")
        else:
            problems.append(f"{where}: the output differs from the unsplit MLP by up to {(y - ref).abs().max():.3g}")
        return problems                                                     # gradients follow from a wrong output
    x_grad, x_ref = res["x_grad"], res["x_grad_ref"]
    if x_grad is None:
        problems.append(f"{where}: x got no gradient: f's backward must return (gradient, None)")
    elif not _close(x_grad, x_ref):
        if _close(x_grad, res["x_grad_alone"]):
            problems.append(f"{where}: x's gradient is only this rank's term Ȳ A_r^T: f's backward must all-reduce "
                            "(sum) it over the tp group")
        elif _close(x_grad, tp * x_ref) or _close(x_grad, tp * res["x_grad_alone"]):
            problems.append(f"{where}: x's gradient is tp = {tp} times too large: g's backward must be the identity "
                            "(its incoming gradient is already the same on every rank)")
        elif _close(x_grad, x_ref / tp):
            problems.append(f"{where}: x's gradient is averaged: f's backward must sum over the tp group")
        else:
            problems.append(f"{where}: x's gradient differs from the unsplit MLP by up to "
                            f"{(x_grad - x_ref).abs().max():.3g}")
    for name in ("w1", "w2"):
        got, want = res[f"{name}_grad"], res[f"{name}_grad_ref"]
        if got is None:
            problems.append(f"{where}: {name} got no gradient")
        elif not _close(got, want):
            hint = (": g's backward must be the identity (it passes the replicated gradient on unchanged)"
                    if _close(got, tp * want) else "")
            problems.append(f"{where}: the gradient of this rank's shard of {name} is wrong{hint}")
    if res["forward_ops"] != ["all_reduce"]:
        problems.append(f"the forward issued {res['forward_ops'] or 'no collective'}: exactly one all-reduce "
                        "belongs there (g's); f's forward is the identity")
    if res["backward_ops"] != ["all_reduce"]:
        problems.append(f"the backward issued {res['backward_ops'] or 'no collective'}: exactly one all-reduce "
                        "belongs there (f's); g's backward is the identity")
    return problems


def check_tp_regions(f, g, world: int = 2, timeout: float = 60) -> None:
    """Run a tensor-parallel MLP wrapped in ``f`` (CopyToTP) and ``g`` (ReduceFromTP) on ``world`` gloo ranks."""
    one = comm.Group(None, [0], "tp")
    for fn, name in ((f, "CopyToTP"), (g, "ReduceFromTP")):
        try:
            x = torch.ones(2, requires_grad=True)
            fn.apply(x, one).sum().backward()
        except Exception as exc:  # noqa: BLE001
            if (msg := _not_done(exc, name)):
                _fail("tp_regions", [msg])
    try:
        results = mm.launch(_tp_mlp_worker, world, f, g, timeout=timeout)
    except mm.LaunchTimeout:
        _fail("tp_regions", [f"the {world} ranks hung for {timeout:g} s: {_SAME_COLLECTIVES}"])
    except mm.WorkerError as exc:
        _fail("tp_regions", [str(exc).splitlines()[0]], exc.remote_traceback)
    problems = [p for rank, res in enumerate(results) for p in _tp_problems(res, rank, world)]
    if problems:
        _fail("tp_regions", problems)
    print(f"✓ f and g: the MLP split over {world} ranks gives the unsplit output and gradients, "
          "with one all-reduce forward (g) and one backward (f)")


# ------------------------------------------------------------------------------------------------
# Lab 06: a checkpoint that keeps only the block's input.

class _Apply(torch.nn.Module):
    """``fn.apply(block, x)`` as a module, so `saved_activation_bytes` can measure it."""

    def __init__(self, fn, block):
        super().__init__()
        self.fn, self.block = fn, block

    def forward(self, x):
        return self.fn.apply(self.block, x)


def _block_grads(block, run, x, upstream, seed) -> tuple:
    block.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    torch.manual_seed(seed)
    y = run(x)
    (y * upstream).sum().backward()
    return y.detach(), x.grad, {n: None if p.grad is None else p.grad.clone() for n, p in block.named_parameters()}


_CHECKPOINT_HINTS = {
    "incorrect number of gradients": "backward must return one gradient per forward input: (None, x's gradient), "
                                     "None for fn",
    "does not require grad": "recompute fn under torch.enable_grad() on x.detach().requires_grad_(): autograd "
                             "is off inside backward",
}


def check_checkpoint(fn) -> None:
    """Compare ``fn.apply(block, x)`` with the plain block (outputs, gradients, with and without dropout) and
    count the bytes it keeps for backward against `minimega.train.activation_checkpoint.checkpoint`."""
    from minimega.train.activation_checkpoint import _Checkpoint, saved_activation_bytes
    from minimega.model import Block

    problems = []
    for dropout in (0.0, 0.2):
        torch.manual_seed(0)
        block = Block(mm.GPTConfig.tiny(dropout=dropout)).train()
        x, upstream = torch.randn(2, 16, 64), torch.randn(2, 16, 64)               # (B, T, D)
        label = f"dropout={dropout}"
        try:
            got = _block_grads(block, lambda t: fn.apply(block, t), x, upstream, seed=1)
        except Exception as exc:  # noqa: BLE001
            if (msg := _not_done(exc, "Checkpoint")):
                _fail("checkpoint", [msg])
            hint = next((h for key, h in _CHECKPOINT_HINTS.items() if key in str(exc)), "")
            problems.append(f"{label}: raised {type(exc).__name__}: {str(exc).splitlines()[0]}"
                            + (f": {hint}" if hint else ""))
            continue
        want = _block_grads(block, block, x, upstream, seed=1)
        (y, x_grad, grads), (y_ref, x_grad_ref, grads_ref) = got, want
        if not _close(y, y_ref):
            problems.append(f"{label}: the output differs from the block's: forward must return fn(x)")
            continue
        wrong = [n for n in grads_ref if grads[n] is None or not _close(grads[n], grads_ref[n])]
        if x_grad is None:
            problems.append(f"{label}: x got no gradient: backward must return (None, x's gradient)")
        elif not _close(x_grad, x_grad_ref) or wrong:
            if dropout and problems == []:
                problems.append(f"{label}: the gradients differ only with dropout: the recomputation drew new "
                                "dropout masks; save torch.get_rng_state() in forward and restore it before "
                                "recomputing (inside torch.random.fork_rng())")
            elif not _close(x_grad, x_grad_ref):
                problems.append(f"{label}: x's gradient differs from the plain block's")
            if wrong and all(grads[n] is None for n in wrong):
                problems.append(f"{label}: the block's parameters got no gradient: backpropagate through the "
                                "recomputed output with torch.autograd.backward(out, grad)")
        kept = saved_activation_bytes(_Apply(fn, block), x.clone().requires_grad_())
        input_only = saved_activation_bytes(_Apply(_Checkpoint, block), x.clone().requires_grad_())
        plain = saved_activation_bytes(block, x.clone().requires_grad_())
        if kept > input_only:
            problems.append(f"{label}: keeps {kept:,} bytes for backward; the plain block keeps {plain:,} and a "
                            f"checkpoint only its input, {input_only:,}: save x alone (ctx.save_for_backward(x))")
    if problems:
        _fail("checkpoint", problems)
    print("✓ Checkpoint: same output and gradients as the plain block (with and without dropout), "
          "keeping only the block's input for backward")



def _run_ranks(name: str, worker, world: int, *args, timeout: float = 60) -> list:
    """``mm.launch`` for a check: a hang or a worker's error becomes an `ExerciseError` that says why."""
    try:
        return mm.launch(worker, world, *args, timeout=timeout)
    except mm.LaunchTimeout:
        _fail(name, [f"the {world} ranks hung for {timeout:g} s: {_SAME_COLLECTIVES}"])
    except mm.WorkerError as exc:
        head = str(exc).splitlines()[0]
        if "elements, expected" in head:
            head += (": the flat buffer must have a multiple of group.size elements: pad it with zeros to "
                     "padded = ceil(numel / n) · n before the collective")
        elif not exc.exc_type:
            head += f" (gloo aborts a rank when its peers run different collectives): {_SAME_COLLECTIVES}"
        _fail(name, [head], exc.remote_traceback)


# ------------------------------------------------------------------------------------------------
# Lab 03: ZeRO-2's reduce-scatter of one unit's flat gradient.

# Units of parameters (their shapes): a multiple of 3 elements, and not (22 → padded to 24), and one
# where padding each gradient separately would give another length (3 × 4 → 3 × 6).
ZERO_UNITS = [[(4, 6), (6,)], [(5, 3), (7,)], [(4,), (4,), (4,)]]


def _shard_of(flat: torch.Tensor, n: int, r: int) -> torch.Tensor:
    from minimega.zero import padded_numel, shard_bounds

    padded = torch.cat([flat, flat.new_zeros(padded_numel(flat.numel(), n) - flat.numel())])
    start, end = shard_bounds(flat.numel(), n, r)
    return padded[start:end]


def _zero_rs_worker(fn, units: list[list[tuple]]) -> list[dict]:
    """Every rank: random gradients per unit; ``fn``'s shard next to the shards minimega's layout gives."""
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    group, n, r = mesh.dp_group, mesh.dp_size, mesh.dp_rank
    out = []
    for i, shapes in enumerate(units):
        gen = torch.Generator().manual_seed(100 * i + r)
        grads = [torch.randn(s, generator=gen) for s in shapes]
        local = torch.cat([g.reshape(-1) for g in grads])                       # (numel,)
        summed = comm.all_reduce(local.clone(), group)                            # the sum over ranks
        per_param = torch.cat([_pad_to(g.reshape(-1), n) for g in grads])        # each gradient padded alone
        per_param_sum = comm.all_reduce(per_param.clone(), group)
        reversed_sum = comm.all_reduce(torch.cat([g.reshape(-1) for g in reversed(grads)]), group)
        log = comm.CommLog()
        with log:
            got = fn([g.clone() for g in grads], group)
        got = got.detach().clone() if isinstance(got, torch.Tensor) else repr(got)
        k = per_param.numel() // n
        out.append({"shapes": shapes, "numel": local.numel(), "got": got, "events": log.events(),
                    "want": _shard_of(summed, n, r), "shards": [_shard_of(summed, n, q) for q in range(n)],
                    "local": _shard_of(local, n, r), "reversed": _shard_of(reversed_sum, n, r),
                    "per_param": per_param_sum[r * k:(r + 1) * k], "full": summed})
    return out


def _pad_to(flat: torch.Tensor, n: int) -> torch.Tensor:
    return torch.cat([flat, flat.new_zeros((-flat.numel()) % n)])


def _zero_rs_value_problem(case: dict, rank: int, n: int) -> str | None:
    got, want = case["got"], case["want"]
    numel = case["numel"]
    padded = -(-numel // n) * n
    where = f"unit {case['shapes']} ({numel} elements, padded to {padded}), rank {rank}"
    if not isinstance(got, torch.Tensor):
        return f"{where}: returned {got} instead of a tensor: return this rank's summed shard"
    if got.dim() != 1:
        return f"{where}: returned shape {tuple(got.shape)}: return the 1-D shard of padded/n = {padded // n} elements"
    if got.numel() == padded or got.numel() == numel:
        return (f"{where}: returned {got.numel()} elements, the whole flat buffer: each rank keeps only its "
                f"shard, padded/n = {padded // n} elements")
    if _close(got, want):
        return None
    if got.shape == case["per_param"].shape != want.shape or _close(got, case["per_param"]):
        return (f"{where}: the gradients were padded one by one: concatenate the unit's gradients into one flat "
                f"buffer of {numel} elements first, then pad that buffer once, to padded = {padded} (a multiple of n)")
    if got.shape != want.shape:
        return f"{where}: returned {got.numel()} elements; the shard holds padded/n = {padded // n}"
    if _close(got, want / n):
        return (f"{where}: the shard is the mean over ranks, not the sum: reduce-scatter sums; ZeRO divides by "
                "n (and the loss scale) later, once, on the fp32 master gradient")
    if _close(got, case["local"]):
        return f"{where}: the shard equals this rank's own gradients: nothing was summed across ranks"
    for q, shard in enumerate(case["shards"]):
        if q != rank and _close(got, shard):
            return (f"{where}: this is rank {q}'s shard: rank r owns elements [r·padded/n, (r+1)·padded/n) of the "
                    "flat buffer, and reduce-scatter hands chunk r to rank r: pass the whole padded buffer as input")
    if _close(got, case["reversed"]):
        return (f"{where}: the gradients were flattened in reverse order: keep the unit's parameter order "
                "(the order of `grads`), the one every rank and the parameter views share")
    return f"{where}: differs from minimega's summed shard by up to {(got - want).abs().max():.3g}"


def _zero_rs_traffic_problem(case: dict, n: int) -> str | None:
    ops = [e["op"] for e in case["events"]]
    if "all_reduce" in ops:
        return ("calls comm.all_reduce: an all-reduce sends twice the bytes of a reduce-scatter and leaves the "
                "whole summed gradient on every rank; ZeRO-2 reduce-scatters so each rank receives only its shard")
    if ops != ["reduce_scatter"]:
        return (f"unit {case['shapes']}: issued {ops or 'no collective'}; ZeRO-2 issues exactly one "
                "comm.reduce_scatter per unit, on its whole flat buffer")
    padded = 4 * n * -(-case["numel"] // n)
    sent, want = case["events"][0]["sent_bytes"], (n - 1) / n * padded
    if abs(sent - want) > 1e-6:
        return (f"unit {case['shapes']}: sends {sent:g} bytes per rank; the reduce-scatter of the padded flat buffer "
                f"({padded} bytes) sends (n-1)/n · {padded} = {want:g}")
    return None


def check_zero_reduce_scatter(fn, world: int = 3, timeout: float = 60) -> None:
    """Run ``fn(grads, group)`` on ``world`` gloo ranks; compare with the summed shard of `zero/flat.py`'s layout."""
    try:
        fn([torch.ones(3)], comm.Group(None, [0], "dp"))        # one rank: no process group needed
    except Exception as exc:  # noqa: BLE001
        if (msg := _not_done(exc, "reduce_scatter_grads")):
            _fail("reduce_scatter_grads", [msg])
    results = _run_ranks("reduce_scatter_grads", _zero_rs_worker, world, fn, ZERO_UNITS, timeout=timeout)
    problems = [p for rank, cases in enumerate(results) for case in cases
                for p in [_zero_rs_value_problem(case, rank, world)] if p]
    problems += [p for case in results[0] for p in [_zero_rs_traffic_problem(case, world)] if p]
    if problems:
        _fail("reduce_scatter_grads", problems)
    print(f"✓ reduce_scatter_grads: every rank holds the summed shard minimega's flat layout gives, on {world} ranks "
          f"for units {ZERO_UNITS}, sending (n-1)/n of the padded buffer")


# ------------------------------------------------------------------------------------------------
# Lab 08: the 1F1B order of one pipeline rank.

ONE_F_ONE_B_CASES = [(p, m, r) for p in (2, 3, 4) for m in (1, 2, 3, 4, 8) for r in range(p)]


def _forwards_before_first_backward(order: list[tuple[str, int]]) -> int:
    kinds = [k for k, _ in order]
    return kinds.index("B") if "B" in kinds else len(kinds)


def _one_f_one_b_problem(got, p: int, m: int, rank: int) -> str | None:
    from minimega.pipeline import peak_in_flight
    from minimega.pipeline.schedules import Action, one_f_one_b

    reference = one_f_one_b(p, m, 1, rank)
    want = [(a.kind, a.micro) for a in reference]
    where = f"p={p}, m={m}, rank {rank}"
    try:
        got = [(str(k), int(i)) for k, i in got]
    except (TypeError, ValueError):
        return f"{where}: returned {got!r}; return a list of ('F', i) / ('B', i) pairs"
    if got == want:
        return None
    if sorted(got) != sorted(want):
        extra = sorted({i for _, i in got if not 0 <= i < m})
        backwards = sum(k == "B" for k, _ in got)
        hint = ""
        if extra:
            hint = f": micro-batches {extra} do not exist (m = {m}): cap the warm-up at m forwards"
        elif backwards < m:
            hint = (f": only {backwards} backwards: after the steady state, run the backwards still owed "
                    "(the cool-down)")
        return f"{where}: not one F and one B for each micro-batch 0..{m - 1}: got {got}{hint}"
    for kind in ("F", "B"):
        micros = [i for k, i in got if k == kind]
        if micros != sorted(micros):
            return f"{where}: the {kind} passes run micro-batches in the order {micros}; run them in increasing order"
    seen = set()
    for k, i in got:
        if k == "B" and i not in seen:
            return f"{where}: B{i} comes before F{i}: a backward needs its own forward first"
        seen.add(i)
    peak, want_peak = peak_in_flight([Action(k, rank, i) for k, i in got]), peak_in_flight(reference)
    return (f"{where}: got {' '.join(f'{k}{i}' for k, i in got)}; 1F1B runs {' '.join(f'{k}{i}' for k, i in want)} "
            f"({peak} micro-batches in flight at the peak, 1F1B keeps {want_peak})")


def _one_f_one_b_diagnosis(fn, p: int = 4, m: int = 8) -> str | None:
    """The mistake behind the forwards each rank runs before its first backward, on a deep pipeline."""
    try:
        firsts = [_forwards_before_first_backward(list(fn(p, m, r))) for r in range(p)]
    except Exception:  # noqa: BLE001 - reported case by case
        return None
    want = [p - r for r in range(p)]
    if firsts == want:
        return None
    head = (f"with p={p}, m={m}, ranks 0..{p - 1} run {firsts} forwards before their first backward; 1F1B runs "
            f"{want}: p - rank - 1 warm-up forwards, then one more forward before the first backward")
    if firsts == [m] * p:
        return head + ("; yours is GPipe's order (all forwards, then all backwards), which holds all m micro-batches: "
                       "start the backwards after the warm-up")
    if firsts == [w + 1 for w in want]:
        return head + "; yours has one warm-up forward too many on every rank"
    if firsts == [r + 1 for r in range(p)]:
        return head + ("; yours is reversed: the *first* stage (rank 0) needs the most warm-up forwards, p - 1, "
                       "and the last stage none")
    if firsts[:-1] == [w - 1 for w in want[:-1]]:
        return head + "; after the warm-up, the steady state starts with a forward, then the backward (F, B, F, B...)"
    return head


def check_one_f_one_b(fn) -> None:
    """Compare ``fn(p, m, rank)`` with `minimega.pipeline.schedules.one_f_one_b` for every case, and run the
    resulting orders through minimega's slot grid (`plan`) to count the bubble."""
    try:
        fn(2, 2, 0)
    except Exception as exc:  # noqa: BLE001
        if (msg := _not_done(exc, "one_f_one_b_order")):
            _fail("one_f_one_b_order", [msg])
    problems = [d for d in [_one_f_one_b_diagnosis(fn)] if d]
    for p, m, rank in ONE_F_ONE_B_CASES:
        try:
            got = fn(p, m, rank)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"p={p}, m={m}, rank {rank}: raised {type(exc).__name__}: {exc}")
            continue
        if (msg := _one_f_one_b_problem(got, p, m, rank)):
            problems.append(msg)
        if len(problems) >= 6:
            problems.append("(further cases not shown)")
            break
    if problems:
        _fail("one_f_one_b_order", problems)
    print(f"✓ one_f_one_b_order matches minimega's 1F1B on all {len(ONE_F_ONE_B_CASES)} cases "
          "(p = 2..4, m = 1..8, every rank)")


# ------------------------------------------------------------------------------------------------
# Lab 10: which files of a checkpoint are damaged.

def _save_checkpoint_worker(directory: str) -> None:
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    torch.manual_seed(0)
    config = mm.TrainConfig(zero_stage=1, batch_size=4)
    engine = mm.initialize(mm.GPT(mm.GPTConfig.tiny(n_layer=1)), config, mesh)
    for batch in data.batches(mesh, 1, 4, 16):
        engine.train_step(batch)
    engine.save(directory)


def _damage(step_dir, how: str) -> list[str]:
    """Damage a copy of a checkpoint; return the files minimega's loader must refuse."""
    from pathlib import Path

    step_dir = Path(step_dir)
    shard, other = step_dir / "shard-00001.safetensors", step_dir / "shard-00000.safetensors"
    if how == "intact":
        return []
    if how == "one byte flipped in a shard":
        raw = bytearray(shard.read_bytes())
        raw[len(raw) // 2] ^= 0xFF                     # same size, different bytes
        shard.write_bytes(bytes(raw))
        return [shard.name]
    if how == "a shard truncated":
        shard.write_bytes(shard.read_bytes()[:100])
        return [shard.name]
    if how == "a shard deleted":
        other.unlink()
        return [other.name]
    if how == "two files overwritten":
        other.write_bytes(b"not a tensor file")
        shard.write_bytes(b"")
        return sorted([other.name, shard.name])
    raise ValueError(how)


CHECKPOINT_DAMAGES = ["intact", "one byte flipped in a shard", "a shard truncated", "a shard deleted",
                      "two files overwritten"]


def check_verify_checkpoint(fn) -> None:
    """Save a real 2-rank checkpoint, damage copies of it, and compare ``fn(directory)`` with minimega's loader."""
    import shutil
    import tempfile
    from pathlib import Path

    from minimega import checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        original = Path(tmp) / "original"
        _run_ranks("verify_checkpoint", _save_checkpoint_worker, 2, str(original), timeout=120)
        try:
            fn(original)
        except Exception as exc:  # noqa: BLE001
            if (msg := _not_done(exc, "verify_checkpoint")):
                _fail("verify_checkpoint", [msg])
        problems = []
        for i, how in enumerate(CHECKPOINT_DAMAGES):
            root = Path(tmp) / f"copy{i}"
            shutil.copytree(original, root)
            step_dir = checkpoint.resolve(root)
            want = _damage(step_dir, how)
            try:
                checkpoint.read(root)
                refused = False
            except checkpoint.CheckpointError:
                refused = True
            assert refused == bool(want), f"minimega's loader and the damage disagree for {how!r}"
            for label, target in (("the step directory", step_dir), ("the top directory (via `latest`)", root)):
                try:
                    got = fn(target)
                except Exception as exc:  # noqa: BLE001
                    hint = ""
                    if isinstance(exc, FileNotFoundError) and "manifest.json" in str(exc):
                        hint = (": a top directory holds no manifest.json; read its `latest` file and check the "
                                "step directory it names")
                    elif isinstance(exc, FileNotFoundError):
                        hint = ": a file the manifest lists may be missing; report it instead of opening it"
                    problems.append(f"{how}, given {label}: raised {type(exc).__name__}: {exc}{hint}")
                    continue
                if not isinstance(got, (list, tuple)) or any(not isinstance(n, str) for n in got):
                    problems.append(f"{how}: returned {got!r}; return a sorted list of file names (str)")
                    continue
                got = list(got)
                if got == want:
                    continue
                paths = [n for n in got if "/" in n or "\\" in n]
                if paths:
                    problems.append(f"{how}: returned paths {paths}; return the file names as the manifest lists "
                                    "them (`shard-00001.safetensors`)")
                elif sorted(got) == want:
                    problems.append(f"{how}: returned {got}; sort the names")
                elif not want:
                    problems.append(f"{how}: flagged {got} in an intact checkpoint: hash each file's bytes with "
                                    "sha256 (hexdigest) exactly as written, and compare with manifest['files']")
                elif how == "one byte flipped in a shard":
                    problems.append(f"{how}: returned {got}, expected {want}: the file has its original size and "
                                    "exists; only its sha256 shows the flipped byte")
                elif set(want) - set(got) and how == "a shard deleted":
                    problems.append(f"{how}: returned {got}, expected {want}: a file the manifest lists but the "
                                    "directory lacks is damaged too")
                else:
                    problems.append(f"{how}: returned {got}, expected {want}")
    if problems:
        _fail("verify_checkpoint", problems)
    print(f"✓ verify_checkpoint agrees with minimega's loader on a real 2-rank checkpoint: "
          f"{', '.join(CHECKPOINT_DAMAGES)}")


# ------------------------------------------------------------------------------------------------
# Lab 04: the dynamic loss scaler's update rule.

def _overflow_runs() -> list[tuple[str, dict, list[bool]]]:
    """(label, scaler arguments, overflow per step): hand-made cases, then random ones."""
    gen = torch.Generator().manual_seed(0)
    runs = [
        ("no overflow for 9 steps, window 4", dict(window=4), [False] * 9),
        ("a single overflow, hysteresis 2", dict(window=1000), [True]),
        ("two overflows in a row, hysteresis 2", dict(window=1000), [True, True]),
        ("three overflows, hysteresis 1", dict(window=1000, hysteresis=1), [True, True, True]),
        ("an overflow, then 6 clean steps, window 3", dict(window=3), [True] + [False] * 6),
        ("an overflow at step 2, then clean, window 3", dict(window=3), [False, False, True] + [False] * 6),
        ("a long run of overflows down to min_scale 4", dict(init_scale=64.0, hysteresis=1, min_scale=4.0), [True] * 6),
        ("overflow, growth, overflow, window 2", dict(window=2), [True, False, False, True, True, False, False]),
        ("factor 4, window 2", dict(factor=4.0, window=2, hysteresis=1), [False, False, True, False, False, False]),
    ]
    for i in range(12):
        kwargs = dict(window=int(torch.randint(1, 5, (), generator=gen)),
                      hysteresis=int(torch.randint(1, 4, (), generator=gen)), init_scale=2.0 ** 10, min_scale=2.0)
        steps = (torch.rand(24, generator=gen) < 0.3).tolist()
        runs.append((f"random sequence {i} ({kwargs})", kwargs, steps))
    return runs


def _scales(cls, kwargs: dict, overflows: list[bool]) -> list[tuple[float, int]]:
    s = cls(**kwargs)
    out = []
    for o in overflows:
        s.update(o)
        out.append((float(s.scale), int(s.skipped)))
    return out


def _scaler_hint(label: str, kwargs: dict, overflows: list[bool], got: list, want: list) -> str:
    from minimega.train.precision import DynamicLossScaler

    t = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
    seq = "".join("X" if o else "." for o in overflows[:t + 1])
    head = (f"{label}: after step {t} (overflows so far {seq}, X = overflow) the scale is {got[t][0]:g}, "
            f"minimega's is {want[t][0]:g}")
    if got[t][1] != want[t][1]:
        return (f"{label}: after step {t} skipped = {got[t][1]}, minimega's {want[t][1]}: count every overflowing "
                "step in `skipped` (its update is skipped)")
    prev = want[t - 1][0] if t else DynamicLossScaler(**kwargs).scale
    g, w = got[t][0], want[t][0]
    if overflows[t]:
        if w == kwargs.get("min_scale", 1.0) and g < w:
            return head + ": never drop below min_scale: S = max(S / factor, min_scale)"
        if w == prev and g < prev:
            return head + (": an overflow only uses up one unit of hysteresis while cur_hysteresis > 1; the scale "
                           "shrinks once the hysteresis is used up")
        if w < prev and g == prev:
            return head + (": cur_hysteresis is used up (1), so this overflow must divide the scale by factor "
                           "(or hysteresis is 1)")
    else:
        if w > prev and g == prev:
            return head + (": `window` clean steps have passed since the last overflow: the scale grows by factor "
                           "when (iteration - last_overflow) % window == 0")
        if w == prev and g > prev:
            return head + (": the scale grows only every `window` steps counted from the last overflow "
                           "(iteration - last_overflow), not on every clean step nor from the start of training")
    return head


def check_loss_scaler(cls) -> None:
    """Drive ``cls`` and `minimega.train.precision.DynamicLossScaler` with the same overflows; compare after every step."""
    from minimega.train.precision import DynamicLossScaler

    try:
        cls().update(False)
    except Exception as exc:  # noqa: BLE001
        if (msg := _not_done(exc, "LossScaler.update")):
            _fail("loss_scaler", [msg])
    problems = []
    for label, kwargs, overflows in _overflow_runs():
        want = _scales(DynamicLossScaler, kwargs, overflows)
        try:
            got = _scales(cls, kwargs, overflows)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{label}: raised {type(exc).__name__}: {exc}")
            continue
        if got != want:
            problems.append(_scaler_hint(label, kwargs, overflows, got, want))
        if len(problems) >= 5:
            break
    if problems:
        _fail("loss_scaler", problems)
    print(f"✓ LossScaler.update gives minimega's scale and skip count after every step of "
          f"{len(_overflow_runs())} overflow sequences")


# ------------------------------------------------------------------------------------------------
# Lab 05: bytes on the device and on the CPU, with and without optimizer offload.

OFFLOAD_CASES = [(precision, stage, offload) for precision in ("fp32", "bf16") for stage in (1, 2, 3)
                 for offload in (False, True)]
_OFFLOAD_MODEL = dict(n_embd=32, n_layer=2)


def _offload_worker(cases: list[tuple]) -> list[dict]:
    """One step per case on this rank; the bytes by category and where the optimizer states live."""
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    model_config = mm.GPTConfig.tiny(**_OFFLOAD_MODEL)
    out = []
    for precision, stage, offload in cases:
        torch.manual_seed(0)
        config = mm.TrainConfig(zero_stage=stage, precision=precision, offload_optimizer=offload, batch_size=4)
        engine = mm.initialize(mm.GPT(model_config), config, mesh)
        for batch in data.batches(mesh, 1, 4, 8):
            engine.train_step(batch)
        out.append(engine.report()["memory_at_step"])
    return out


@lru_cache(maxsize=1)
def _offload_oracle() -> tuple[int, list[dict]]:
    from minimega.zero import model_units, padded_numel

    with torch.device("meta"):
        gpt = mm.GPT(mm.GPTConfig.tiny(**_OFFLOAD_MODEL))
    padded = sum(padded_numel(sum(p.numel() for _, p in ps), 2) for _, ps in model_units(gpt))
    return padded, mm.launch(_offload_worker, 2, OFFLOAD_CASES, timeout=120)[0]


def _offload_hint(precision: str, stage: int, offload: bool, got: dict, want: dict, psi: int, dp: int) -> str:
    where = f"{precision}, stage {stage}, offload={offload}"
    width, grad_width = (4 if precision == "fp32" else 2), (2 if precision == "fp16" else 4)
    head = f"{where}: got device {got['device']:,} / cpu {got['cpu']:,} B, measured {want['device']:,} / {want['cpu']:,}"
    shard, host_grads = grad_width * psi // dp, 4 * psi // dp
    on_device = psi // (dp if stage >= 2 else 1) if not offload or stage == 1 else 0    # gradient elements there
    if precision == "bf16" and on_device and got["device"] == want["device"] - 2 * on_device:
        return head + (": bf16 gradients are summed and reduced in an fp32 buffer (Megatron's main_grad): 4 bytes "
                       "per element, not bf16's 2")
    if offload and stage >= 2 and got["device"] == want["device"] + shard and got["cpu"] == want["cpu"] - host_grads:
        return head + (": under offload each unit's reduced gradient shard goes to the host as soon as it is reduced "
                       "(summed there in fp32, 4 bytes per element); from stage 2 on none stays on the device")
    if offload and got["device"] == want["device"] and got["cpu"] == want["cpu"] - host_grads + width * psi // dp \
            and width != 4:
        return head + (": the host sums the gradient shards in fp32: 4 bytes per element, whatever the parameters' "
                       "dtype")
    if offload and stage == 1 and got["device"] == want["device"] - grad_width * psi:
        return head + (": stage 1 does not shard gradients: the whole buffer the backward accumulates into stays on "
                       "the device; only this rank's reduced shard goes to the host")
    master = 4 * psi // dp
    if not offload and got["cpu"]:
        return head + ": without offload everything stays on the device"
    if offload and not got["cpu"]:
        return head + ": offload moves the fp32 master shard, Adam's moments and the gradient shard to the CPU"
    if precision == "fp32" and not offload and got["device"] == want["device"] + master:
        return head + (": in fp32 on the device the parameter shard *is* the master copy (the optimizer steps it in "
                       "place): no extra 4 bytes per element")
    if precision == "fp32" and offload and got["cpu"] == want["cpu"] - master:
        return head + (": offloading always makes a separate fp32 master copy on the host, even when the parameters "
                       "are fp32 (the device keeps its own parameters)")
    grads_stage = grad_width * psi // (dp if stage >= 2 else 1)
    if (got["cpu"] or got["device"]) and (got["cpu"] == dp * want["cpu"] or
                                          got["device"] - want["device"] == (dp - 1) * (want["device"] - (
                                              width * psi // (dp if stage >= 3 else 1) + grads_stage))):
        return head + ": ZeRO shards the master and the moments: each rank keeps Ψ/dp of them"
    if got["device"] != want["device"]:
        params = width * psi // (dp if stage >= 3 else 1)
        return head + (f": the device holds parameters ({params:,} B at stage {stage}: sharded only at stage 3) and "
                       f"gradients ({grads_stage:,} B: sharded from stage 2), {width} and {grad_width} bytes per "
                       f"element in {precision}"
                       + ("; under offload the gradient shards are on the host" if offload else ""))
    return head


def check_offload(fn) -> None:
    """Compare ``fn(Ψ, 2, stage, precision, offload)`` with the bytes real 2-rank jobs hold, by location."""
    try:
        fn(8, 2, 1, "bf16", False)
    except Exception as exc:  # noqa: BLE001
        if (msg := _not_done(exc, "bytes_by_location")):
            _fail("bytes_by_location", [msg])
    psi, measured = _offload_oracle()
    problems = []
    for (precision, stage, offload), m in zip(OFFLOAD_CASES, measured):
        states = m["master"] + m["optimizer_states"]
        on_cpu = m["optimizer_location"] == "cpu"
        want = {"device": m["params"] + m["grads"] + (0 if on_cpu else states),
                "cpu": states + m["host_grads"] if on_cpu else 0}
        try:
            got = fn(psi, 2, stage, precision, offload)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{precision}, stage {stage}, offload={offload}: raised {type(exc).__name__}: {exc}")
            continue
        if not isinstance(got, dict) or set(got) != {"device", "cpu"}:
            problems.append(f"returned {got!r}; return a dict with exactly the keys 'cpu' and 'device'")
            break
        if got != want:
            problems.append(_offload_hint(precision, stage, offload, got, want, psi, 2))
    if problems:
        _fail("bytes_by_location", problems)
    print(f"✓ bytes_by_location matches what real 2-rank jobs hold on the device and the CPU in all "
          f"{len(OFFLOAD_CASES)} cases (fp32/bf16 × stage 1-3 × offload)")


# ------------------------------------------------------------------------------------------------
# Lab 11: the piece of each parameter FSDP2 keeps on a rank.

FSDP_SHAPES = [(6, 4), (7, 3), (5,), (2, 5), (4, 1, 3), (1, 8)]


class _Params(torch.nn.Module):
    def __init__(self, shapes):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes])


def _fsdp_shard_worker(fn, shapes) -> list[dict]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world, rank = dist.get_world_size(), dist.get_rank()
    module = _Params(shapes)
    full = [p.detach().clone() for p in module.ps]
    fully_shard(module, mesh=init_device_mesh("cpu", (world,)))
    out = []
    for f, p in zip(full, module.ps):
        try:
            got = fn(f.clone(), world, rank)
            got = got.detach().clone() if isinstance(got, torch.Tensor) else repr(got)
        except Exception as exc:  # noqa: BLE001
            got = f"raised {type(exc).__name__}: {exc}"
        out.append({"shape": tuple(f.shape), "full": f, "want": p.to_local().detach().clone(), "got": got})
    return out


def _fsdp_shard_problem(case: dict, rank: int, world: int) -> str | None:
    got, want, full = case["got"], case["want"], case["full"]
    where = f"parameter of shape {case['shape']}, rank {rank} of {world}"
    if isinstance(got, str):
        if got.startswith("raised IndexError"):
            return (f"{where}: {got}: torch.chunk returns fewer than world chunks when the rows run out; ranks past "
                    f"the last chunk hold zero rows, an empty tensor of shape (0, *rest) = {tuple(want.shape)}")
        return f"{where}: {got}" if got.startswith("raised") else f"{where}: returned {got}; return a tensor"
    if got.shape == want.shape and torch.equal(got, want):
        return None
    if got.dim() == 1 and full.dim() > 1:
        return (f"{where}: returned a 1-D tensor of {got.numel()} elements: FSDP2 does not flatten; it keeps each "
                f"parameter's shape and shards rows (dim 0): expected shape {tuple(want.shape)}")
    if got.shape[0] > want.shape[0] and torch.equal(got[:want.shape[0]], want) and not got[want.shape[0]:].any():
        return (f"{where}: {got.shape[0]} rows, {got.shape[0] - want.shape[0]} of them padding zeros: to_local() "
                f"holds only the real rows ({want.shape[0]})")
    split = torch.tensor_split(full, world, dim=0)[rank]
    if got.shape == split.shape and torch.equal(got, split) and split.shape != want.shape:
        return (f"{where}: {got.shape[0]} rows is torch.tensor_split's balanced cut; FSDP2 cuts like torch.chunk: "
                f"ceil({full.shape[0]}/{world}) = {-(-full.shape[0] // world)} rows per rank, the last ranks get "
                f"what remains, here {want.shape[0]}")
    if full.dim() > 1 and got.shape[0] == full.shape[0]:
        return f"{where}: kept all {full.shape[0]} rows: FSDP2 shards dim 0 (rows), not another dimension"
    if got.shape != want.shape:
        return f"{where}: shape {tuple(got.shape)}, FSDP2 keeps {tuple(want.shape)}"
    return f"{where}: the right shape but other rows: rank r keeps the r-th chunk of rows"


def check_fsdp_shard(fn, world: int = 3, timeout: float = 90) -> None:
    """``fully_shard`` parameters of awkward shapes on ``world`` gloo ranks; compare ``fn`` with each ``to_local()``."""
    try:
        fn(torch.ones(2, 2), 1, 0)
    except Exception as exc:  # noqa: BLE001
        if (msg := _not_done(exc, "fsdp_local_shard")):
            _fail("fsdp_local_shard", [msg])
    results = _run_ranks("fsdp_local_shard", _fsdp_shard_worker, world, fn, FSDP_SHAPES, timeout=timeout)
    problems = [p for rank, cases in enumerate(results) for case in cases
                for p in [_fsdp_shard_problem(case, rank, world)] if p]
    if problems:
        _fail("fsdp_local_shard", problems)
    print(f"✓ fsdp_local_shard equals FSDP2's to_local() on every one of {world} ranks for shapes {FSDP_SHAPES}")


# ------------------------------------------------------------------------------------------------
# Lab 09: the rank grid of a dp × tp × pp job.

GRID_LAYOUTS = [(2, 2, 1), (2, 1, 2), (1, 2, 2), (2, 2, 2), (3, 2, 2), (2, 4, 3), (4, 1, 1), (1, 1, 4)]


def _norm_groups(groups) -> list[tuple[int, ...]]:
    return sorted(tuple(sorted(int(r) for r in g)) for g in groups)


def _grid_groups(dp: int, tp: int, pp: int, order: tuple[str, ...], dim: str) -> list[tuple[int, ...]]:
    """Groups along ``dim`` on another grid layout (``order``: outermost to innermost), for the hints."""
    sizes = {"dp": dp, "tp": tp, "pp": pp}
    grid = torch.arange(dp * tp * pp).view(*[sizes[d] for d in order])
    axis = order.index(dim)
    return _norm_groups(grid.movedim(axis, -1).reshape(-1, sizes[dim]).tolist())


def _grid_diagnosis(fn, dp: int = 2, tp: int = 3, pp: int = 4) -> str | None:
    """Which grid ``fn`` lays the ranks on, told apart on a layout whose three sizes differ."""
    from itertools import permutations

    try:
        got = {dim: _norm_groups(fn(dp, tp, pp, dim)) for dim in ("dp", "tp", "pp")}
    except Exception:  # noqa: BLE001 - reported case by case
        return None
    for order in permutations(("pp", "dp", "tp")):
        if order != ("pp", "dp", "tp") and all(got[d] == _grid_groups(dp, tp, pp, order, d) for d in got):
            return (f"with dp={dp}, tp={tp}, pp={pp} your groups are those of the grid view({', '.join(order)}) "
                    f"({order[-1]} innermost); minimega's grid is view(pp, dp, tp): tp innermost (consecutive ranks "
                    "form a tp group: they share a node's fast links), pp outermost, so "
                    "rank = (pp_rank·dp + dp_rank)·tp + tp_rank")
    return None


def check_rank_grid(fn) -> None:
    """Compare ``fn(dp, tp, pp, dim)`` with `minimega.ParallelDims.group_ranks` on several layouts."""
    try:
        fn(1, 1, 1, "dp")
    except Exception as exc:  # noqa: BLE001
        if (msg := _not_done(exc, "group_ranks")):
            _fail("group_ranks", [msg])
    problems = [d for d in [_grid_diagnosis(fn)] if d]
    for dp, tp, pp in GRID_LAYOUTS:
        dims = mm.ParallelDims(dp=dp, tp=tp, pp=pp)
        for dim in ("tp", "dp", "pp"):
            where = f"dp={dp}, tp={tp}, pp={pp}, {dim} groups"
            want = _norm_groups(dims.group_ranks(dim))
            try:
                raw = fn(dp, tp, pp, dim)
                got = _norm_groups(raw)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{where}: raised {type(exc).__name__}: {exc}")
                continue
            if got == want:
                if any(list(g) != sorted(g) for g in raw):
                    problems.append(f"{where}: list each group's ranks in increasing order")
                continue
            size = {"dp": dp, "tp": tp, "pp": pp}[dim]
            head = f"{where}: got {got}, minimega's mesh has {want}"
            if any(len(g) != size for g in got) or len(got) != dp * tp * pp // size:
                problems.append(head + f": there are world/{dim} = {dp * tp * pp // size} groups of {dim} = {size} ranks")
            else:
                problems.append(head)
    if problems:
        _fail("group_ranks", problems[:8])
    print(f"✓ group_ranks matches minimega's mesh for every dimension of {len(GRID_LAYOUTS)} layouts")


# ------------------------------------------------------------------------------------------------
# Lab 13: the α-β time of a collective.

ALPHA_BETA_OPS = ("all_reduce", "reduce_scatter", "all_gather", "send_recv")
ALPHA_BETA_CASES = [(n, size, alpha, beta) for n in (1, 2, 8, 64) for size in (0.0, 4096.0, 1e9)
                    for alpha, beta in ((5e-6, 240e9), (4.8e-4, 0.7e9))]


def _alpha_beta_problem(op: str, got: float, n: int, size: float, alpha: float, beta: float, want: float) -> str:
    where = f"{op}, n={n}, S={size:g} B, α={alpha:g} s, β={beta:g} B/s: got {got:.6g} s, want {want:.6g} s"
    k = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}.get(op, 0)
    if op == "send_recv":
        return where + ": a send/recv is one message, α + S/β, whatever n is"
    if n == 1:
        return where + ": one rank has nobody to send to: 0 s"
    if size and abs(got - (k * (n - 1) * alpha + k * size / beta)) <= 1e-9 * want:
        return where + ": each rank sends (n-1)/n of the buffer per pass, not all of it: (n-1)/n · S/β"
    if abs(got - (k * alpha + k * (n - 1) / n * size / beta)) <= 1e-9 * max(want, 1e-30) and n > 2:
        return where + ": every ring step pays α, and there are n-1 steps per pass: (n-1)·α"
    if op == "all_reduce" and abs(got - want / 2) <= 1e-9 * want:
        return where + ": an all-reduce is a reduce-scatter then an all-gather: 2(n-1) steps and 2(n-1)/n · S"
    if op != "all_reduce" and abs(got - 2 * want) <= 1e-9 * want:
        return where + ": a reduce-scatter (or an all-gather) is one pass of the ring, half an all-reduce"
    return where


def check_collective_seconds(fn) -> None:
    """Compare ``fn(op, size_bytes, n, alpha, beta)`` with `minimega.analysis.perf.collective_time` (ring)."""
    from minimega.analysis import perf
    from minimega.analysis.hardware import Link
    try:
        fn("all_reduce", 1.0, 2, 1e-6, 1e9)
    except Exception as exc:  # noqa: BLE001
        if (msg := _not_done(exc, "collective_seconds")):
            _fail("collective_seconds", [msg])
    problems = []
    for op in ALPHA_BETA_OPS:
        for n, size, alpha, beta in ALPHA_BETA_CASES:
            want = perf.collective_time(op, size, n, Link(name="check", bandwidth=beta, alpha=alpha, efficiency=1.0))
            try:
                got = float(fn(op, size, n, alpha, beta))
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{op}, n={n}, S={size:g}: raised {type(exc).__name__}: {exc}")
                continue
            if abs(got - want) > 1e-9 * max(abs(want), 1e-12):
                problems.append(_alpha_beta_problem(op, got, n, size, alpha, beta, want))
    if problems:
        _fail("collective_seconds", problems[:6])
    print(f"✓ collective_seconds equals perf.collective_time for {len(ALPHA_BETA_OPS)} ops on "
          f"{len(ALPHA_BETA_CASES)} (n, S, α, β) cases")

# Lab 16: expert capacity.

def _reference_slots(choices: list[list[int]], n_experts: int, capacity: int) -> list[list[int | None]]:
    """`minimega.parallel.moe.layer.assign_slots` on one sequence, as nested lists."""
    from minimega.parallel.moe import layer as moe
    top_i = torch.tensor(choices).unsqueeze(0)                       # (1, T, k)
    T, k = top_i.shape[1:]
    choice, slot, kept = moe.assign_slots(top_i, n_experts, capacity)
    out = [[None] * k for _ in range(T)]
    for j in range(k):
        for t in range(T):
            e = choices[t][j]
            if kept[0, j * T + t, e]:
                out[t][j] = int(slot[0, j * T + t, e])
    return out


def check_moe_slots(fn) -> None:
    """Compare ``fn(choices, n_experts, capacity)`` with minimega's routing on hand-made and random cases."""
    cases = [([[0, 1], [0, 1], [0, 2]], 3, 2), ([[1], [1], [1], [0]], 2, 2), ([[0, 1], [1, 0]], 2, 1)]
    gen = torch.Generator().manual_seed(16)
    for _ in range(30):
        E = int(torch.randint(2, 6, (1,), generator=gen))
        k = int(torch.randint(1, min(3, E) + 1, (1,), generator=gen))
        T = int(torch.randint(1, 12, (1,), generator=gen))
        choices = [torch.randperm(E, generator=gen)[:k].tolist() for _ in range(T)]
        cases.append((choices, E, int(torch.randint(1, T + 1, (1,), generator=gen))))
    try:
        fn([[0]], 1, 1)
    except Exception as exc:  # noqa: BLE001
        if (msg := _not_done(exc, "assign_slots")):
            _fail("assign_slots", [msg])
    problems = []
    for choices, E, C in cases:
        want = _reference_slots(choices, E, C)
        try:
            got = fn(choices, E, C)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"choices={choices}, capacity={C}: raised {type(exc).__name__}: {exc}")
            continue
        if got == want:
            continue
        where = f"choices={choices}, E={E}, capacity={C}: got {got}, minimega routes {want}"
        flat = [s for row in got for s in row] if isinstance(got, list) else []
        if any(s is not None and s >= C for s in flat):
            problems.append(where + ": a slot number reaches the capacity; slots run 0 .. capacity-1, the rest drop")
        elif _token_major(choices, E, C) == got:
            problems.append(where + ": second choices are queued only after every token's first choice "
                                    "(GShard's priority), not token by token")
        else:
            problems.append(where)
    if problems:
        _fail("assign_slots", problems[:6])
    print(f"✓ assign_slots matches minimega's routing on {len(cases)} sequences, drops included")


def _token_major(choices, n_experts, capacity):
    """The common mistake: queue token 0's choices, then token 1's, ..."""
    filled, out = [0] * n_experts, []
    for c in choices:
        row = []
        for e in c:
            row.append(filled[e] if filled[e] < capacity else None)
            filled[e] += 1
        out.append(row)
    return out


# ------------------------------------------------------------------------------------------------
# Lab 15: the load-balanced sequence split.

def check_cp_chunks(fn) -> None:
    """Compare ``fn(seq_len, cp_rank, cp)`` with `minimega.parallel.context.positions` on many layouts."""
    from minimega.parallel import context as context_parallel
    cases = [(16, r, 2) for r in range(2)] + [(32, r, 4) for r in range(4)] + \
            [(s, r, cp) for cp in (1, 3, 8) for s in (2 * cp, 6 * cp) for r in range(cp)]
    try:
        fn(16, 0, 2)
    except Exception as exc:  # noqa: BLE001
        if (msg := _not_done(exc, "rank_positions")):
            _fail("rank_positions", [msg])
    problems = []
    for seq_len, r, cp in cases:
        want = context_parallel.positions(seq_len // cp, r, cp).tolist()
        try:
            got = fn(seq_len, r, cp)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"seq_len={seq_len}, rank {r} of cp={cp}: raised {type(exc).__name__}: {exc}")
            continue
        got = list(got) if isinstance(got, (list, tuple, range)) else got
        if got == want:
            continue
        where = f"seq_len={seq_len}, rank {r} of cp={cp}: got {got}, minimega holds {want}"
        c = seq_len // (2 * cp)
        if got == list(range(r * seq_len // cp, (r + 1) * seq_len // cp)):
            problems.append(where + ": a contiguous slice leaves the last rank the most causal work; hold chunk r "
                                    "and its mirror 2·cp-1-r of the 2·cp chunks")
        elif got == list(range(r * c, (r + 1) * c)) + list(range((r + cp) * c, (r + cp + 1) * c)):
            problems.append(where + ": chunk r + cp is not the mirror of chunk r; the mirror is 2·cp-1-r")
        elif isinstance(got, list) and sorted(got) == sorted(want):
            problems.append(where + ": the right tokens in the wrong order; the early chunk comes first")
        else:
            problems.append(where)
    if problems:
        _fail("rank_positions", problems[:6])
    print(f"✓ rank_positions matches minimega's context-parallel split on {len(cases)} layouts")
