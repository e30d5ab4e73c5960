# %% [markdown]
# # Lab 07 · Tensor parallelism: split the layers, communicate activations
#
# **Why.** Data parallelism replicates every weight (lab 01). Tensor parallelism (Megatron-LM, arXiv:1909.08053)
# splits each block's matrices over tp ranks: attention by heads, the MLP's first matrix by columns and its second
# by rows. Each rank then holds 1/tp of the block's weights — and of their gradients and Adam states. The price:
# the ranks must combine *activations* inside every layer, with two all-reduces forward and two backward per block.
#
# This lab runs the same tiny GPT as 2-way data parallelism and as 2-way tensor parallelism and compares what each
# rank holds and sends.

# %%
import ipywidgets as widgets
from IPython.display import display

import minimega as mm
import checks      # labs/checks.py: the exercise checks
import figures     # labs/figures.py: plotly figures from reports
import workers     # labs/workers.py: the functions each rank runs

# %% [markdown]
# ## 1. Two layouts of 2 ranks
# `TrainConfig(tp=2)` makes both ranks one tensor-parallel group (dp = 1); the default is dp = 2.
# Each job trains 2 steps on a global batch of 8 sequences of 32 tokens.

# %%
layouts = {"dp=2": mm.TrainConfig(batch_size=8), "tp=2": mm.TrainConfig(batch_size=8, tp=2)}
runs = {name: mm.launch(workers.train, 2, "tiny", cfg, 2, 32, True, timeout=180) for name, cfg in layouts.items()}

# %%
# NBVAL_CHECK_OUTPUT
model = runs["tp=2"][0]["model"]
L, B, T, D = model.n_layer, 8, 32, model.n_embd
for name, reports in runs.items():
    r = reports[0]
    print(f"{name}: params on rank 0 {r['memory']['params']:,} B, "
          f"sent per step {r['comm_per_step'][-1]:,.0f} B, all-reduces per step "
          f"{r['comm']['by_op']['all_reduce']['calls'] // len(r['losses'])}")
activation = 4 * B * T * D
big = [e for e in runs["tp=2"][0]["comm_events"] if e["op"] == "all_reduce" and e["bytes"] == activation]
print(f"tp=2: {len(big) // len(runs['tp=2'][0]['losses'])} all-reduces of one (B, T, D) fp32 activation ({activation:,} B) per step; "
      f"4 per block × {L} blocks + 2 (embedding forward, head backward) = {4 * L + 2}")

# %%
# NBVAL_IGNORE_OUTPUT
figures.memory_bars([runs[n][0] for n in runs], "rank 0's model states: dp=2 vs tp=2", labels=list(runs)).show()
figures.comm_by_op([runs[n][0] for n in runs], list(runs), "what rank 0 sends per step").show()

# %% [markdown]
# Tensor parallelism halves every sharded matrix (the LayerNorms and the position embedding stay whole), but the
# bytes it sends are activations: they grow with B·T, are paid in every layer and sit on the critical path
# (the next layer waits for them). That is why tp stays inside a node, on NVLink.
#
# ## 2. Sequence parallelism
# With `sequence_parallel=True` the LayerNorms between the blocks work on T/tp of the sequence: each all-reduce
# becomes a reduce-scatter plus an all-gather — the same bytes (lab 02's exercise), but activations outside the
# matmuls are no longer replicated. Toggle it and compare the collectives.

# %%
# NBVAL_IGNORE_OUTPUT
def show_layout(tp, sequence_parallel):
    if sequence_parallel and tp == 1:
        print("sequence parallelism needs tp > 1")
        return
    cfg = mm.TrainConfig(batch_size=8, tp=tp, sequence_parallel=sequence_parallel)
    r = mm.launch(workers.train, 2, "tiny", cfg, 1, 32, timeout=300)[0]
    label = f"tp={tp}" + (", sp" if sequence_parallel else "")
    print({op: row["calls"] for op, row in r["comm"]["by_op"].items()}, "calls in one step")
    figures.comm_by_op([r], [label], f"{label}: bytes rank 0 sends per step, by collective").show()


display(widgets.interactive(show_layout, tp=widgets.Dropdown(options=[1, 2], value=2, description="tp"),
                            sequence_parallel=widgets.Checkbox(value=True, description="sequence parallel")))

# %% [markdown]
# ## 3. Exercise: Megatron's `f` and `g`
# A split MLP needs two communication regions: `f` before the column-parallel matrix (forward: identity;
# backward: all-reduce) and `g` after the row-parallel one (forward: all-reduce; backward: identity).
# Complete `CopyToTP` and `ReduceFromTP` in `labs/exercises/tp_regions.py`. The check builds an MLP split over 2
# ranks with your regions and compares its output and all gradients with the unsplit MLP.

# %%
# NBVAL_CHECK_OUTPUT
mine = checks.exercise("tp_regions")        # labs/exercises/ (labs/solutions/ if MINIMEGA_LAB_SOLUTIONS=1)
checks.check_tp_regions(mine.CopyToTP, mine.ReduceFromTP)

# %% [markdown]
# **Takeaway.** tp divides the model states of the split layers by tp and multiplies communication: 4L + 2
# activation all-reduces per step, each B·T·D values, on the critical path. Use it inside a node; use data
# parallelism (or ZeRO) across nodes.
