# %% [markdown]
# # Lab 01 · Memory anatomy: where a rank's bytes go
#
# **Why.** Before splitting a model across GPUs, know what fills one. Training holds the *model states*
# (parameters, their gradients, the optimizer's states) plus activations. With fp32 weights and Adam that is
# 4 + 4 + 8 = **16 bytes per parameter** — and plain data parallelism keeps all 16 on *every* rank.
# This lab measures those bytes on a real 2-rank job instead of taking the formula on faith.
#
# Run the cells top to bottom (Shift+Enter). Jobs run on CPU ranks with gloo; each takes a few seconds.

# %%
import ipywidgets as widgets
import torch
from IPython.display import display

import minimega as mm
import checks      # labs/checks.py: the exercise checks
import figures     # labs/figures.py: plotly figures from reports
import workers     # labs/workers.py: the functions each rank runs

# %% [markdown]
# ## 1. A real job
# `mm.launch` starts 2 ranks; each runs `workers.train`: build the tiny GPT (same seed on every rank), wrap it
# with `mm.initialize` (DDP here), train one step with AdamW (it creates Adam's states), run one more backward (so gradients are resident,
as at the peak of a step) and return `engine.report()`.
# `report()["memory"]` counts the bytes of every resident tensor, by category (`minimega.run.measure`).

# %%
config = mm.TrainConfig(optimizer="adamw", batch_size=8)
reports = mm.launch(workers.train, 2, "tiny", config, 1, 32, True, timeout=180)   # 1 step, seq 32, with grads

# %%
# NBVAL_CHECK_OUTPUT
psi = reports[0]["n_params"]
print(f"Ψ = {psi:,} parameters")
for r in reports:
    print(f"rank {r['rank']}:", ", ".join(f"{k} {v:,} B = {v / psi:.2f} B/param" for k, v in r["memory"].items()))

# %%
# NBVAL_IGNORE_OUTPUT
figures.memory_bars(reports, "tiny GPT, AdamW, fp32: model states on each rank")

# %% [markdown]
# Both ranks hold identical, complete copies: 2 × 16 bytes per parameter for a job that needs 16 once.
# That redundancy is exactly what ZeRO removes (lab 03).
#
# ## 2. Change the model and the optimizer
# Each change re-runs a 2-rank job for one step. Compare `sgd` (no optimizer state at all) with `adam`, and
# the `tiny` preset (0.23 M parameters) with `small` (10.9 M).

# %%
# NBVAL_IGNORE_OUTPUT
def show_memory(preset, optimizer):
    rs = mm.launch(workers.train, 2, preset, mm.TrainConfig(optimizer=optimizer, batch_size=2), 1, 16, True,
                   timeout=300)
    total = sum(rs[0]["memory"].values())
    print(f"{preset}, {optimizer}: {total / rs[0]['n_params']:.2f} bytes per parameter on each rank")
    figures.memory_bars(rs, f"{preset} GPT, {optimizer}, fp32").show()


controls = widgets.interactive(show_memory, preset=["tiny", "small"], optimizer=["sgd", "adam", "adamw"])
display(controls)

# %% [markdown]
# ## 3. Exercise: count the bytes yourself
# Open `labs/exercises/memory.py` and complete `model_state_bytes(param_numels, optimizer)`. The check trains
# real models with SGD, Adam and AdamW, measures the bytes, and tells you what is off.
# Hint: after one step, look at `optimizer.state[p]` for one parameter `p`.

# %%
# NBVAL_CHECK_OUTPUT
mine = checks.exercise("memory")          # labs/exercises/memory.py (labs/solutions/ if MINIMEGA_LAB_SOLUTIONS=1)
checks.check_model_state_bytes(mine.model_state_bytes)

# %% [markdown]
# ## 4. Use it at scale
# A model on the `meta` device has shapes but no storage, so you can count GPT-2's states without allocating them.

# %%
# NBVAL_CHECK_OUTPUT
with torch.device("meta"):
    gpt2 = mm.GPT(mm.GPTConfig.gpt2())
numels = [p.numel() for p in gpt2.parameters()]
for optimizer in ("sgd", "adamw"):
    states = mine.model_state_bytes(numels, optimizer)
    print(f"GPT-2 ({sum(numels) / 1e6:.0f} M params), {optimizer:5}: {sum(states.values()) / 2**30:.2f} GiB of "
          f"model states on every data-parallel rank")

# %% [markdown]
# **Takeaway.** Model states cost 16 bytes per parameter with fp32 Adam (ZeRO's mixed-precision accounting gives
# the same 16: 2 + 2 + 12). A 7.5 B-parameter model needs 120 GB of them before a single activation — more than
# one GPU holds, and data parallelism replicates it on every rank.
