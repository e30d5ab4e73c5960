# %% [markdown]
# # Lab 12 · Choosing, running and paying for a stack
#
# **Why.** A layout that fits is half a plan; the other half is what the run costs and how long it takes. Published
# runs give real numbers to check the arithmetic against: BLOOM-176B's training log and MT-NLG 530B's iteration times.
# This lab recomputes their throughput from their logs, budgets a run of your own, then measures a real 2-process
# job on this machine and projects its cost with the same functions.

# %%
import time

import ipywidgets as widgets
import plotly.graph_objects as go
from IPython.display import display

import minimega as mm
from minimega import estimate
import workers     # labs/workers.py: the functions each rank runs

# %% [markdown]
# ## 1. Throughput from a log line
# Megatron-style logs print hardware FLOP/s: with full recomputation an iteration costs
# `96·B·s·l·h²·(1 + s/6h + V/16lh)` FLOPs (Narayanan et al. 2021, Eq. 3, `estimate.megatron_hardware_flops`).
# BLOOM's log at the end of epoch one: 104.70 s per iteration, global batch 2048, on 384 GPUs, "TFLOPs: 149.77".
# MT-NLG (Smith et al. 2022 §2.4): 60.1, 50.2 and 44.4 s per iteration on 2240, 2800 and 3360 GPUs, reported as
# 126, 121 and 113 TFLOP/s per GPU.

# %%
# NBVAL_CHECK_OUTPUT
bloom = estimate.megatron_hardware_flops(2048, 2048, 70, 14336, 250880)
print(f"BLOOM: {bloom / 1e18:.2f} EFLOP per iteration -> "
      f"{estimate.achieved_flops_per_gpu(bloom, 104.70, 384) / 1e12:.2f} TFLOP/s per GPU (log: 149.77)")
mtnlg = estimate.megatron_hardware_flops(1920, 2048, 105, 20480, 51200)
for gpus, secs in ((2240, 60.1), (2800, 50.2), (3360, 44.4)):
    per_gpu = estimate.achieved_flops_per_gpu(mtnlg, secs, gpus) / 1e12
    print(f"MT-NLG on {gpus} GPUs: {per_gpu:.0f} TFLOP/s per GPU, "
          f"{estimate.gpu_hours(gpus, secs):.1f} GPU-hours per iteration")

# %% [markdown]
# The GPU-hours per iteration grow as the cluster grows: 1.5× the GPUs finish an iteration 1.35× sooner. Scaling out
# buys time with money.
#
# ## 2. Ideal time against the real run
# Eq. 4: a run of T tokens on n GPUs at X FLOP/s takes about 8TP/(nX) seconds (6 without recomputation). BLOOM's epoch
# one was 325,001,773,056 tokens; the run's reported compute was 1,082,990 GPU-hours (BLOOM paper).

# %%
# NBVAL_CHECK_OUTPUT
ideal = estimate.training_seconds(325_001_773_056, 176.247e9, 384, 149.77e12)
print(f"ideal: {ideal / 86400:.1f} days, {estimate.gpu_hours(384, ideal):,.0f} GPU-hours on 384 GPUs")
print(f"calendar, March 11 to June 28, 2022: 109 days; reported for the whole run: 1,082,990 GPU-hours "
      f"= {1_082_990 / 384 / 24:.1f} days of 384 GPUs")
print(f"the ideal is {100 * estimate.gpu_hours(384, ideal) / 1_082_990:.0f}% of the reported GPU-hours")

# %% [markdown]
# ## 3. Budget your own run
# Set the model size, the tokens, the GPUs and what each sustains; the price is yours to set (no market price is
# assumed here), and the overhead covers spares, storage, failed runs and people.

# %%
# NBVAL_IGNORE_OUTPUT
def budget(params_b, tokens_b, gpus, tflops, recompute, price, overhead_pct):
    secs = estimate.training_seconds(tokens_b * 1e9, params_b * 1e9, gpus, tflops * 1e12, recompute=recompute)
    hours = estimate.gpu_hours(gpus, secs)
    cost = estimate.run_cost(hours, price, overhead=overhead_pct / 100)
    print(f"{secs / 86400:.1f} days on {gpus} GPUs, {hours:,.0f} GPU-hours, {cost:,.0f} in your currency "
          f"({overhead_pct}% overhead)")


display(widgets.interactive(budget, params_b=widgets.FloatText(7, description="params (B)"),
                            tokens_b=widgets.FloatText(1000, description="tokens (B)"),
                            gpus=widgets.IntText(256, description="GPUs"),
                            tflops=widgets.FloatText(150, description="TFLOP/s/GPU"),
                            recompute=widgets.Checkbox(True, description="full recompute"),
                            price=widgets.FloatText(2.0, description="price/GPU-h"),
                            overhead_pct=widgets.IntSlider(30, 0, 100, description="overhead %")))

# %%
# NBVAL_IGNORE_OUTPUT
gpus = [64, 128, 256, 512, 1024]
days = [estimate.training_seconds(1e12, 7e9, n, 150e12) / 86400 for n in gpus]
fig = go.Figure(go.Scatter(x=gpus, y=days, mode="lines+markers", name="ideal days"))
fig.update_layout(title="7B parameters, 1T tokens at 150 TFLOP/s per GPU: ideal days against GPUs",
                  xaxis_title="GPUs", yaxis_title="days", xaxis_type="log", yaxis_type="log", height=380)
fig

# %% [markdown]
# ## 4. Measure, then project
# A real 2-process job on this machine: the tiny GPT, data parallelism, a few steps. Its measured tokens per second,
# set against the model FLOPs per token (`estimate.flops_per_token`, 6N + attention), is this machine's sustained
# FLOP/s, and the same Eq. 4 turns it into a projection. CPU numbers are small; the arithmetic is the same one a
# cluster budget uses.

# %%
# NBVAL_IGNORE_OUTPUT
cfg = mm.GPTConfig.tiny()
train = mm.TrainConfig(batch_size=8)
seq_len, steps = 64, 6
mm.launch(workers.train, 2, "tiny", train, 1, seq_len)          # warm-up: start the ranks once
t0 = time.perf_counter()
reports = mm.launch(workers.train, 2, "tiny", train, steps, seq_len)
wall = time.perf_counter() - t0
tokens = steps * train.batch_size * seq_len
n_params = reports[0]["n_params"]
per_token = estimate.flops_per_token(n_params, cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, seq_len)
achieved = tokens * per_token / wall / 2                      # per process
print(f"{tokens} tokens in {wall:.2f} s on 2 processes: {tokens / wall:,.0f} tokens/s, "
      f"{achieved / 1e9:.2f} GFLOP/s per process (start-up included)")
print(f"projection for 1e9 tokens on 2 processes: "
      f"{estimate.training_seconds(1e9, n_params, 2, achieved, recompute=False) / 3600:.1f} hours")

# %% [markdown]
# **Takeaway.** Throughput from a log, time from Eq. 4, GPU-hours from time × GPUs, money from GPU-hours × price plus
# the overhead the GPUs do not show. The real run is longer than the ideal one (BLOOM's ideal is about four fifths of
# its reported GPU-hours), and scaling out costs more GPU-hours for less time: decide which you need before you start.
