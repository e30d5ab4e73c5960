"""ZeRO-Offload (`zero/offload.py`): what stays on the device is what the estimator says, in real 2-rank jobs.

With ``offload_optimizer=True`` each unit's reduced gradient shard goes to the host as soon as its reduce is
done; the device keeps the parameters (stage 1 also its unsharded gradient buffer, which the backward
accumulates into). Measured two ways against `minimega.estimate`:

- at the optimizer step (``report()["memory_at_step"]``), by category and location, against
  `estimate.memory_per_gpu` for the same shape, stage, precision and dp, and against
  `estimate.model_state_placement` in bytes;
- through the whole step (`measure.PeakTracker` samples after every tensor operation), against
  `estimate.peak_memory_bytes(..., offload=True)`: the device's gradients never exceed one unit's full
  gradients at stages 2-3, so no shard waits on the device for the step.
"""
import pytest
import torch
import torch.distributed as dist

import minimega as mm
from minimega import data, estimate
from minimega.zero import model_units

# Odd widths, so units do not split evenly over dp: the padding is part of what is checked.
MODEL = dict(vocab_size=255, block_size=64, n_layer=3, n_head=3, n_embd=33)
DP = 2
CASES = [(stage, precision) for stage in (1, 2, 3) for precision in ("fp32", "bf16")]


def _offload_worker(cases):
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    out = {}
    for stage, precision in cases:
        # Two micro-steps: stages 2-3 reduce on each, so the host sums two arrivals per unit and step.
        config = mm.TrainConfig(zero_stage=stage, precision=precision, offload_optimizer=True, batch_size=8,
                                gradient_accumulation_steps=2, seed=0)
        torch.manual_seed(0)
        engine = mm.initialize(mm.GPT(mm.GPTConfig(**MODEL)), config, mesh)
        for batch in data.batches(mesh, 2, 8, 64):
            engine.train_step(batch)
        report = engine.report()
        out[(stage, precision)] = {"at_step": report["memory_at_step"], "peak": report["memory_peak"]}
    return out


@pytest.fixture(scope="module")
def runs():
    return mm.launch(_offload_worker, DP, CASES, timeout=300)


def _units():
    return [[p.numel() for _, p in params] for _, params in model_units(mm.GPT(mm.GPTConfig(**MODEL)))]


def _by_location(m: dict) -> dict:
    """Measured bytes at the step in the estimator's categories: the device's, and the host's ('cpu').

    Torch's 0-d Adam step counters are left out on both sides (the estimator does not count them).
    """
    states = m["master"] + m["optimizer_states"]
    on_host = m["optimizer_location"] == "cpu"
    return {"params": m["params"], "grads": m["grads"], "optimizer": 0 if on_host else states,
            "cpu": states + m.get("host_grads", 0) if on_host else 0}


@pytest.mark.parametrize("stage,precision", CASES, ids=[f"stage{s}-{p}" for s, p in CASES])
def test_device_bytes_at_the_step_are_the_estimators(runs, stage, precision):
    psi = sum(estimate.padded_numel(sum(u), DP) for u in _units())        # the padded Ψ the flat buffers hold
    # minimega's bf16 accumulates and reduces gradients in fp32 (main_grad): the estimators' "bf16" counts 4 bytes.
    cfg = estimate.MemoryConfig(layers=MODEL["n_layer"], hidden=MODEL["n_embd"], heads=MODEL["n_head"],
                                vocab=MODEL["vocab_size"], seq_len=MODEL["block_size"], precision=precision,
                                zero_stage=stage, dp=DP, offload="optimizer")
    per_gpu = estimate.memory_per_gpu(cfg)
    placed = estimate.model_state_placement(psi, DP, stage, precision, "optimizer")
    for rank, result in enumerate(runs):
        got = _by_location(result[(stage, precision)]["at_step"])
        # In bytes, for minimega's padded Ψ: exactly.
        assert got == placed, f"rank {rank}"
        # Per parameter, against the calculator's function: memory_per_gpu counts Ψ from the shape with GPT-2's
        # biases and a tied head (minimega's GPT has neither) and no padding, so bytes are compared per parameter.
        for key in ("params", "grads", "optimizer", "cpu"):
            assert got[key] / psi == pytest.approx(per_gpu[key] / per_gpu["stage_params"], rel=1e-12), (rank, key)
        # Gradient shards on the device at the step: none from stage 2 on; stage 1 keeps its unsharded buffer.
        assert got["grads"] == (4 * psi if stage == 1 else 0)          # fp32 under both policies


@pytest.mark.parametrize("stage,precision", CASES, ids=[f"stage{s}-{p}" for s, p in CASES])
def test_device_peak_through_the_step_is_the_estimators(runs, stage, precision):
    want = estimate.peak_memory_bytes(_units(), DP, stage, precision=precision, offload=True)
    for rank, result in enumerate(runs):
        got = result[(stage, precision)]["peak"]
        for category, value in want.items():
            assert got[category] == value, f"rank {rank} {category}: measured {got[category]:,} != {value:,}"


def test_offload_placement_matches_deepspeeds_estimator():
    """DeepSpeed's ZeRO-3 estimator for 2851M parameters on one node of 8 GPUs (docs `memory.rst`, reproduced by its
    code): CPU 63.72 GiB with the optimizer offloaded, 71.69 GiB with the parameters too (16Ψ and 18Ψ per node, times
    its 1.5 buffer factor); the GPU keeps 2Ψ/G of model states with the optimizer offloaded, none with both."""
    psi, gpus, gib = 2851e6, 8, 2 ** 30
    opt = estimate.model_state_placement(psi, gpus, 3, "mixed", "optimizer")
    both = estimate.model_state_placement(psi, gpus, 3, "mixed", "optimizer+params")
    assert round(opt["cpu"] * gpus * 1.5 / gib, 2) == 63.72
    assert round(both["cpu"] * gpus * 1.5 / gib, 2) == 71.69
    assert opt["params"] + opt["grads"] + opt["optimizer"] == 2 * psi / gpus
    assert both["params"] + both["grads"] + both["optimizer"] == 0
    # Stage 2, one GPU (DeepSpeed's ZeRO-2 estimator with offload: GPU 2Ψ, CPU 16Ψ before the 1.5 factor).
    one = estimate.model_state_placement(psi, 1, 2, "mixed", "optimizer")
    assert (one["params"], one["grads"], one["optimizer"], one["cpu"]) == (2 * psi, 0, 0, 16 * psi)
    # Stage 1 does not shard gradients: the buffer the backward accumulates into stays; the host gets the shard.
    s1 = estimate.model_state_placement(psi, gpus, 1, "mixed", "optimizer")
    assert (s1["grads"], s1["cpu"]) == (2 * psi, 16 * psi / gpus)
    with pytest.raises(ValueError, match="offload"):
        estimate.model_state_placement(psi, 1, 2, "mixed", "gpu")


# ------------------------------------------------------------------------------------------------
# The CUDA copy stream's ordering, checked on CPU with stand-in streams and events that log what happens where.

class _Streams:
    """Stand-ins for ``torch.cuda``'s Stream, Event, current_stream and stream(); ``log`` records the order."""

    def __init__(self):
        self.log, self.where, self.events = [], ["compute"], 0
        self.compute, self.copy = self._stream("compute"), self._stream("copy")

    def _stream(self, name):
        log = self.log

        class Stream:
            def wait_stream(self, other):
                log.append(f"{name} waits {other.name}")

            def wait_event(self, event):
                log.append(f"{name} waits {event.name}")
        stream = Stream()
        stream.name = name
        return stream

    def event(self):
        streams = self
        streams.events += 1

        class Event:
            name = f"event{streams.events}"

            def record(self, stream):
                streams.log.append(f"{self.name} recorded on {stream.name}")

            def synchronize(self):
                streams.log.append(f"host waits {self.name}")
        return Event()

    def use(self, stream):
        streams = self

        class Use:
            def __enter__(self):
                streams.where[0] = stream.name

            def __exit__(self, *exc):
                streams.where[0] = "compute"
        return Use()

    def install(self, store):
        from minimega.zero.offload import CopyStream
        store.copies = CopyStream(stream=self.copy, event=self.event, current=lambda: self.compute, use=self.use)
        real_copy = store.copies.copy
        store.copies.copy = lambda dst, src: (self.log.append(f"copy on {self.where[0]}"), real_copy(dst, src))
        real_step = store.optimizer.step
        store.optimizer.step = lambda: (self.log.append("optimizer step on the host"), real_step())


def test_gradient_shards_go_down_after_their_reduce_and_their_buffers_wait_for_the_copy():
    """Per unit, oldest first: the reduce is waited for, then the copy stream waits for compute and copies the
    shard, and compute waits for the copy before the reduce buffer can be reused; the host waits for the last
    copy event once and sums. At the step the optimizer runs after that wait; the upload is on the copy stream
    and compute waits for it."""
    from minimega import comm, zero
    from minimega.train.engine import make_optimizer
    group = comm.Group(None, [0], "dp")               # one rank: collectives complete at once, no process group
    # Every reduction left in flight by the backward, so that each wait can be logged.
    config = mm.TrainConfig(zero_stage=2, offload_optimizer=True, reductions_in_flight=64)
    torch.manual_seed(0)
    stage = zero.wrap(mm.GPT(mm.GPTConfig(**MODEL)), config, group, 0, lambda p: make_optimizer(p, config))
    streams = _Streams()
    streams.install(stage.store)
    log = streams.log
    x, y = data.global_batch(0, 2, 16)
    stage(x, y)[1].backward()
    assert len(stage._reducing) == len(stage.units) and not stage.grad_shards   # all started; no device shards
    order = list(stage._in_flight)                             # the backward's order: the head first
    for i, (k, out, handle) in list(stage._reducing.items()):
        class Logged:
            def __init__(self, i, handle):
                self.i, self.handle = i, handle

            def wait(self):
                log.append(f"reduce {self.i} waited")
                self.handle.wait()
        stage._reducing[i] = k, out, Logged(i, handle)
    stage.finish_grad_sync()
    n = len(stage.units)
    per_unit = [[f"reduce {i} waited", "copy waits compute", "copy on copy", f"event{k + 1} recorded on copy",
                 "compute waits copy"] for k, i in enumerate(order)]
    want = [line for unit in per_unit for line in unit] + [f"host waits event{n}"]
    assert log == want
    del log[:]
    stage.step()
    assert log == ["optimizer step on the host", "copy waits compute"] + ["copy on copy"] * n + [
        f"event{n + 1} recorded on copy", "compute waits event" + str(n + 1)]


def test_the_offloaded_store_steps_as_the_device_store_does():
    """Shards summed on the host over two arrivals, divided there, stepped by SGD (a wrong divide or a lost arrival
    shows: SGD is not scale-invariant like Adam), uploaded in the parameters' dtype: the numbers of `MasterStore`."""
    from minimega.zero.offload import CPUOffloadStore, MasterStore
    torch.manual_seed(0)
    params = [torch.randn(6).to(torch.bfloat16), torch.randn(3).to(torch.bfloat16)]
    grads = [torch.randn(6).to(torch.bfloat16), torch.randn(3).to(torch.bfloat16)]
    sgd = lambda p: torch.optim.SGD(p, lr=0.5)
    ref_params, before = [p.clone() for p in params], [p.clone() for p in params]
    ref, store = MasterStore(ref_params, sgd), CPUOffloadStore(params, sgd)
    assert type(store.copies).__name__ == "HostCopies"               # CPU shards: no streams
    for _ in range(2):
        ref.set_grads([(2 * g).clone() for g in grads], 4.0)          # two micro-steps' sum, as the device holds it
        ref.step()
        ref.zero_grad()
        for _ in range(2):                                             # two arrivals per unit, summed on the host
            for i, g in enumerate(grads):
                store.receive_grad(i, g)
            store.grads_received()
        store.set_grads([], 4.0)
        store.step()
        store.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))     # same math, same bf16 results
    assert not any(torch.equal(a, b) for a, b in zip(params, before))      # and the step did update them
    assert all(h.dtype == torch.float32 and not h.any() for h in store.host_grads)   # zeroed for the next step
    with pytest.raises(RuntimeError, match="none stay on the device"):
        store.set_grads(grads, 4.0)


# ------------------------------------------------------------------------------------------------
# Same numbers with and without offload.

def _parity_worker(stages):
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    out = {}
    for stage in stages:
        for offload in (False, True):
            config = mm.TrainConfig(zero_stage=stage, offload_optimizer=offload, batch_size=8, seed=1,
                                    gradient_accumulation_steps=2, gradient_clipping=0.5)
            torch.manual_seed(config.seed)
            engine = mm.initialize(mm.GPT(mm.GPTConfig(**MODEL)), config, mesh)
            for batch in data.batches(mesh, 3, 8, 64, seed=config.seed):
                engine.train_step(batch)
            out[(stage, offload)] = {"losses": engine.losses, "norms": engine.grad_norms,
                                     "state": engine.full_state_dict()}
    return out


def test_offload_trains_bit_for_bit_as_the_device_store_in_fp32():
    """fp32, two micro-steps, clipping: the host sums the arrivals in the order the device shard would, so the run is
    the same to the last bit at every stage (bf16 differs with accumulation: the host sums in fp32, the device in bf16)."""
    runs = mm.launch(_parity_worker, DP, (1, 2, 3), timeout=300)[0]
    for stage in (1, 2, 3):
        on, off = runs[(stage, False)], runs[(stage, True)]
        assert off["losses"] == on["losses"] and off["norms"] == on["norms"], stage
        assert all(torch.equal(off["state"][k], v) for k, v in on["state"].items()), stage
