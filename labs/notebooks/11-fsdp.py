# %% [markdown]
# # Lab 11 · FSDP2: PyTorch's ZeRO-3, side by side with minimega's
#
# **Why.** In PyTorch, ZeRO stage 3 is *Fully Sharded Data Parallel*. Its second version, FSDP2
# (`torch.distributed.fsdp.fully_shard`), is what torchtitan and most new PyTorch training code use. The idea is the
# one of lab 03 — parameters, gradients and optimizer states sharded over the data-parallel ranks, parameters
# gathered just in time — with its own names and one design change: each parameter is sharded on its own, as a
# `DTensor`, instead of flattened into one buffer.
#
# This lab trains the same model, on the same batches, with minimega's ZeRO-3 and with FSDP2 on 2 ranks, and compares.

# %%
import ipywidgets as widgets
import plotly.graph_objects as go
from IPython.display import display

import minimega as mm
from minimega.zero import model_units, padded_numel, shard_bounds
import checks      # labs/checks.py: the exercise checks
import workers     # labs/workers.py: the functions each rank runs

# %% [markdown]
# ## 1. Same model, same data, two implementations
# `workers.train_fsdp2` wraps each block with `fully_shard`, then the whole model (the root group: embeddings, final
# norm, head), and trains with the same torch AdamW as minimega's engine.

# %%
config = mm.TrainConfig(zero_stage=3, batch_size=8)
steps = 5
fsdp2 = mm.launch(workers.train_fsdp2, 2, "tiny", config, steps, 32, timeout=180)
zero3 = mm.launch(workers.train, 2, "tiny", config, steps, 32, timeout=180)

# %%
# NBVAL_CHECK_OUTPUT
for name, reports in (("minimega ZeRO-3", zero3), ("torch FSDP2", fsdp2)):
    print(f"{name:16} losses {[round(x, 5) for x in reports[0]['losses']]}")
gap = max(abs(a - b) for a, b in zip(zero3[0]["losses"], fsdp2[0]["losses"]))
print(f"largest difference {'< 1e-5' if gap < 1e-5 else f'{gap:.2e}'}")
print(f"parameter bytes on rank 0: ZeRO-3 {zero3[0]['memory_at_step']['params']:,}, "
      f"FSDP2 {fsdp2[0]['local_param_bytes']:,} (Ψ = {zero3[0]['n_params']:,}, 4Ψ/2 = {2 * zero3[0]['n_params']:,})")

# %%
# NBVAL_IGNORE_OUTPUT
go.Figure([go.Scatter(y=zero3[0]["losses"], name="minimega ZeRO-3", line=dict(width=6, color="#bbb")),
           go.Scatter(y=fsdp2[0]["losses"], name="torch FSDP2", mode="markers", marker=dict(size=10))]).update_layout(
    title="same seed, same batches, same AdamW", xaxis_title="step", yaxis_title="loss", height=320)

# %% [markdown]
# ## 2. Flat shards vs per-parameter shards
# minimega cuts each unit's flat buffer into equal pieces: rank 0 holds the first half of the block's *elements*,
# which ends in the middle of some parameter. FSDP2 gives every parameter placement `Shard(0)`: each rank holds a
# slice of its rows, so every local piece is still a matrix (a `DTensor`'s `to_local()`).

# %%
# NBVAL_CHECK_OUTPUT
gpt = mm.GPT(mm.GPTConfig.tiny())
name, params = model_units(gpt)[1]                      # blocks.0
numel = sum(p.numel() for _, p in params)
start, end = shard_bounds(numel, 2, 0)
offset = 0
print(f"minimega, unit {name}: flat buffer of {numel:,} elements (padded {padded_numel(numel, 2):,}); rank 0 owns [{start:,}, {end:,})")
for pname, p in params:
    mine = max(0, min(end, offset + p.numel()) - max(start, offset))
    print(f"  {pname:30} {str(tuple(p.shape)):12} rank 0 holds {mine:>6,} of {p.numel():>6,} elements")
    offset += p.numel()
print("FSDP2, rank 0:")
for pname, (local, full, placement) in list(fsdp2[0]["local"].items())[2:8]:
    print(f"  {pname:30} {str(full):12} placement {placement}, to_local() {local}")

# %% [markdown]
# Per-parameter sharding costs FSDP2 a copy into a flat buffer before each collective, and buys a lot: every parameter
# stays a tensor of its own shape (checkpointing, optimizers and tensor parallelism see ordinary `DTensor`s), and
# parameters can be frozen or have their own dtype without breaking a shared buffer.
#
# ## 3. What FSDP2 calls things
#
# | minimega / DeepSpeed | FSDP2 |
# | --- | --- |
# | ZeRO stage 3 (`zero_stage=3`) | `fully_shard(module)` with `reshard_after_forward=True` (the default) |
# | ZeRO stage 2 (parameters stay whole after forward) | `reshard_after_forward=False` (gradients and optimizer states still sharded) |
# | a *unit*, one `FlatUnit` (embeddings, one block, the head) | one `fully_shard` call → an `FSDPParamGroup`; the root call takes what no inner call took |
# | flat shard `flat[r·N/dp : (r+1)·N/dp]` | per-parameter `DTensor` with placement `Shard(0)`; `param.to_local()` |
# | `Zero3.unshard(k)` / `reshard(k)` | `FSDPModule.unshard()` / `reshard()` (called by hooks, or by you) |
# | prefetch the next unit's all-gather | implicit for the next group; explicit with `set_modules_to_forward_prefetch` / `set_modules_to_backward_prefetch` |
# | `no_sync()` for gradient accumulation | `set_requires_gradient_sync(False)` |
# | `precision="bf16"` (bf16 storage, fp32 master) | `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)` (sharded parameters stay fp32: they are the master) |
# | `offload_optimizer=True` (master + moments on the CPU) | `CPUOffloadPolicy()` (sharded parameters, gradients and the optimizer step on the CPU) |
# | `param_persistence_threshold` (small parameters kept whole) | not applying `fully_shard` to a module, or to its parent only |
# | `Engine.full_state_dict()` | `get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))`, or `p.full_tensor()` |
#
# ## 4. Losses for more steps and learning rates
# Each change re-runs both jobs on 2 ranks.

# %%
# NBVAL_IGNORE_OUTPUT
def compare(steps, lr):
    cfg = mm.TrainConfig(zero_stage=3, batch_size=8, lr=lr)
    a = mm.launch(workers.train, 2, "tiny", cfg, steps, 16, timeout=300)[0]["losses"]
    b = mm.launch(workers.train_fsdp2, 2, "tiny", cfg, steps, 16, timeout=300)[0]["losses"]
    print(f"largest difference over {steps} steps: {max(abs(x - y) for x, y in zip(a, b)):.2e}")


display(widgets.interactive(compare, steps=widgets.IntSlider(value=5, min=2, max=20, description="steps"),
                            lr=widgets.Dropdown(options=[1e-3, 3e-3, 1e-2], value=1e-3, description="lr")))

# %% [markdown]
# ## 5. Exercise: FSDP2's piece of a parameter
# Complete `fsdp_local_shard(full, world, rank)` in `labs/exercises/fsdp_shard.py`. The check calls `fully_shard` on
# parameters of awkward shapes (7 rows over 3 ranks, 1 row over 3 ranks, ...) on 3 gloo ranks and compares your piece
# with each rank's `to_local()`.

# %%
# NBVAL_CHECK_OUTPUT
mine = checks.exercise("fsdp_shard")   # labs/exercises/ (labs/solutions/ if MINIMEGA_LAB_SOLUTIONS=1)
checks.check_fsdp_shard(mine.fsdp_local_shard)

# %% [markdown]
# **Takeaway.** FSDP2 is ZeRO-3 with per-parameter `DTensor` shards: the same bytes per rank (4Ψ/dp of fp32
# parameters here), the same losses on the same data, different names. What you learnt about units, prefetch,
# resharding after forward and the 1.5× traffic carries over word for word.
