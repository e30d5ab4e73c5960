"""One GPU, every engine path that fits one rank, checked against the CPU reference; then GPT-2 124M MFU.

Run by ``bench/gpu.sh`` on a machine with one CUDA GPU (about 5 minutes on an H100-class GPU):

1. each path trains the tiny GPT for a few steps as a 1-rank NCCL job (``launch(..., backend="nccl")``)
   and its final fp32 weights are compared with `tests/parity.py`'s single-process CPU reference:
   ZeRO 0-3, full and selective activation checkpointing, the optimizer offloaded to (pinned) host
   memory, and bf16 (against the fp32 reference: a looser bound, bf16 keeps 8 bits of mantissa); a path
   also fails if its engine timeline is not CUDA events in order, or if offload's host copies do not run
   on a copy stream into pinned memory;
2. the MFU of ``GPTConfig.gpt2()`` in bf16 through the engine, next to a plain torch training loop of the
   same model (`bench/gpu_throughput.py`), both measured in this run.

Exits non-zero if any path misses its bound. ``--device-check-only`` skips the MFU part.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import minimega as mm
from minimega import data
from minimega.clock import CudaClock
from minimega.zero.offload import CopyStream

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from parity import max_rel_error, parity_config, reference_run  # noqa: E402

MODEL = mm.GPTConfig.tiny(block_size=32)
STEPS = 5
PATHS = {   # name: (TrainConfig overrides, bound on max relative weight error vs the fp32 CPU reference)
    "zero0": ({}, 1e-4),
    "zero1": ({"zero_stage": 1}, 1e-4),
    "zero2": ({"zero_stage": 2}, 1e-4),
    "zero3": ({"zero_stage": 3}, 1e-4),
    "ac-full": ({"activation_checkpointing": "full"}, 1e-4),
    "ac-selective": ({"activation_checkpointing": "selective"}, 1e-4),
    "offload": ({"zero_stage": 2, "offload_optimizer": True}, 1e-4),
    "offload-bf16": ({"zero_stage": 2, "offload_optimizer": True, "precision": "bf16"}, 3e-2),
    "bf16-zero1": ({"zero_stage": 1, "precision": "bf16"}, 3e-2),
}


def path_worker(config: mm.TrainConfig) -> tuple[dict, list[float], str]:
    """One rank on the GPU: train STEPS steps, return the fp32 weights (CPU), losses and where it ran
    (the device, whether the timeline is CUDA events; with offload, whether the host copies use a copy
    stream and pinned memory)."""
    torch.backends.cuda.matmul.allow_tf32 = False          # fp32 means fp32: the reference is CPU fp32
    torch.backends.cudnn.allow_tf32 = False
    mesh = mm.init_mesh(mm.ParallelDims())
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(MODEL), config, mesh)
    for batch in data.batches(mesh, STEPS, config.batch_size, MODEL.block_size, seed=config.seed):
        engine.train_step(batch)
    stamps = [e["time"] for e in engine.report()["timeline"] if "step" in e]   # engine events, resolved
    where = f"{mesh.device}, CUDA-event timeline: {isinstance(engine.clock, CudaClock) and stamps == sorted(stamps)}"
    if config.offload_optimizer:          # the host copies must run on a copy stream, into pinned memory
        stores = [z.store for z in engine.zero_stages]
        streamed = all(isinstance(s.copies, CopyStream) for s in stores)
        pinned = all(m.is_pinned() for s in stores for m in s.master)
        where += f", copy stream: {streamed}, pinned: {pinned}"
    return engine.full_state_dict(), engine.losses, where


def check_paths() -> bool:
    ok = True
    for name, (overrides, bound) in PATHS.items():
        config = parity_config(**overrides)
        ref, ref_losses = reference_run(MODEL, parity_config(), STEPS, seq_len=MODEL.block_size)
        start = time.perf_counter()
        try:
            weights, losses, device = mm.launch(path_worker, 1, config, backend="nccl", timeout=120)[0]
        except Exception as exc:                         # report every path, then fail at the end
            print(f"{name:14} FAILED: {str(exc).splitlines()[0]}")
            ok = False
            continue
        err = max_rel_error(weights, ref)
        passed = err <= bound and device.startswith("cuda") and "False" not in device
        ok &= passed
        print(f"{name:14} {'ok  ' if passed else 'FAIL'} on {device}: max rel weight error {err:.2e} "
              f"(bound {bound:.0e}), final loss {losses[-1]:.4f} vs CPU {ref_losses[-1]:.4f} "
              f"[{time.perf_counter() - start:.1f} s]")
    return ok


def engine_throughput(batch: int, steps: int) -> dict:
    """GPT-2 124M through the engine on one GPU in bf16 (ZeRO-1 at world 1: fp32 masters, bf16 compute)."""
    cfg = mm.GPTConfig.gpt2()
    config = mm.TrainConfig(zero_stage=1, precision="bf16", batch_size=batch, lr=3e-4)
    mesh = mm.init_mesh(mm.ParallelDims())
    torch.manual_seed(0)
    model = mm.GPT(cfg)
    engine = mm.initialize(model, config, mesh)
    n = model.num_params() - cfg.vocab_size * cfg.n_embd - cfg.block_size * cfg.n_embd
    flops_per_token = 6 * n + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size
    for step, b in enumerate(data.batches(mesh, steps + 3, batch, cfg.block_size)):
        if step == 3:
            torch.cuda.synchronize()
            start = time.perf_counter()
        loss = engine.train_step(b)
    torch.cuda.synchronize()
    tok_s = batch * cfg.block_size * steps / (time.perf_counter() - start)
    return {"tokens_per_s": tok_s, "flops_per_token": flops_per_token, "loss": loss}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="dense bf16 peak of the GPU (default: H100/H200 SXM, 989)")
    parser.add_argument("--device-check-only", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu_check.py needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"GPU: {torch.cuda.get_device_name()} ({torch.cuda.device_count()} visible)")
    ok = check_paths()
    if not args.device_check_only:
        ours = mm.launch(engine_throughput, 1, args.batch, args.steps, backend="nccl", timeout=300)[0]
        from gpu_throughput import plain_torch
        plain = plain_torch(args.batch, args.steps)
        peak = args.peak_tflops * 1e12
        for name, r in (("minimega engine", ours), ("plain torch loop", plain)):
            mfu = r["tokens_per_s"] * r["flops_per_token"] / peak
            print(f"gpt2 124M bf16, batch {args.batch} x 1024, {name:16}: {r['tokens_per_s']:>10,.0f} tokens/s, "
                  f"MFU {100 * mfu:5.1f}% (peak {args.peak_tflops:g} TFLOP/s)")
        print(f"engine / plain torch tokens/s: {ours['tokens_per_s'] / plain['tokens_per_s']:.2f}")
    print("all paths within bounds" if ok else "SOME PATHS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
