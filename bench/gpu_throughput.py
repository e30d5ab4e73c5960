"""Tokens/s and MFU of the gpt2() preset on one GPU (bf16 autocast, fused AdamW).

MFU = achieved FLOP/s / peak FLOP/s, with 6N + 12·L·D·T FLOPs per token (PaLM's appendix B accounting,
N = non-embedding parameters). The peak defaults to the H100/H200 SXM dense bf16 figure (989 TFLOP/s);
pass --peak-tflops for other GPUs.
"""
from __future__ import annotations

import argparse
import time

import torch

import minimega as mm
from minimega import data


def plain_torch(batch: int, steps: int) -> dict:
    """A plain torch training loop of the same model: bf16 autocast, fused AdamW, no minimega engine."""
    cfg = mm.GPTConfig.gpt2()
    torch.manual_seed(0)
    model = mm.GPT(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    n = model.num_params() - cfg.vocab_size * cfg.n_embd - cfg.block_size * cfg.n_embd
    flops_per_token = 6 * n + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size
    tokens = batch * cfg.block_size
    for step, (x, y) in enumerate(data.global_batches(steps + 3, batch, cfg.block_size)):
        if step == 3:
            torch.cuda.synchronize()
            start = time.perf_counter()
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return {"tokens_per_s": tokens * steps / (time.perf_counter() - start), "flops_per_token": flops_per_token,
            "loss": loss.item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu_throughput.py needs a CUDA GPU")
    r = plain_torch(args.batch, args.steps)
    mfu = r["tokens_per_s"] * r["flops_per_token"] / (args.peak_tflops * 1e12)
    print(f"gpt2 preset, batch {args.batch} x 1024: {r['tokens_per_s']:,.0f} tokens/s, MFU {100 * mfu:.1f}% "
          f"(peak {args.peak_tflops} TFLOP/s), final loss {r['loss']:.3f}")


if __name__ == "__main__":
    main()
