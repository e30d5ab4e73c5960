# %% [markdown]
# # Lab 13 · Predicting step time
#
# **Why.** Before a run starts, a planner needs its step time: FLOPs over the compute roof, bytes over the memory
# roof, messages over the links (chapter 13). This lab checks the model against a published run, calibrates it on
# this machine, predicts minimega's own step time for two layouts, measures them, and then plans BLOOM-176B.

# %%
import ipywidgets as widgets
import plotly.graph_objects as go
from IPython.display import display

import minimega as mm
from minimega.analysis import perf, plan as perf_plan
from minimega.analysis.calibrate import calibrate, predict_minimega
import checks      # labs/checks.py: the exercise checks
import workers     # labs/workers.py: the functions each rank runs

# %% [markdown]
# ## 1. A published run
# BLOOM-176B on 384 A100 80GB: TP 4 × PP 12 × DP 8, micro-batch 2, global batch 2048, full recomputation. Its log
# reads 104.70 s per iteration and 149.77 TFLOP/s per GPU. The model's breakdown, in seconds per step:

# %%
# NBVAL_CHECK_OUTPUT
bloom = perf.step_time(perf.preset_config("bloom-176b"), "a100-80gb")
for part in ("forward", "backward", "recompute", "tp_comm", "p2p", "bubble", "stack_overhead", "dp_comm"):
    print(f"{part:>15}: {bloom[part]:6.2f} s")
print(f"total {bloom['total']:.1f} s (log 104.70), {bloom['tflops_per_gpu']:.0f} TFLOP/s per GPU (log 149.77), "
      f"MFU {bloom['mfu']:.1%}, {bloom['memory']['total'] / 1e9:.0f} GB per GPU")

# %% [markdown]
# ## 2. Calibrate this machine
# One thread's matmul rate, the memory bandwidth, PyTorch's cost per op, and gloo's α and β for five collectives
# (`minimega calibrate` prints the same). The numbers move with the machine's load: run it twice and compare.

# %%
# NBVAL_IGNORE_OUTPUT
cal = calibrate(2, reps=3, sizes=(4096, 1 << 22, 1 << 20))   # α, β fitted on the first two; the third is held out
print(f"matmul {cal['matmul_flops'] / 1e9:.1f} GFLOP/s per thread, memory {cal['memory_bandwidth'] / 1e9:.1f} GB/s, "
      f"op {cal['op_overhead'] * 1e6:.1f} us, load {cal['load']:.1f} on {cal['cores']} cores")
for op, c in cal["collectives"].items():
    print(f"  {op:<15} alpha {c['alpha'] * 1e6:8.1f} us   beta {c['beta'] / 1e9:6.2f} GB/s")

# %% [markdown]
# ## 3. Exercise: the α-β formula
# Write `collective_seconds(op, size_bytes, n, alpha, beta)` in `labs/exercises/alpha_beta.py`: steps × α plus the
# bytes each rank sends over β (chapter 13, "The α-β model"). The check compares it with `perf.collective_time`.

# %%
mine = checks.exercise("alpha_beta")   # labs/exercises/ (labs/solutions/ if MINIMEGA_LAB_SOLUTIONS=1)
checks.check_collective_seconds(mine.collective_seconds)

# %% [markdown]
# Your formula with this machine's α and β (fitted at 4 KB and 4 MB, where the first is mostly α and the second
# mostly bytes over β) predicts the 1 MB message the fit never saw; the calibration timed it too.

# %%
# NBVAL_IGNORE_OUTPUT
size = cal["sizes"][2]
for op in checks.ALPHA_BETA_OPS:
    c = cal["collectives"][op]
    pred = mine.collective_seconds(op, size, 2, c["alpha"], c["beta"])
    print(f"{op:<15} {size / 1e6:.2f} MB: predicted {pred * 1e3:7.2f} ms, gloo took {c['times'][2] * 1e3:7.2f} ms "
          f"({c['times'][2] / pred:.2f}x)")

# %% [markdown]
# ## 4. Predict, then measure
# minimega's `small` GPT (6 layers, h = 384), a batch of 8 sequences of 32 tokens, fp32 on the CPU, on 2 ranks with
# ZeRO stages 0 and 3 (one launch times both). The prediction is `perf.step_time` on the calibrated machine, plus the
# per-op cost and the ranks' share of the cores.

# %%
# NBVAL_IGNORE_OUTPUT
g = mm.GPTConfig.small()
stages = (0, 3)
measured = mm.launch(workers.timed_train, 2, "small", [mm.TrainConfig(batch_size=8, zero_stage=z) for z in stages],
                     2, 32)[0]
rows = []
for z, meas in zip(stages, measured):
    cfg = perf.PerfConfig(layers=g.n_layer, hidden=g.n_embd, heads=g.n_head, vocab=g.vocab_size, seq_len=32,
                          precision="fp32", attention="fused", dropout=False, dp=2, global_batch=8, micro_batch=4,
                          bucket_bytes=25 * 2 ** 20, zero_stage=z)
    pred = predict_minimega(cal, cfg)["total"]
    rows.append((f"dp2 ZeRO-{z}", pred, meas))
    print(f"dp2 ZeRO-{z}: predicted {pred:.3f} s, measured {meas:.3f} s, ratio {meas / pred:.2f}")

# %%
# NBVAL_IGNORE_OUTPUT
fig = go.Figure([go.Bar(name="predicted", x=[r[0] for r in rows], y=[r[1] for r in rows]),
                 go.Bar(name="measured", x=[r[0] for r in rows], y=[r[2] for r in rows])])
fig.update_layout(title="minimega's step time on this machine", yaxis_title="seconds per step", height=360)
fig

# %% [markdown]
# ## 5. Plan BLOOM
# Every layout of BLOOM's shape on 48 nodes of 8 A100 80GB, with what Megatron-DeepSpeed offered in 2022: full
# recomputation, 1F1B, ZeRO ≤ 1, no sequence parallelism. BLOOM's grid is dp8-tp4-pp12 with ZeRO-1 and micro-batch 2.

# %%
# NBVAL_CHECK_OUTPUT
res = perf_plan.plan(perf_plan.preset_shape("bloom-176b"), 384, 2048, "a100-80gb", top=5,
                     recompute=("full",), schedules=("1f1b",), zero_stages=(0, 1), sp=(False,))
print(f"{res['searched']} layouts, {res['fit']} fit")
for i, r in enumerate(res["top"], 1):
    print(f"{i}. {r['layout']:<32} {r['total']:6.1f} s  {r['tflops_per_gpu']:5.1f} TFLOP/s  {r['memory_gb']:4.1f} GB")
print("BLOOM's own layout ranks", perf_plan.rank_of(res, "dp8-tp4-pp12 z1 full b2 1f1b"))

# %% [markdown]
# Change the cluster and see the plan move: fewer nodes force more pipeline stages, H100s shift the balance from
# compute to communication.

# %%
# NBVAL_IGNORE_OUTPUT
def replan(nodes, gpu, recompute):
    r = perf_plan.plan(perf_plan.preset_shape("bloom-176b"), nodes * 8, 2048, gpu, top=3,
                       recompute=(recompute,), schedules=("1f1b",), zero_stages=(0, 1), sp=(False,))
    for i, row in enumerate(r["top"], 1):
        print(f"{i}. {row['layout']:<32} {row['total']:6.1f} s/step, MFU {row['mfu']:.1%}")


display(widgets.interactive(replan, nodes=widgets.IntSlider(48, 24, 96, 8, description="nodes"),
                            gpu=widgets.Dropdown(options=sorted(perf.HARDWARE), value="a100-80gb"),
                            recompute=widgets.Dropdown(options=["full", "selective", "none"], value="full")))

# %% [markdown]
# **Takeaway.** The same few lines of arithmetic predict a 384-GPU run and a laptop: calibrate the rates, count the
# FLOPs, bytes and messages, and add up what cannot overlap. Where the prediction misses, the miss names what the
# model leaves out.
