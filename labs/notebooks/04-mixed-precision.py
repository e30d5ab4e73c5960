# %% [markdown]
# # Lab 04 · Mixed precision: 16-bit storage, fp32 master weights, loss scaling
#
# **Why.** Storing parameters and gradients in 16 bits halves their bytes and (on GPUs) multiplies the matmul
# throughput. The optimizer still works in fp32: a *master copy* of the weights and Adam's moments stay fp32, since
# updates of ~1e-4 × w vanish in bf16's 8-bit mantissa. That is the ZeRO paper's accounting: 2 + 2 + K bytes per
# parameter with K = 12 (master 4 + two moments 4 + 4). Sums need fp32 too: minimega's bf16, like Megatron-LM's
# `main_grad` and DeepSpeed's BF16_Optimizer, adds each backward's bf16 gradient into an fp32 buffer and reduces that
# buffer over the ranks, so its gradients cost 4 bytes: 2 + 4 + 12 = 18, Megatron's bf16 row. fp16 adds a problem
# bf16 does not have: its 5-bit exponent underflows small gradients, so the loss is *scaled* up before backward and
# the gradients scaled down after.
#
# This lab trains the same model in fp32, bf16 and fp16 on 2 ranks (ZeRO-1, so the master copy is sharded too),
# measures the bytes, and compares the loss curves. The model is small on purpose (n_embd = 32, 16 tokens): CPUs
# emulate bf16 matmuls, about 100× slower than fp32.

# %%
import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from IPython.display import display

import minimega as mm
from minimega import estimate
import checks      # labs/checks.py: the exercise checks
import workers     # labs/workers.py: the functions each rank runs

# %% [markdown]
# ## 1. Three precisions, same seed, same batches

# %%
model = mm.GPTConfig.tiny(n_embd=32)
dp, steps = 2, 30
runs = {precision: mm.launch(workers.train, dp, model,
                             mm.TrainConfig(zero_stage=1, precision=precision, batch_size=8, lr=3e-3), steps, 16,
                             timeout=180)
        for precision in ("fp32", "bf16", "fp16")}

# %% [markdown]
# ## 2. Bytes per rank
# With ZeRO-1 the parameters and gradients are whole on each rank; the master copy and Adam's moments are sharded.
# In fp32 the parameters *are* the master weights (no copy), so K = 8; in bf16/fp16 the store keeps an fp32 copy.
# bf16's gradients are its fp32 accumulation buffer (4 bytes, the estimator's "bf16"); fp16 keeps 2-byte gradients,
# reduced in fp16 under the loss scale (the ZeRO paper's "mixed" accounting).

# %%
# NBVAL_CHECK_OUTPUT
numels = workers.unit_numels(model)
psi = sum(numels)
padded = sum(estimate.padded_numel(n, dp) for n in numels)
print(f"Ψ = {psi:,}")
for precision, reports in runs.items():
    m = reports[0]["memory_at_step"]
    states = m["params"] + m["grads"] + m["master"] + m["optimizer_states"]
    formula = estimate.model_state_bytes(padded, dp, 1, precision)
    print(f"{precision}, bytes per parameter on rank 0: params {m['params'] / psi:.0f}, grads {m['grads'] / psi:.0f}, "
          f"fp32 master {m['master'] / psi:.0f}, Adam moments {m['optimizer_states'] / psi:.0f} "
          f"→ {states:,} B on rank 0; ZeRO-1 formula ({precision}) {formula:,.0f} B")

# %% [markdown]
# ### Why bf16 gradients are summed in fp32
# Gradient accumulation and the data-parallel reduction are sums. bf16 stores 7 mantissa bits, so every partial sum
# rounds to within 2^-8 ≈ 0.4% of itself, and the errors add up over micro-steps and ranks. Eight micro-step
# gradients, summed in bf16 and summed in fp32 (each one still computed in bf16), against the exact sum:

# %%
# NBVAL_CHECK_OUTPUT
torch.manual_seed(0)
parts = (torch.randn(8, 100_000) * 1e-3).to(torch.bfloat16)        # 8 micro-steps' bf16 gradients
exact = parts.double().sum(0)
in_bf16, in_fp32 = torch.zeros(100_000, dtype=torch.bfloat16), torch.zeros(100_000)
for g in parts:
    in_bf16 += g                                                    # accumulated where it is stored
    in_fp32 += g.float()                                            # main_grad: accumulated in an fp32 buffer
for name, acc in (("bf16", in_bf16), ("fp32 (main_grad)", in_fp32)):
    err = ((acc.double() - exact).norm() / exact.norm()).item()
    print(f"summed in {name:16}: error {err:.1e} of the gradient's norm")

# %% [markdown]
# ## 3. Loss curves
# bf16 follows fp32 closely: it rounds each matmul's inputs, not the weights the optimizer updates. fp16 starts at the
# default scale 2^16: the first backward overflows, the step is *skipped*, and the scaler lowers the scale (after
# absorbing one overflow: hysteresis 2). Skipped steps are steps the model did not learn from.

# %%
# NBVAL_CHECK_OUTPUT
fp32 = runs["fp32"][0]["losses"]
for precision, reports in runs.items():
    losses = reports[0]["losses"]
    skipped = [e["scale"] for e in reports[0]["timeline"] if e["event"] == "step_skipped"]
    print(f"{precision}: loss {losses[0]:.2f} → {losses[-1]:.2f}; largest gap to fp32 "
          f"{max(abs(a - b) for a, b in zip(losses, fp32)):.2f}; steps skipped {len(skipped)}, scale after each {skipped}")

# %%
# NBVAL_IGNORE_OUTPUT
fig = go.Figure([go.Scatter(y=reports[0]["losses"], name=precision, mode="lines") for precision, reports in runs.items()])
fig.update_layout(title=f"same model, seed and batches: {steps} steps on {dp} ranks", xaxis_title="step",
                  yaxis_title="training loss", height=360)
fig

# %% [markdown]
# ## 4. Why fp16 needs a scale and bf16 does not
# Both keep 16 bits; bf16 spends 8 on the exponent (fp32's range) and 7 on the mantissa, fp16 5 and 10.

# %%
# NBVAL_CHECK_OUTPUT
g = torch.tensor([1e-3, 1e-6, 1e-8, 3e-10])           # gradient magnitudes late in training
for dtype in (torch.float16, torch.bfloat16):
    info = torch.finfo(dtype)
    print(f"{str(dtype):15} smallest normal {info.tiny:.1e}, eps {info.eps:.1e}: gradients "
          f"{[f'{v:.1e}' for v in g.tolist()]} → {[f'{v:.2e}' for v in g.to(dtype).float().tolist()]}")
print(f"fp16 with the loss scaled by 2^16: {[f'{v / 2**16:.2e}' for v in (g * 2**16).to(torch.float16).float().tolist()]}")

# %% [markdown]
# ## 5. FP8: eight bits need a scale per tensor
# FP8 (Micikevicius et al. 2022, arXiv:2209.05433) has two formats: E4M3 for the forward (largest 448, smallest
# subnormal 2^-9) and E5M2 for gradients (57,344 and 2^-16). That is too little range for raw values: activations
# with outlier channels pass 448 and are clipped, and small gradients fall below 2^-16 and become 0. So
# `minimega.train.fp8` multiplies each tensor by its own scale before the cast, s = fp8 max / amax (the largest |x| in its
# history), and divides by s after. One tensor of each kind, cast through `fp8.quantize` with s = 1 and with the
# scale `fp8.DelayedScaling` computes from the tensor's amax:

# %%
# NBVAL_CHECK_OUTPUT
from minimega.train import fp8

limits = {}                                        # the formats' own limits, from torch, not from minimega.train.fp8
for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
    info = torch.finfo(dtype)
    limits[dtype] = (info.max, info.tiny * info.eps)   # largest; smallest subnormal = smallest normal × 2^-mantissa
assert limits == {torch.float8_e4m3fn: (448.0, 2.0 ** -9), torch.float8_e5m2: (57344.0, 2.0 ** -16)}

torch.manual_seed(0)
act = torch.randn(1024, 1024)                                      # (tokens, channels), mostly ~N(0, 1) ...
act[:, :4] = torch.empty(1024, 4).uniform_(400, 600) * torch.randn(1024, 4).sign()    # ... 4 outlier channels ~500
grad = torch.randn(1024, 1024).sign() * 10 ** torch.empty(1024, 1024).uniform_(-7, -3)  # |g| from 1e-7 to 1e-3
for name, x, dtype in (("activations", act, torch.float8_e4m3fn), ("gradients", grad, torch.float8_e5m2)):
    top, smallest = limits[dtype]
    recipe = fp8.DelayedScaling(dtype)
    recipe.observe(x)
    recipe.update()                                                # scale = fp8 max / amax, margin 0
    assert torch.equal(recipe.scale, top / x.abs().max())
    lost = {}
    for how, s in (("no scale", torch.ones(())), ("scaled", recipe.scale)):
        q = fp8.quantize(x, s, dtype)
        back = fp8.dequantize(q, s)
        xs = x * s
        flushed = ((q.float() == 0) & (x != 0)).float().mean().item()
        saturated = ((q.float().abs() == top) & (xs.abs() > top)).float().mean().item()
        assert flushed == (xs.abs() <= smallest / 2).float().mean().item()   # rounds to 0 below half a subnormal
        assert saturated == (xs.abs() > top).float().mean().item()          # clipped above the largest value
        per_value = ((back - x).abs() / x.abs()).mean().item()
        of_norm = ((back - x).norm() / x.norm()).item()
        lost[how] = flushed + saturated
        print(f"{name:11} in {str(dtype)[6:]:13} {how:8} (s = {s.item():.3g}): flushed to 0 {flushed:6.2%}, "
              f"saturated {saturated:5.2%}; error per value {per_value:5.1%}, of the norm {of_norm:5.1%}")
    assert lost["scaled"] < lost["no scale"], (name, lost)

# %% [markdown]
# The activations' scale is below 1: it brings the outliers under 448 (unscaled, their clipping is most of the error
# of the norm), at the price of a few more tiny values flushed. The gradients' is about 6 × 10^7: it lifts the small
# ones out of underflow, where almost half of them were lost. Their error *of the norm* hardly moves, since the
# largest gradients carry the norm and E5M2 holds those either way; the error *per value* shows what the flushed half
# cost. With 3 or 2 mantissa bits, a few per cent of error per value is what fp8 costs even when scaled; training
# copes because the master weights, the gradient sums and the optimizer stay wide.

# %% [markdown]
# ## 6. Precision and learning rate
# Each change re-runs a 2-rank job of 20 steps and draws its loss next to fp32's. Try fp16 with a fixed small scale
# (`loss_scale` = 1: no scaling) and watch whether it learns.

# %%
# NBVAL_IGNORE_OUTPUT
def show_run(precision, loss_scale, lr):
    scale = loss_scale if precision == "fp16" else 0.0      # bf16 needs no scale (TrainConfig refuses one)
    cfg = mm.TrainConfig(zero_stage=1, precision=precision, batch_size=8, lr=lr, loss_scale=scale)
    r = mm.launch(workers.train, 2, model, cfg, 20, 16, timeout=300)[0]
    ref = mm.launch(workers.train, 2, model, mm.TrainConfig(zero_stage=1, batch_size=8, lr=lr), 20, 16, timeout=300)[0]
    skipped = sum(e["event"] == "step_skipped" for e in r["timeline"])
    print(f"{precision}: final loss {r['losses'][-1]:.3f} (fp32 {ref['losses'][-1]:.3f}), {skipped} steps skipped")
    go.Figure([go.Scatter(y=ref["losses"], name="fp32"), go.Scatter(y=r["losses"], name=precision)]).update_layout(
        xaxis_title="step", yaxis_title="loss", height=300).show()


display(widgets.interactive(show_run, precision=["bf16", "fp16"],
                            loss_scale=widgets.Dropdown(options=[("dynamic", 0.0), ("fixed 1", 1.0),
                                                                 ("fixed 2^10", 1024.0)], description="loss scale"),
                            lr=widgets.Dropdown(options=[1e-3, 3e-3, 1e-2], value=3e-3, description="lr")))

# %% [markdown]
# ## 7. Exercise: the dynamic loss scaler
# Complete `LossScaler.update(overflow)` in `labs/exercises/loss_scaler.py` (DeepSpeed's rule, written out in the file).
# The check drives yours and `minimega.train.precision.DynamicLossScaler` with the same overflows — hand-made and random
# sequences — and compares the scale and the skip count after every step.

# %%
# NBVAL_CHECK_OUTPUT
mine = checks.exercise("loss_scaler")   # labs/exercises/ (labs/solutions/ if MINIMEGA_LAB_SOLUTIONS=1)
checks.check_loss_scaler(mine.LossScaler)

# %% [markdown]
# **Takeaway.** Mixed precision stores 2 + 2 bytes per parameter and keeps 12 in fp32 for the optimizer: 16 in all,
# the same as fp32 training; bf16 with fp32 gradient sums (`main_grad`) keeps 2 + 4 + 12 = 18. The saving is in
# activations, bandwidth and speed, and ZeRO shards the 12 (from stage 2 the gradients too). bf16 trains like fp32
# with no scaling as long as its sums are fp32; fp16 needs a dynamic loss scale, and pays with the steps it skips.
