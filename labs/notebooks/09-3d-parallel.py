# %% [markdown]
# # Lab 09 · 3D parallelism: laying out BLOOM-176B
#
# **Why.** No single technique trains a 176 B-parameter model *efficiently*. BLOOM (BigScience, 2022, trained with
# Megatron-DeepSpeed) used all three on 384 A100s (80 GB): tensor parallelism tp = 4 inside a node, pipeline
# parallelism pp = 12 across nodes, data parallelism dp = 8 over the rest, plus DeepSpeed's BF16_Optimizer (its own
# ZeRO-1, with an unsharded fp32 gradient buffer), bf16 and full activation recomputation. Each choice divides a different part
# of the memory, and costs a different kind of communication.
#
# This lab uses the estimator to lay out BLOOM, then runs a real 4-rank job in three layouts to check that the
# layouts compute the same thing.

# %%
import ipywidgets as widgets
from IPython.display import display

import minimega as mm
from minimega import estimate
import checks      # labs/checks.py: the exercise checks
import figures     # labs/figures.py: plotly figures from reports
import workers     # labs/workers.py: the functions each rank runs

GB = 1e9

# %% [markdown]
# ## 1. BLOOM's layout, per GPU
# `estimate.PRESETS["bloom-176b"]` holds the published shape and layout; `memory_per_gpu` counts the first pipeline
# stage's GPU: the embedding and 5 blocks (the tr11 notes' partition counts the embedding as a layer), no position
# table (BLOOM uses ALiBi), fp32 gradients.

# %%
# NBVAL_CHECK_OUTPUT
bloom = estimate.PRESETS["bloom-176b"]
cfg = estimate.MemoryConfig(**bloom)
mem = estimate.memory_per_gpu(cfg)
total_params = estimate.gpt_params(bloom["layers"], bloom["hidden"], bloom["vocab"], 0)  # ALiBi: no position table
print(f"BLOOM: {total_params / 1e9:.1f} B parameters; layout tp={cfg.tp} × pp={cfg.pp} × dp={cfg.dp} = "
      f"{cfg.tp * cfg.pp * cfg.dp} GPUs, ZeRO-{cfg.zero_stage}, {cfg.precision}, recompute={cfg.recompute}, "
      f"m={cfg.micro_batches} micro-batches of {cfg.micro_batch}")
print(f"one GPU of the first stage holds {mem['stage_params'] / 1e9:.2f} B parameters")
for k in ("params", "grads", "optimizer", "gathered", "activations", "recompute", "total"):
    print(f"  {k:12} {mem[k] / GB:7.2f} GB")
print(f"pipeline bubble (p-1)/(m+p-1) = {estimate.bubble_fraction(cfg.pp, cfg.micro_batches):.3f}")

# %% [markdown]
# ## 2. Other ways to spend 384 GPUs
# The same model and batch (2048 sequences), other layouts. Memory is one test; the other is what each GPU sends over
# dp per step (`estimate.comm_bytes_per_step` on its stage's parameters, bf16): ZeRO-3 over hundreds of GPUs fits,
# but all-gathers every parameter twice per step across nodes. pp with few micro-batches per replica pays in bubble.

# %%
# NBVAL_CHECK_OUTPUT
gpus, batch = 384, 2048
layouts = {"BLOOM (tp4 pp12 dp8)": dict(tp=4, pp=12, dp=8), "tp8 pp12 dp4": dict(tp=8, pp=12, dp=4),
           "tp4 pp24 dp4": dict(tp=4, pp=24, dp=4), "tp1 pp12 dp32": dict(tp=1, pp=12, dp=32),
           "tp4 pp1 dp96, ZeRO-3": dict(tp=4, pp=1, dp=96, zero_stage=3),
           "dp384, ZeRO-3": dict(tp=1, pp=1, dp=384, zero_stage=3)}
rows = {}
for name, layout in layouts.items():
    m = max(1, batch // (layout["dp"] * bloom["micro_batch"]))
    c = estimate.MemoryConfig(**{**bloom, **layout, "micro_batches": m})
    rows[name] = estimate.memory_per_gpu(c)
    sent = estimate.comm_bytes_per_step(rows[name]["stage_params"], c.dp, c.zero_stage, bytes_per_elem=2)
    bubble = f"bubble {estimate.bubble_fraction(c.pp, m):.3f} (m = {m})" if c.pp > 1 else "no pipeline"
    print(f"{name:22} {rows[name]['total'] / GB:6.1f} GB per GPU, fits 80 GB: {str(rows[name]['total'] < 80 * GB):5}, "
          f"dp traffic {sent / GB:7.1f} GB per GPU per step, {bubble}")

# %%
# NBVAL_IGNORE_OUTPUT
parts = ["params", "grads", "optimizer", "gathered", "activations", "recompute"]
figures.estimate_stack(rows, "BLOOM-176B on 384 GPUs: memory per GPU by layout", limit_gb=80, log=True)

# %% [markdown]
# ## 3. Design your own
# Move the sliders: the estimate redraws instantly (no job runs).

# %%
# NBVAL_IGNORE_OUTPUT
def design(tp, pp, dp, zero_stage, recompute):
    m = max(1, batch // (dp * bloom["micro_batch"]))
    c = estimate.MemoryConfig(**{**bloom, "tp": tp, "pp": pp, "dp": dp, "zero_stage": zero_stage,
                                 "recompute": recompute, "micro_batches": m})
    r = estimate.memory_per_gpu(c)
    print(f"{tp * pp * dp} GPUs; {r['total'] / GB:.1f} GB per GPU "
          f"({', '.join(f'{p} {r[p] / GB:.1f}' for p in parts)}); bubble "
          f"{estimate.bubble_fraction(pp, m) if pp > 1 else 0:.3f} with m = {m}")


display(widgets.interactive(design, tp=widgets.Dropdown(options=[1, 2, 4, 8], value=4, description="tp"),
                            pp=widgets.Dropdown(options=[1, 2, 5, 10, 14, 35, 70], value=14, description="pp"),
                            dp=widgets.Dropdown(options=[1, 2, 4, 8, 16, 32], value=8, description="dp"),
                            zero_stage=widgets.IntSlider(value=1, min=0, max=3, description="ZeRO"),
                            recompute=["full", "selective", "none"]))

# %% [markdown]
# ## 4. Real layouts of 4 ranks
# Three layouts of the same 4 gloo ranks train the tiny GPT on the same global batch: dp = 4; dp = 2 × tp = 2;
# dp = 2 × pp = 2. Each must give the same losses (the math is the model's) while each rank holds and sends different
# bytes. All three run DDP over dp (`zero_stage=0`), so the only difference is the split.

# %%
runs = {name: mm.launch(workers.train, 4, "tiny", c, 2, 32, timeout=180) for name, c in {
    "dp4": mm.TrainConfig(batch_size=8),
    "dp2 × tp2": mm.TrainConfig(tp=2, batch_size=8),
    "dp2 × pp2": mm.TrainConfig(pp=2, micro_batches=2, batch_size=8)}.items()}

# %%
# NBVAL_CHECK_OUTPUT
psi = runs["dp4"][0]["n_params"]
ref = runs["dp4"][0]["losses"]
for name, reports in runs.items():
    gap = max(abs(a - b) for a, b in zip(reports[0]["losses"], ref))
    print(f"{name:10} losses {[round(x, 4) for x in reports[0]['losses']]} (within 1e-5 of dp4: {gap < 1e-5}); "
          f"parameter bytes per rank {[r['memory_at_step']['params'] for r in reports]} (4Ψ = {4 * psi:,}); "
          f"sent per step by rank 0 {reports[0]['comm_per_step'][-1]:,.0f} B")

# %% [markdown]
# tp and pp each halve the parameters a rank holds (tp: each block's matrices; pp: the blocks), and dp over 2 instead
# of 4 sends less gradient traffic per rank; tp adds activation all-reduces, pp point-to-point activations.
#
# ## 5. Exercise: the rank grid
# Which ranks form a tp group, a dp group, a pipeline? minimega lays ranks on `arange(world).view(pp, dp, tp)`.
# Complete `group_ranks(dp, tp, pp, dim)` in `labs/exercises/rank_grid.py`; the check compares it with the mesh's
# groups on eight layouts.

# %%
# NBVAL_CHECK_OUTPUT
mine = checks.exercise("rank_grid")   # labs/exercises/ (labs/solutions/ if MINIMEGA_LAB_SOLUTIONS=1)
checks.check_rank_grid(mine.group_ranks)

# %% [markdown]
# **Takeaway.** tp divides each layer's weights and activations but must stay inside a node; pp divides the layers and
# costs a bubble that only many micro-batches hide; dp (with ZeRO) divides the optimizer states and scales the batch.
# Memory alone does not force all three: section 2 shows ZeRO-3 over 384 GPUs fits 80 GB too, and Narayanan et al.
# (2021, Table 2) trained a 174.6 B model that way. What the three-way layout buys is speed: at 1536 GPUs their
# PTD-P ran at 141 TFLOP/s per GPU against ZeRO-3's 44, because tp and pp keep most traffic inside nodes and between
# neighbours. And every layout computes the same model.
