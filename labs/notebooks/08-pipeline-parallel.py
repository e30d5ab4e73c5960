# %% [markdown]
# # Lab 08 · Pipeline parallelism: GPipe vs 1F1B
#
# **Why.** Pipeline parallelism cuts the model's layers into p stages, one per rank, and streams m micro-batches
# through them. Stages wait for each other at the start and the end of a step — the *bubble*, a share
# (p−1)/(m+p−1) of the step for both GPipe and 1F1B. What differs is memory: GPipe runs all m forwards before any
# backward, so the first stage holds the activations of m micro-batches; 1F1B starts backwards as early as it can
# and holds at most p.
#
# This lab trains the tiny GPT with `pp=2` under both schedules, draws what each rank did, and counts the bubble
# and the micro-batches in flight.

# %%
import ipywidgets as widgets
from IPython.display import display

import minimega as mm
from minimega import estimate
from minimega.figures import plots
from minimega.pipeline import plan
from minimega.pipeline.printer import grid_from_timelines, render
import checks      # labs/checks.py: the exercise checks
import workers     # labs/workers.py: the functions each rank runs

# %% [markdown]
# ## 1. Two schedules, same model
# 2 ranks (pp = 2, dp = 1): rank 0 runs the embeddings and blocks 0-1, rank 1 blocks 2-3 and the head.
# The batch of 8 sequences is cut into m = 4 micro-batches of 2; activations (2, 32, 64) travel rank 0 → 1 in
# forward and their gradients 1 → 0 in backward.

# %%
p, m = 2, 4
runs = {schedule: mm.launch(workers.train, p, "tiny",
                            mm.TrainConfig(pp=p, schedule=schedule, micro_batches=m, batch_size=8), 2, 32,
                            timeout=180)
        for schedule in ("gpipe", "1f1b")}

# %% [markdown]
# ## 2. What each rank did, slot by slot
# Each rank walks the schedule's slot grid (`minimega.pipeline.plan`): one forward or backward of one micro-batch per
# slot, `.` when it waits. The grids below are read back from what the ranks recorded (`report()["timeline"]`).

# %%
# NBVAL_CHECK_OUTPUT
for schedule, reports in runs.items():
    print(f"{schedule}:")
    print(render(grid_from_timelines([r["timeline"] for r in reports], step=1)))
    print()
print("losses: gpipe", [round(x, 4) for x in runs["gpipe"][0]["losses"]],
      "1f1b", [round(x, 4) for x in runs["1f1b"][0]["losses"]])

# %% [markdown]
# The same passes, the same loss: only their order differs. The timelines below are the wall clock of step 1 on each
# rank (forward, backward, and the p2p transfers); gaps are idle.

# %%
# NBVAL_IGNORE_OUTPUT
for schedule, reports in runs.items():
    plots.pipeline_schedule([r["timeline"] for r in reports], step=1,
                            title=f"{schedule}, p = {p}, m = {m}: step 1 (gaps are idle)").show()

# %% [markdown]
# ## 3. Bubble and memory, counted and predicted
# `report()["pipeline"]` counts the idle slots of the rank's grid and the most micro-batches it held at once
# (forward done, backward not yet: their activations are alive).

# %%
# NBVAL_CHECK_OUTPUT
print(f"formula: bubble (p-1)/(m+p-1) = {estimate.bubble_fraction(p, m):.3f}")
for schedule, reports in runs.items():
    for r in reports:
        b = r["pipeline"]
        print(f"{schedule:5} rank {r['rank']}: idle {b['idle']}/{b['ticks']} slots = {b['idle_of_total']:.3f}, "
              f"peak in flight {b['peak_in_flight']} micro-batches")
    print(f"{schedule:5} formula for rank 0's peak: {estimate.in_flight_microbatches(p, m, schedule):.0f}")

# %% [markdown]
# On 2 CPU ranks the *wall-clock* idle share (`report()["pipeline"]["wall_idle_of_total"]`) is larger than the slot
# count: every transfer is a blocking gloo send of a few KiB, and the ranks share two cores. On GPUs each slot is
# long compared with the transfer, and the two agree.
#
# ## 4. Micro-batches and schedules
# The slot grid needs no run: `plan(schedule, p, m)` places every pass. More micro-batches shrink the bubble;
# 1F1B keeps the memory at p micro-batches whatever m is. The last control re-runs a real 2-rank job and draws it.

# %%
# NBVAL_IGNORE_OUTPUT
def show_plan(schedule, p, m, run_job):
    grid = plan(schedule, p, m)
    print(render([["." if a is None else str(a) for a in row] for row in grid.grid]))
    print(f"bubble (p-1)/(m+p-1) = {estimate.bubble_fraction(p, m):.3f}; "
          f"rank 0 holds up to {estimate.in_flight_microbatches(p, m, schedule):.0f} micro-batches")
    if run_job and p == 2:
        rs = mm.launch(workers.train, 2, "tiny", mm.TrainConfig(pp=2, schedule=schedule, micro_batches=m,
                                                                batch_size=2 * m), 1, 16, timeout=300)
        plots.pipeline_schedule([r["timeline"] for r in rs], step=0).show()


display(widgets.interactive(show_plan, schedule=["gpipe", "1f1b"],
                            p=widgets.IntSlider(value=2, min=2, max=4, description="stages p"),
                            m=widgets.IntSlider(value=4, min=1, max=8, description="micro-batches"),
                            run_job=widgets.Checkbox(value=False, description="run a 2-rank job")))

# %% [markdown]
# ## 5. Exercise: the 1F1B order of one rank
# Complete `one_f_one_b_order(p, m, rank)` in `labs/exercises/one_f_one_b.py`: the list of `("F", i)` / `("B", i)`
# passes rank `rank` runs. Look at the 1F1B grid above: how many forwards does rank 0 run before its first backward,
# and rank 1? The check compares your order with `minimega.pipeline.schedules` for p = 2..4, m = 1..8.

# %%
# NBVAL_CHECK_OUTPUT
mine = checks.exercise("one_f_one_b")   # labs/exercises/ (labs/solutions/ if MINIMEGA_LAB_SOLUTIONS=1)
checks.check_one_f_one_b(mine.one_f_one_b_order)

# %% [markdown]
# **Takeaway.** GPipe and 1F1B idle for the same (p−1)/(m+p−1) of a step — only more micro-batches (or interleaved
# stages) shrink that — but 1F1B holds at most p micro-batches of activations instead of m, so m can grow to hide
# the bubble without running out of memory.
