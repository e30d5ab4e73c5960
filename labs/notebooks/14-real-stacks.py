# %% [markdown]
# # Lab 14 · The real stacks
#
# **Why.** The stacks the field trains with are configured in their own words: a `ds_config.json` for DeepSpeed,
# a `pretrain_gpt.py` command line for Megatron-LM, a TOML job for torchtitan. This lab writes one minimega run in
# all three, reads BLOOM-176B's launch back out of its `TrainConfig`, then trains the same run in DeepSpeed's own
# engine and in minimega's on two ranks and puts both loss curves and both engines' bytes on one figure.

# %%
import json

import plotly.graph_objects as go
from plotly.subplots import make_subplots

import minimega as mm
from minimega.figures import palette
from minimega.tools import export_config, peers
import figures     # labs/figures.py: plotly figures from reports

# %% [markdown]
# ## 1. One run, three configs
# ZeRO-3 in bf16 on 4 ranks, clipping at 1.0. DeepSpeed gets every key it needs, including the persistence threshold
# that keeps DeepSpeed from leaving parameters under 100,000 elements whole on every rank (its default).

# %%
# NBVAL_CHECK_OUTPUT
run = mm.TrainConfig(zero_stage=3, precision="bf16", gradient_clipping=1.0, batch_size=16)
print(json.dumps(export_config.to_deepspeed(run, dp=4), indent=1))

# %% [markdown]
# Megatron-LM spells ZeRO-3 as Megatron-FSDP, and needs its own defaults overwritten (clip 1.0 is also its default;
# the weight decay of 0.01 and β₂ of 0.999 are not minimega's).

# %%
# NBVAL_CHECK_OUTPUT
print(" ".join(export_config.to_megatron(run, 4, mm.GPTConfig.tiny())))

# %% [markdown]
# torchtitan reduces FSDP gradients in float32 only, so a bf16 run that reduces in bf16 cannot be written there:
# the exporter says so, by name. The fp32 run can.

# %%
# NBVAL_CHECK_OUTPUT
try:
    export_config.to_torchtitan(run, 4, mm.GPTConfig.tiny())
except export_config.ExportError as e:
    print(e)
print(export_config.to_torchtitan(run.replace(precision="fp32"), 4, mm.GPTConfig.tiny()))

# %% [markdown]
# ## 2. BLOOM's launch, from its TrainConfig
# `export_config.bloom_176b()` is BLOOM-176B's layout (TP 4 × PP 12 × DP 8 on 384 A100s), micro and global batch,
# bf16, recomputation and optimizer. Compare with its published slurm script (bigscience `tr11-176B-ml.slurm`).

# %%
# NBVAL_CHECK_OUTPUT
bloom = export_config.bloom_176b()
argv = export_config.to_megatron(bloom.train, bloom.dp, bloom.model)
published = {"--tensor-model-parallel-size": "4", "--pipeline-model-parallel-size": "12", "--micro-batch-size": "2",
             "--global-batch-size": "2048", "--seq-length": "2048"}
for flag, value in published.items():
    ours = argv[argv.index(flag) + 1]
    print(f"{flag:32s} published {value:>5s}   exported {ours:>5s}   {'same' if ours == value else 'DIFFERENT'}")
print("--bf16", "exported" if "--bf16" in argv else "missing")
print("ds_config:", json.dumps(export_config.to_deepspeed(bloom.train, bloom.dp, megatron=True)))

# %% [markdown]
# ## 3. The same run in DeepSpeed and in minimega
# Two gloo ranks, the tiny GPT, 10 steps, ZeRO 1, 2 and 3 in fp32 with two accumulation steps and clipping at 0.5.
# Each rank trains minimega's engine, then DeepSpeed's (`deepspeed.initialize` with the exported config and torch's
# AdamW), on the same rows of the same batches. It takes about half a minute.

# %%
missing = peers.deepspeed_missing()
print(missing or "DeepSpeed is installed")
cases = [mm.TrainConfig(zero_stage=s, batch_size=8, gradient_accumulation_steps=2, gradient_clipping=0.5)
         for s in (1, 2, 3)]
results = [] if missing else peers.run_pairs(mm.GPTConfig.tiny(), cases, world_size=2, steps=10)

# %%
# NBVAL_CHECK_OUTPUT
for r in results:
    loss_diff = max(abs(a - b) / b for a, b in zip(r["minimega"]["losses"], r["deepspeed"]["losses"]))
    weight_diff = peers.max_relative_error(r["minimega"]["weights"], r["deepspeed"]["weights"])
    print(f"ZeRO-{r['config'].zero_stage}: {r['deepspeed']['optimizer']:30s} losses and weights equal to 1e-5: "
          f"{loss_diff <= 1e-5 and weight_diff <= 1e-5}")

# %% [markdown]
# ## 4. Losses and bytes, on one figure
# Left: the two engines' loss curves (they lie on top of each other). Right: the bytes each engine holds on one rank
# after training, by category, in the course's colour for each (hatched: DeepSpeed). The parameters and Adam
# moments are the same; DeepSpeed frees its gradients after the step and keeps a separate fp32 copy of its partition
# at stages 1 and 2, where minimega keeps flat gradient buffers and steps its fp32 parameters in place.

# %%
# NBVAL_IGNORE_OUTPUT
fig = make_subplots(rows=1, cols=2, subplot_titles=("loss per step", "bytes held by rank 0 after training"))
symbols = {1: "circle", 2: "square", 3: "diamond"}    # the loss curves stay grey: colour means a memory category
categories = ["params", "grads", "master", "optimizer_states"]
for r in results:
    s = r["config"].zero_stage
    for engine, dash in (("minimega", "solid"), ("deepspeed", "dot")):
        fig.add_trace(go.Scatter(y=r[engine]["losses"], x=list(range(1, 11)), name=f"{engine} ZeRO-{s}",
                                 line=dict(color=palette.REFERENCE, dash=dash), mode="lines+markers",
                                 marker=dict(symbol=symbols[s]), legendgroup=engine), row=1, col=1)
        fig.add_trace(go.Bar(x=[f"ZeRO-{s} {c}" for c in categories],
                             y=[r[engine]["memory"].get(c, 0) / 1024 for c in categories],
                             name=f"{engine} ZeRO-{s} bytes",
                             marker_color=[figures.category_style(c)["marker_color"] for c in categories],
                             marker_pattern_shape="" if engine == "minimega" else "/", showlegend=False),
                      row=1, col=2)
fig.update_xaxes(title_text="step", row=1, col=1)
fig.update_yaxes(title_text="mean cross-entropy (nats)", row=1, col=1)
fig.update_yaxes(title_text="KiB on rank 0 (hatched: DeepSpeed)", row=1, col=2)
fig.update_layout(barmode="group", height=450, legend=dict(orientation="h", y=-0.25))
fig.show()

# %% [markdown]
# **Try it.** Add `precision="bf16"` to the cases: without clipping the two engines give the same bits; with clipping
# at ZeRO-1 and 2 they drift by about 1e-3, because DeepSpeed sums the squared gradient norm in float32 and minimega in
# float64 (chapter 14). Then export `mm.TrainConfig(tp=2)` with `to_deepspeed` and read the refusal.
