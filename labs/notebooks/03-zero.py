# %% [markdown]
# # Lab 03 · ZeRO: shard the model states over the data-parallel ranks
#
# **Why.** Data parallelism keeps every byte of the model states on every rank (lab 01). ZeRO (Rajbhandari et al.,
# arXiv:1910.02054) removes that redundancy one category at a time: stage 1 shards the optimizer states, stage 2
# also the gradients, stage 3 also the parameters. Each rank owns 1/dp of each flat buffer and the ranks exchange
# what they need, when they need it. The price is communication: stages 1 and 2 move as many bytes as DDP, stage 3
# 1.5× as many.
#
# This lab runs all four stages on 2 ranks, measures each rank's bytes by category and its traffic, and compares
# both with the closed forms of `minimega.estimate`.

# %%
import ipywidgets as widgets
from IPython.display import display

import minimega as mm
from minimega import estimate
import checks      # labs/checks.py: the exercise checks
import figures     # labs/figures.py: plotly figures from reports
import workers     # labs/workers.py: the functions each rank runs

# %% [markdown]
# ## 1. Four stages, one job each
# The tiny GPT, fp32, AdamW, 2 ranks, 2 steps. `report()["memory_at_step"]` is measured right after the optimizer
# step, while parameters, gradients and optimizer states are all resident.

# %%
dp = 2
runs = {stage: mm.launch(workers.train, dp, "tiny", mm.TrainConfig(zero_stage=stage, batch_size=8), 2, 32,
                         timeout=180)
        for stage in (0, 1, 2, 3)}

# %% [markdown]
# ## 2. Measured bytes vs the closed form
# ZeRO keeps one flat buffer per *unit* (the embeddings, each block, the head), padded to a multiple of dp so it
# splits into equal shards (`minimega/zero/flat.py`). `estimate.model_state_bytes_padded` applies the ZeRO paper's
# formulas to those padded sizes. In fp32 the parameters are their own master copy, so K = 8 (Adam's two moments):
#
# | stage | params | grads | optimizer states |
# | --- | --- | --- | --- |
# | 0 (DDP) | 4Ψ | 4Ψ | 8Ψ |
# | 1 | 4Ψ | 4Ψ | 8Ψ/dp |
# | 2 | 4Ψ | 4Ψ/dp | 8Ψ/dp |
# | 3 | 4Ψ/dp | 4Ψ/dp | 8Ψ/dp |

# %%
# NBVAL_CHECK_OUTPUT
numels = workers.unit_numels("tiny")
psi = sum(numels)
padded = sum(estimate.padded_numel(n, dp) for n in numels)
print(f"Ψ = {psi:,} elements in {len(numels)} units {numels}; padded to a multiple of dp = {dp}: {padded:,}")
rows = []
for stage, reports in runs.items():
    m = reports[0]["memory_at_step"]
    measured = {"params": m["params"], "grads": m["grads"], "optimizer_states": m["optimizer_states"]}
    formula = estimate.model_state_breakdown(psi if stage == 0 else padded, dp, stage, "fp32")
    formula = {"params": formula["params"], "grads": formula["grads"], "optimizer_states": formula["optimizer"]}
    total = sum(measured.values())
    closed = estimate.model_state_bytes_padded(numels, dp, stage, "fp32")
    rows.append((f"stage {stage}", measured, formula))
    same = all(measured[k] == formula[k] for k in measured)
    print(f"stage {stage}: rank 0 holds {total:>9,} B = {total / psi:5.2f} B/param; formula {closed:>9,.0f} B; "
          f"every category equal: {same}; ranks agree: {all(r['memory_at_step'] == m for r in reports)}")

# %%
# NBVAL_IGNORE_OUTPUT
figures.measured_vs_estimate(rows, f"tiny GPT, fp32 AdamW, dp = {dp}: model states on rank 0", unit="KiB")

# %% [markdown]
# Adam also keeps one `step` counter (a 4-byte scalar) per parameter tensor it updates: DDP's optimizer sees every
# parameter tensor, ZeRO's sees one flat shard per unit. They are listed apart
# (`memory_at_step["optimizer_step_counters"]`): bytes, not bytes per parameter.
#
# ## 3. Bytes on the wire
# Every collective goes through `minimega.comm`, which logs the bytes each rank sends (ring model). DDP all-reduces
# the gradients: 2(n−1)/n · 4Ψ. Stages 1 and 2 reduce-scatter the gradients and all-gather the updated
# parameters: the same 2(n−1)/n · 4Ψ, in two halves. Stage 3 all-gathers the parameters in forward *and again in
# backward* (they were freed in between), then reduce-scatters: 3(n−1)/n · 4Ψ, 1.5× DDP.

# %%
# NBVAL_CHECK_OUTPUT
ddp = runs[0][0]["comm_per_step"][-1]
for stage, reports in runs.items():
    r = reports[0]
    size = psi if stage == 0 else padded
    formula = estimate.comm_bytes_per_step(size, dp, stage, bytes_per_elem=4)
    ops = {op: f"{v['sent_bytes'] / len(r['losses']):,.0f}" for op, v in sorted(r["comm"]["by_op"].items())}
    print(f"stage {stage}: sent {r['comm_per_step'][-1]:>9,.0f} B per step = {r['comm_per_step'][-1] / ddp:.2f} × DDP "
          f"(formula {formula:,.0f} B) by op {ops}")
gap = max(abs(a - b) for rs in runs.values() for a, b in zip(rs[0]["losses"], runs[0][0]["losses"]))
print("losses", [round(x, 4) for x in runs[0][0]["losses"]], "; every stage within 1e-5 of DDP:", gap < 1e-5)

# %%
# NBVAL_IGNORE_OUTPUT
figures.comm_by_op([rs[0] for rs in runs.values()], [f"stage {s}" for s in runs], "bytes sent per step, rank 0")

# %% [markdown]
# The losses agree to float tolerance, not necessarily bit for bit: a reduce-scatter sums in a different order than
# an all-reduce. ZeRO changes *where* the states live, not the math.
#
# ## 4. Stage and dp
# Each change re-runs a 2-step job. With dp = 3 the padding shows: every unit is rounded up to a multiple of 3.

# %%
# NBVAL_IGNORE_OUTPUT
def show_stage(stage, dp):
    rs = mm.launch(workers.train, dp, "tiny", mm.TrainConfig(zero_stage=stage, batch_size=6), 2, 16, timeout=300)
    m = rs[0]["memory_at_step"]
    size = sum(estimate.padded_numel(n, dp) for n in numels) if stage else psi
    f = estimate.model_state_breakdown(size, dp, stage, "fp32")
    measured = {"params": m["params"], "grads": m["grads"], "optimizer_states": m["optimizer_states"]}
    formula = {"params": f["params"], "grads": f["grads"], "optimizer_states": f["optimizer"]}
    print(f"stage {stage}, dp {dp}: {sum(measured.values()) / psi:.2f} B/param on rank 0 "
          f"(formula {sum(formula.values()) / psi:.2f}); sent {rs[0]['comm_per_step'][-1]:,.0f} B per step")
    figures.measured_vs_estimate([(f"stage {stage}, dp {dp}", measured, formula)], "rank 0", unit="KiB").show()


display(widgets.interactive(show_stage, stage=widgets.IntSlider(value=3, min=0, max=3, description="ZeRO stage"),
                            dp=widgets.IntSlider(value=2, min=2, max=3, description="dp")))

# %% [markdown]
# ## 5. At scale
# The same formulas for the ZeRO paper's 7.5 B-parameter model on 64 GPUs, in mixed precision (K = 12):

# %%
# NBVAL_CHECK_OUTPUT
for stage in range(4):
    print(f"stage {stage}: {estimate.model_state_bytes(7.5e9, 64, stage) / 1e9:6.1f} GB per GPU, "
          f"{estimate.comm_bytes_per_step(7.5e9, 64, stage) / 1e9:5.1f} GB sent per step")

# %% [markdown]
# ## 6. Exercise: ZeRO-2's reduce-scatter
# When a unit's last gradient is ready, ZeRO-2 flattens the unit's gradients into one buffer, pads it to a multiple
# of n, and reduce-scatters it: rank r keeps the sum over ranks of shard r and drops the rest. Complete
# `reduce_scatter_grads(grads, group)` in `labs/exercises/zero_reduce_scatter.py`. The check runs it on 3 gloo
# ranks (so padding matters) and compares the shard and the bytes sent with minimega's layout.

# %%
# NBVAL_CHECK_OUTPUT
mine = checks.exercise("zero_reduce_scatter")   # labs/exercises/ (labs/solutions/ if MINIMEGA_LAB_SOLUTIONS=1)
checks.check_zero_reduce_scatter(mine.reduce_scatter_grads)

# %% [markdown]
# **Takeaway.** Each ZeRO stage divides one more category by dp: 16Ψ → 4Ψ + 4Ψ + 8Ψ/dp → 4Ψ + 12Ψ/dp → 16Ψ/dp bytes
# (fp32 Adam). Stages 1 and 2 are free in bytes moved; stage 3 costs 1.5× DDP's traffic because parameters are
# gathered twice per step. Only padding separates the measurement from the formula.
