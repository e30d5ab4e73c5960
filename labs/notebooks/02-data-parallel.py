# %% [markdown]
# # Lab 02 · Data parallelism: bytes on the wire and overlap with backward
#
# **Why.** In data parallelism (DDP) every rank holds the whole model and takes different rows of the batch;
# after backward the ranks average their gradients with an all-reduce. Two facts decide whether that scales:
#
# 1. **Volume.** A ring all-reduce of S bytes sends 2(n−1)/n · S bytes from every rank — almost 2S, whatever n.
#    For fp32 gradients S = 4Ψ.
# 2. **Overlap.** Gradients are grouped into *buckets*; a bucket's all-reduce starts as soon as its last
#    gradient is ready, while backward keeps computing earlier layers.
#
# This lab measures both on a real 2-rank gloo job with `minimega.comm.CommLog`.

# %%
import ipywidgets as widgets
from IPython.display import display

import minimega as mm
import checks      # labs/checks.py: the exercise checks
import figures     # labs/figures.py: plotly figures from reports
import workers     # labs/workers.py: the functions each rank runs

# %% [markdown]
# ## 1. A real job
# 2 ranks train the tiny GPT for 3 steps; buckets of 0.05 MiB split its 0.9 MB of gradients into many all-reduces.

# %%
n = 2
config = mm.TrainConfig(batch_size=8, bucket_mb=0.05)
reports = mm.launch(workers.train, n, "tiny", config, timeout=180)

# %%
# NBVAL_CHECK_OUTPUT
psi = reports[0]["n_params"]
ring = 2 * (n - 1) / n * 4 * psi
calls = reports[0]["comm"]["by_op"]["all_reduce"]["calls"] // len(reports[0]["losses"])
print(f"Ψ = {psi:,} fp32 parameters, gradients S = 4Ψ = {4 * psi:,} bytes, {calls} buckets")
for r in reports:
    sent = r["comm_per_step"]
    print(f"rank {r['rank']}: sent per step {[f'{b:,.0f}' for b in sent]} B; 2(n-1)/n · 4Ψ = {ring:,.0f} B; "
          f"equal: {all(b == ring for b in sent)}")
print("losses:", [round(loss, 3) for loss in reports[0]["losses"]],
      "identical on every rank:", all(r["losses"] == reports[0]["losses"] for r in reports))

# %% [markdown]
# ## 2. Overlap: one step on rank 0
# Each red bar is one bucket's all-reduce: it starts when the hook issues it (the bucket's last gradient has just
# been accumulated) and ends when the engine waits for it. Bars that start inside the orange backward bar are
# communication hidden behind compute. Buckets are numbered in the order backward produces them: the last layers first.

# %%
# NBVAL_IGNORE_OUTPUT
figures.step_timeline(reports[0])

# %%
timeline = reports[0]["timeline"]
last = max(e["step"] for e in timeline if "step" in e)
start = next(e["time"] for e in timeline if e.get("step") == last and e["event"] == "backward_start")
end = next(e["time"] for e in timeline if e.get("step") == last and e["event"] == "backward_end")
issued = [e["start"] for e in reports[0]["comm_events"] if e["tag"].startswith("bucket") and start <= e["start"] <= end]
print(f"{len(issued)} all-reduces issued during the backward; the first at {100 * (issued[0] - start) / (end - start):.0f}% "
      "of it, so the rest of backward overlaps communication")

# %% [markdown]
# ## 3. Bucket size and world size
# Each change re-runs a 2-step job. Smaller buckets start communicating earlier but pay a per-call cost more often;
# one huge bucket (25 MiB, torch DDP's default) cannot start before the whole backward is done.
# Watch the bytes per rank as n grows: 2(n−1)/n approaches 2, it does not grow with n.

# %%
# NBVAL_IGNORE_OUTPUT
def show_step(world_size, bucket_mb):
    rs = mm.launch(workers.train, world_size, "tiny", mm.TrainConfig(batch_size=6, bucket_mb=bucket_mb), 2,
                   timeout=300)
    psi = rs[0]["n_params"]
    ring = 2 * (world_size - 1) / world_size * 4 * psi
    print(f"n = {world_size}: sent {rs[0]['comm_per_step'][-1]:,.0f} B per rank per step; "
          f"2(n-1)/n · 4Ψ = {ring:,.0f} B")
    figures.step_timeline(rs[0]).show()


controls = widgets.interactive(show_step, world_size=widgets.IntSlider(value=2, min=1, max=3, description="world size"),
                               bucket_mb=widgets.Dropdown(options=[0.02, 0.05, 0.2, 25.0], value=0.2,
                                                          description="bucket MiB"))
display(controls)

# %% [markdown]
# ## 4. Exercise: an all-reduce from a reduce-scatter and an all-gather
# A ring all-reduce is two phases: a **reduce-scatter** (rank i ends with chunk i of the sum) then an
# **all-gather** (every rank collects every summed chunk); each sends (n−1)/n · S. Complete
# `ring_all_reduce(tensor, group)` in `labs/exercises/ring_all_reduce.py` with `minimega.comm.reduce_scatter` and
# `minimega.comm.all_gather`. The check runs it on 3 gloo ranks, compares with `comm.all_reduce`, and counts its bytes.

# %%
# NBVAL_CHECK_OUTPUT
mine = checks.exercise("ring_all_reduce")   # labs/exercises/ (labs/solutions/ if MINIMEGA_LAB_SOLUTIONS=1)
checks.check_ring_all_reduce(mine.ring_all_reduce)

# %% [markdown]
# **Takeaway.** DDP moves 2(n−1)/n · 4Ψ bytes per rank per step — about 8 bytes per parameter, independent of the
# number of ranks — and hides it behind backward by launching bucket all-reduces as gradients become ready.
# Its memory, though, is the single-GPU memory on every rank (lab 01): ZeRO (lab 03) keeps this traffic and divides the memory.
