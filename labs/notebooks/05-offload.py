# %% [markdown]
# # Lab 05 · Offload: move the optimizer states to the CPU
#
# **Why.** In mixed precision 12 of the 16 bytes per parameter are the optimizer's: the fp32 master weights and Adam's
# two moments. They are touched once per step, by an element-wise update — work a CPU does well. ZeRO-Offload
# (Ren et al. 2021, arXiv:2101.06840) keeps them in host memory and runs the step there; the GPU keeps the 16-bit
# parameters and runs the forward and backward, and the gradients stream to the host as the backward produces them:
# each unit's reduced gradient shard goes down as soon as its reduce is done. Model states on the GPU fall from 16 to
# 2 bytes per parameter. The paper's headline: models of over 13 B parameters
# train on a single GPU, 10× the size PyTorch alone trains there.
#
# This lab runs ZeRO-2 with and without `offload_optimizer=True` on 2 ranks and measures where the bytes are, then
# uses the estimator for billion-parameter models on one GPU.

# %%
import ipywidgets as widgets
from IPython.display import display

import minimega as mm
from minimega import estimate
from minimega.figures import plots
import checks      # labs/checks.py: the exercise checks
import figures     # labs/figures.py: plotly figures from reports
import workers     # labs/workers.py: the functions each rank runs

# %% [markdown]
# ## 1. Same job, optimizer on the device or on the CPU
# bf16 parameters with an fp32 master, ZeRO-2, dp = 2, a small model (bf16 matmuls are slow on CPUs). bf16's
# gradients are summed and reduced in fp32 (chapter 4's `main_grad`): 4 bytes per element.

# %%
model = mm.GPTConfig.tiny(n_embd=32)
dp = 2
runs = {offload: mm.launch(workers.train, dp, model,
                           mm.TrainConfig(zero_stage=2, precision="bf16", offload_optimizer=offload, batch_size=8),
                           4, 16, timeout=180)
        for offload in (False, True)}

# %%
# NBVAL_CHECK_OUTPUT
numels = workers.unit_numels(model)
psi = sum(estimate.padded_numel(n, dp) for n in numels)
rows = {}
for offload, reports in runs.items():
    m = reports[0]["memory_at_step"]
    states = m["master"] + m["optimizer_states"]
    on_cpu = m["optimizer_location"] == "cpu"
    rows[offload] = {"device": m["params"] + m["grads"] + (0 if on_cpu else states),
                     "cpu": states + m["host_grads"] if on_cpu else 0}
    print(f"offload_optimizer={offload}: optimizer states on the {m['optimizer_location']}; rank 0 holds "
          f"{rows[offload]['device']:,} B on the device ({rows[offload]['device'] / psi:.0f} B/param), "
          f"{m['grads']:,} B of them gradients, and {rows[offload]['cpu']:,} B on the CPU "
          f"({rows[offload]['cpu'] / psi:.0f} B/param)")
print(f"formula, ZeRO-2 over dp={dp}: without offload device 2Ψ + 4Ψ/dp + 12Ψ/dp = {2 * psi + 16 * psi // dp:,} B; "
      f"with offload device 2Ψ = {2 * psi:,} B, CPU (12 + 4)Ψ/dp = {16 * psi // dp:,} B")
gap = max(abs(a - b) for a, b in zip(runs[True][0]["losses"], runs[False][0]["losses"]))
print("losses", [round(x, 4) for x in runs[False][0]["losses"]], "; offloaded run within 1e-5:", gap < 1e-5)

# %%
# NBVAL_IGNORE_OUTPUT
figures.model_states_by_location([runs[False][0], runs[True][0]], ["on the device", "offloaded"],
                                 "ZeRO-2, bf16, dp = 2: model states of rank 0 by location")

# %% [markdown]
# The step is the same torch AdamW on the same fp32 numbers, only elsewhere: the losses agree. On a GPU the price is
# the PCIe traffic — gradients down (4Ψ/dp bytes here: bf16's are reduced in fp32; 2Ψ/dp with fp16) and updated
# parameters up (2Ψ/dp) every step — and the CPU's slower step, which ZeRO-Offload overlaps with the next backward.
#
# With offload the device holds no gradients at the step: as soon as a unit's reduce-scatter is done, its shard (fp32
# under bf16, 16-bit under fp16) is copied to the host and summed there into an fp32 buffer (4 bytes per element, as
# DeepSpeed's pinned fp32 gradient partition), and the device's copy is freed. The host so holds 16 bytes per parameter of its shard: the
# fp32 master (4), Adam's moments (8) and the gradients (4) — DeepSpeed's estimator counts the same 16Ψ before its
# 1.5× buffer factor. With gradient accumulation the host sums the micro-steps in fp32, and so does the device
# without offload under bf16 (its fp32 gradient shards); only fp16, which sums on the device in fp16, then differs.
#
# ## 2. A billion parameters on one GPU
# `estimate.memory_per_gpu` adds activations to the model states. A 1.3 B-parameter GPT (24 layers, width 2048), one
# GPU, ZeRO-2 (what ZeRO-Offload builds on: gradients leave per unit), sequences of 1024, micro-batch 1:

# %%
# NBVAL_CHECK_OUTPUT
shape = dict(layers=24, hidden=2048, heads=16, vocab=50257, seq_len=1024, zero_stage=2)
for offload in ("none", "optimizer"):
    for recompute in ("none", "full"):
        mem = estimate.memory_per_gpu(estimate.MemoryConfig(**shape, offload=offload, recompute=recompute))
        print(f"offload={offload:9} recompute={recompute:4}: GPU {mem['total'] / 1e9:5.1f} GB "
              f"(states {(mem['params'] + mem['grads'] + mem['optimizer']) / 1e9:4.1f}, activations "
              f"{(mem['activations'] + mem['recompute']) / 1e9:4.1f}), CPU {mem['cpu'] / 1e9:5.1f} GB; Ψ = {mem['stage_params'] / 1e9:.2f} B")

# %% [markdown]
# Without offload the 16 bytes per parameter alone need 21 GB; with it the GPU keeps 2 bytes per parameter and the host
# the other 16 (the optimizer's 12 and the gradients' 4, in fp32), and the 1.3 B model fits a 16 GB GPU with room for
# activations. (With full recomputation the activations include the one
# layer the backward rebuilds.) The paper's headline, from its abstract: over 13 B parameters on a single GPU, 10× the
# largest model PyTorch trains on that GPU.

# %%
# NBVAL_IGNORE_OUTPUT
plots.offload_split(10e9, 1)

# %% [markdown]
# ## 3. How big on one GPU?
# The estimator for a model of your shape (width 2048, 16 heads, sequences of 1024): the largest depth whose total
# fits the GPU you choose.

# %%
# NBVAL_IGNORE_OUTPUT
def show_fit(gpu_gb, offload, recompute):
    best = None
    for layers in range(1, 400):
        mem = estimate.memory_per_gpu(estimate.MemoryConfig(layers=layers, hidden=2048, heads=16, vocab=50257,
                                                            seq_len=1024, zero_stage=2, offload=offload,
                                                            recompute=recompute))
        if mem["total"] > gpu_gb * 1e9:
            break
        best = (layers, mem)
    if best is None:
        print("not even one layer fits")
        return
    layers, mem = best
    print(f"{layers} layers = {mem['stage_params'] / 1e9:.1f} B parameters fit in {gpu_gb} GB "
          f"(GPU {mem['total'] / 1e9:.1f} GB, CPU {mem['cpu'] / 1e9:.0f} GB)")


display(widgets.interactive(show_fit, gpu_gb=widgets.Dropdown(options=[16, 24, 40, 80], value=80, description="GPU GB"),
                            offload=["none", "optimizer"], recompute=["none", "selective", "full"]))

# %% [markdown]
# ## 4. One tier further: the optimizer on disk
# ZeRO-Infinity (Rajbhandari et al. 2021, arXiv:2104.07857) moves the fp32 master and Adam's moments from host memory
# to NVMe: `TrainConfig(offload_optimizer=True, nvme_path=DIR)`. Each rank keeps each unit's shard of them in one file
# (`minimega/zero/nvme.py`); at every step the store reads each file, runs the update on it, and writes it back. So
# per rank and step it reads and writes K·Ψ/N_d bytes each way, with K = 4 + 8 = 12 under Adam and Ψ the padded
# parameter count. The same job as section 1 twice, side by side on the same batches: offload to host memory, and
# offload to files in a temporary directory. The store counts the bytes it moves:

# %%
import tempfile

with tempfile.TemporaryDirectory() as disk:
    configs = [mm.TrainConfig(zero_stage=2, precision="bf16", offload_optimizer=True, nvme_path=path, batch_size=8)
               for path in (None, disk)]
    io = mm.launch(workers.offload_io, dp, model, configs, 6, 16, timeout=180)    # per rank: [host, disk]

# %%
# NBVAL_CHECK_OUTPUT
K = 4 + 4 + 4                                  # bytes per shard element in a file: fp32 master, exp_avg, exp_avg_sq
per_rank = K * psi // dp                       # K·Ψ/N_d, Ψ padded as in section 1
want = estimate.nvme_bytes_per_step(psi, dp, stage=2)
print(f"formula: K·Ψ/N_d = {K} × {psi:,} / {dp} = {per_rank:,} B read and {per_rank:,} B written per step and rank "
      f"(estimate.nvme_bytes_per_step: {want['read']:,.0f} and {want['write']:,.0f})")
for rank, (host, on_disk) in enumerate(io):
    steps = on_disk["traffic"]
    print(f"rank {rank}, states on the {on_disk['location']}: read {[s['read'] for s in steps]} B, "
          f"written {[s['written'] for s in steps]} B at steps 1-{len(steps)}")
    assert all(s == {"read": per_rank, "written": per_rank} for s in steps), (rank, steps, per_rank)
    assert host["location"] == "cpu" and all(s == {"read": 0, "written": 0} for s in host["traffic"])
    assert on_disk["losses"] == host["losses"], "the disk tier must train bit for bit as the host store"
assert want == {"read": per_rank, "write": per_rank, "total": 2 * per_rank}
print("every step, every rank: equal to the byte; losses identical to host-memory offload")

# %%
# NBVAL_IGNORE_OUTPUT
host, on_disk = io[0]
print(f"median step on this machine: states in host memory {host['seconds'] * 1e3:.1f} ms, "
      f"on disk {on_disk['seconds'] * 1e3:.1f} ms ({on_disk['seconds'] / host['seconds']:.2f}×)")

# %% [markdown]
# The bytes are exact; the times are whatever this machine gives (the two engines take turns step by step, so both
# see the same load). Files of a few hundred kilobytes stay in the operating system's page cache: what separates the
# two times here is the store's own work (a read and a write call per unit, through a thread pool) and the noise of a
# shared machine, not a drive. At scale the files do not fit a cache: K·Ψ/N_d each way at a drive's few GB/s
# (chapter 5 prices GPT-3's 13 B shape on one H100 node) is what the disk tier pays for its capacity.

# %% [markdown]
# ## 5. Exercise: bytes by location
# Complete `bytes_by_location(n_params, dp, stage, precision, offload)` in `labs/exercises/offload.py`. The check trains
# real 2-rank jobs in fp32 and bf16, ZeRO stages 1-3, with and without offload, and compares your bytes on the device
# and on the CPU with what the ranks hold.

# %%
# NBVAL_CHECK_OUTPUT
mine = checks.exercise("offload")   # labs/exercises/ (labs/solutions/ if MINIMEGA_LAB_SOLUTIONS=1)
checks.check_offload(mine.bytes_by_location)

# %% [markdown]
# **Takeaway.** Optimizer offload with ZeRO-2 leaves 2 bytes of parameters per parameter on the GPU and moves the
# rest to host memory, which is larger and cheaper: the optimizer's 12 bytes and the gradient shard, summed there in
# fp32; the step runs there on the same numbers. The cost is PCIe traffic and a CPU step per iteration — a good trade
# when the GPU is what limits the model's size.
