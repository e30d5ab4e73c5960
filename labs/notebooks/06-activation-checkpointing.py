# %% [markdown]
# # Lab 06 · Activation checkpointing: trade compute for memory
#
# **Why.** Besides the model states (lab 01), backward needs what the forward pass saved: every block's inputs,
# its matmul outputs, its attention weights. That grows with batch × sequence length and soon dominates.
# *Checkpointing* keeps only each block's input and recomputes the rest during backward — about one extra forward
# pass of compute for most of the activation memory. *Selective* checkpointing recomputes only the attention core.
#
# This lab measures the saved bytes tensor by tensor, then times a real 2-rank job in each mode.

# %%
import ipywidgets as widgets
from IPython.display import display

import minimega as mm
import checks      # labs/checks.py: the exercise checks
import figures     # labs/figures.py: plotly figures from reports
import workers     # labs/workers.py: the functions each rank runs

# %% [markdown]
# ## 1. What backward keeps
# `workers.saved_activations` runs one forward of the tiny GPT under `torch.autograd.graph.saved_tensors_hooks` and
# adds up every tensor saved for backward (parameters excluded). Batch 8, sequence lengths 16 to 64.

# %%
modes, lengths = ("none", "selective", "full"), (16, 32, 64)
saved = {m: [workers.saved_activations("tiny", m, 8, t) for t in lengths] for m in modes}

# %%
# NBVAL_CHECK_OUTPUT
for m in modes:
    print(f"{m:9}: " + ", ".join(f"T={t}: {b / 2**20:.2f} MiB" for t, b in zip(lengths, saved[m]))
          + f"  ({saved[m][-1] / saved['none'][-1]:.1%} of none at T={lengths[-1]})")

# %%
# NBVAL_IGNORE_OUTPUT
figures.activation_lines(lengths, {m: [b / 2**20 for b in saved[m]] for m in modes},
                         "tiny GPT, batch 8: bytes kept for backward", "sequence length T (tokens)", "MiB")

# %% [markdown]
# Full checkpointing keeps only each block's (B, T, D) input plus the embedding and head activations. Selective
# checkpointing saves little here: on the CPU, PyTorch's fused attention already keeps only a log-sum-exp instead of
# the (B, heads, T, T) attention weights; with unfused attention at long T that term is the largest one.
#
# ## 2. The price: recomputation in a real job
# The same 2-rank DDP job in each mode. The losses must be identical — checkpointing changes when things are
# computed, not what.

# %%
runs = {m: mm.launch(workers.train, 2, "tiny", mm.TrainConfig(batch_size=8, activation_checkpointing=m), 3, 64,
                     timeout=180) for m in modes}

# %%
# NBVAL_CHECK_OUTPUT
print("losses identical in every mode:", all(r[0]["losses"] == runs["none"][0]["losses"] for r in runs.values()))

# %%
def backward_ms(report):
    t = {}
    for e in report["timeline"]:
        if e.get("step", 0) >= 1 and e["event"] in ("backward_start", "backward_end"):
            t.setdefault(e["step"], {})[e["event"]] = e["time"]
    return 1e3 * sum(v["backward_end"] - v["backward_start"] for v in t.values()) / len(t)


for m in modes:
    print(f"{m:9}: backward {backward_ms(runs[m][0]):6.1f} ms per step on rank 0 (recomputation happens here)")

# %% [markdown]
# ## 3. Try other shapes
# Saved bytes of one forward for a model preset, a mode and a sequence length (measured on this process).

# %%
# NBVAL_IGNORE_OUTPUT
def show_saved(preset, seq_len):
    row = {m: workers.saved_activations(preset, m, 4, seq_len) / 2**20 for m in modes}
    print(", ".join(f"{m}: {v:.1f} MiB" for m, v in row.items()))
    figures.activation_bars(row, f"{preset}, batch 4, T={seq_len}: bytes kept for backward", "MiB").show()


display(widgets.interactive(show_saved, preset=["tiny", "small"],
                            seq_len=widgets.Dropdown(options=[16, 32, 64, 128], value=32, description="T")))

# %% [markdown]
# ## 4. Exercise: write the checkpoint
# Complete the autograd Function `Checkpoint` in `labs/exercises/checkpoint.py`: forward keeps only the input (and
# the RNG state), backward recomputes and backpropagates. The check compares your checkpointed GPT block with the
# plain one, with and without dropout, and counts the bytes it keeps.

# %%
# NBVAL_CHECK_OUTPUT
mine = checks.exercise("checkpoint")        # labs/exercises/ (labs/solutions/ if MINIMEGA_LAB_SOLUTIONS=1)
checks.check_checkpoint(mine.Checkpoint)

# %% [markdown]
# **Takeaway.** Full checkpointing cuts activation memory to one (B, T, D) tensor per block for about a third more
# compute per step (one extra forward); selective checkpointing targets the T² attention term, nearly free to recompute.
