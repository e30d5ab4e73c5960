# %% [markdown]
# # Lab 10 · Checkpoints: save sharded, resume on another layout, trust nothing unverified
#
# **Why.** A long run is stopped and resumed many times, often on a different number of GPUs. A minimega checkpoint
# stores the *layout-free* training state — every parameter of `model.py` by its own name, full-shaped, with its
# Adam states — split across the ranks' files so they write in parallel. Whatever the layout that loads it
# (ZeRO stage, tp, pp, dp), it takes back its own share. Every file's sha256 sits in the manifest and is checked
# before anything is loaded.
#
# This lab saves under dp=2 with ZeRO-3, resumes under tp=2 and on one rank, checks the losses continue, consolidates
# the weights into one file, and corrupts a shard.

# %%
import json
import re
import shutil
import tempfile
from pathlib import Path

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from IPython.display import display
from safetensors.torch import load_file

import minimega as mm
from minimega import checkpoint, data
import checks      # labs/checks.py: the exercise checks
import workers     # labs/workers.py: the functions each rank runs

# %% [markdown]
# ## 1. Train under dp=2, ZeRO-3 and save at step 2
# The job runs 4 steps and saves after the second; its losses for steps 2 and 3 are the reference the resumed runs
# must reproduce.

# %%
work = Path(tempfile.mkdtemp(prefix="lab10-"))
ckpt = work / "ckpt"
saved_under = mm.TrainConfig(zero_stage=3, batch_size=8)
reference = mm.launch(workers.train_and_checkpoint, 2, "tiny", saved_under, 4, 32, str(ckpt), 2, timeout=180)[0]

# %%
# NBVAL_CHECK_OUTPUT
step_dir = checkpoint.resolve(ckpt)
manifest = json.loads((step_dir / "manifest.json").read_text())
print("latest ->", (ckpt / "latest").read_text(), "| layout", manifest["layout"], "| step", manifest["step"])
print("files:", sorted(p.name for p in step_dir.iterdir()))
for file in sorted(manifest["files"]):       # each rank's file holds boxes of the global tensors it owned
    names = sorted(n for n, t in manifest["tensors"].items() if any(c["file"] == file for c in t["chunks"]))
    print(f"{file}: boxes of {len(names)} tensors, e.g. {names[:2]}")
print("reference losses:", [round(x, 4) for x in reference["losses"]])

# %% [markdown]
# Names like `param/blocks.0.mlp.fc.weight` and `exp_avg/blocks.0.mlp.fc.weight` are `model.py`'s keys, full-shaped:
# nothing in the files says "ZeRO-3". The saving layout is only recorded in the manifest.
#
# ## 2. Resume on other layouts
# Each run builds a fresh engine on its own layout, calls `engine.load(ckpt)` (which reshards), and trains steps
# 2 and 3 on the same global batches.

# %%
layouts = {"dp=2, ZeRO-3 (as saved)": (2, saved_under),
           "tp=2": (2, mm.TrainConfig(tp=2, batch_size=8)),
           "one rank": (1, mm.TrainConfig(batch_size=8))}
resumed = {name: mm.launch(workers.train_and_checkpoint, world, "tiny", cfg, 4, 32, None, None, str(ckpt),
                           timeout=180)[0]
           for name, (world, cfg) in layouts.items()}

# %%
# NBVAL_CHECK_OUTPUT
want = reference["losses"][2:]
for name, r in resumed.items():
    gap = max(abs(a - b) for a, b in zip(r["losses"], want))
    print(f"{name:24} resumed at step {r['start']}, losses {[round(x, 4) for x in r['losses']]}; "
          f"within 1e-4 of the uninterrupted run: {gap < 1e-4}")

# %%
# NBVAL_IGNORE_OUTPUT
fig = go.Figure(go.Scatter(x=list(range(4)), y=reference["losses"], name="uninterrupted (dp=2, ZeRO-3)",
                           mode="lines+markers", line=dict(width=6, color="#bbb")))
for name, r in resumed.items():
    fig.add_scatter(x=list(range(r["start"], r["start"] + len(r["losses"]))), y=r["losses"], name=f"resumed: {name}",
                    mode="markers", marker=dict(size=10))
fig.update_layout(title="saved at step 2, resumed on three layouts", xaxis_title="step", yaxis_title="loss",
                  height=360)
fig

# %% [markdown]
# ## 3. Consolidate: one file of fp32 weights
# `checkpoint.consolidate` needs no process group: it reads every shard and writes `model.py`'s state dict. Load it into a
# plain `mm.GPT` and evaluate the batch of step 2: that is exactly the loss the training step 2 reported (the loss
# is computed before the step's update).

# %%
# NBVAL_CHECK_OUTPUT
out = checkpoint.consolidate(ckpt, work / "consolidated.safetensors")
weights = load_file(out)
gpt = mm.GPT(mm.GPTConfig.tiny())
gpt.load_state_dict(weights)
x, y = data.global_batch(2, 8, 32)
with torch.no_grad():
    loss = gpt(x, y)[1].item()
print(f"{len(weights)} tensors, {sum(v.numel() for v in weights.values()):,} fp32 parameters; loss on step 2's batch "
      f"{loss:.4f}, training reported {reference['losses'][2]:.4f}: equal within 1e-4: {abs(loss - reference['losses'][2]) < 1e-4}")

# %% [markdown]
# ## 4. Corrupt a shard
# Flip one byte in the middle of rank 1's shard. The file keeps its size and still parses as safetensors — silent
# corruption. The loader recomputes every sha256 before it loads anything and refuses.

# %%
# NBVAL_CHECK_OUTPUT
shard = step_dir / "shard-00001.safetensors"
raw = bytearray(shard.read_bytes())
raw[len(raw) // 2] ^= 0xFF
shard.write_bytes(bytes(raw))
try:
    checkpoint.read(ckpt)
except checkpoint.CheckpointError as err:
    print("CheckpointError:", re.sub(r"[0-9a-f]{12}…", "…", str(err).replace(str(ckpt), "ckpt")))

# %% [markdown]
# ## 5. Resume anywhere
# Pick a layout: a fresh checkpoint is saved under dp=2 ZeRO-3 at step 2 and loaded under yours.

# %%
# NBVAL_IGNORE_OUTPUT
choices = {"dp=2, ZeRO-1": (2, mm.TrainConfig(zero_stage=1, batch_size=8)),
           "dp=2, DDP": (2, mm.TrainConfig(batch_size=8)),
           "pp=2 (1F1B, 2 micro-batches)": (2, mm.TrainConfig(pp=2, micro_batches=2, batch_size=8)),
           "tp=2": (2, mm.TrainConfig(tp=2, batch_size=8))}


def show_resume(layout):
    fresh = Path(tempfile.mkdtemp(prefix="lab10-", dir=work))
    ref = mm.launch(workers.train_and_checkpoint, 2, "tiny", saved_under, 3, 16, str(fresh), 2, timeout=300)[0]
    world, cfg = choices[layout]
    r = mm.launch(workers.train_and_checkpoint, world, "tiny", cfg, 3, 16, None, None, str(fresh), timeout=300)[0]
    print(f"{layout}: step 2 loss {r['losses'][0]:.5f}, uninterrupted {ref['losses'][2]:.5f}")


display(widgets.interactive(show_resume, layout=list(choices)))

# %% [markdown]
# ## 6. Exercise: find the damaged files
# Complete `verify_checkpoint(directory)` in `labs/exercises/verify_checkpoint.py`: the names of the files the
# manifest lists that are missing or whose sha256 differs. The check saves a real 2-rank checkpoint, damages copies
# of it in five ways, and compares your answer with what `minimega.checkpoint.read` refuses.

# %%
# NBVAL_CHECK_OUTPUT
mine = checks.exercise("verify_checkpoint")   # labs/exercises/ (labs/solutions/ if MINIMEGA_LAB_SOLUTIONS=1)
checks.check_verify_checkpoint(mine.verify_checkpoint)

# %% [markdown]
# ## 7. A rank that stops: the watchdog
# A training job runs in the background; after a second we send `SIGSTOP` to rank 1, as a frozen node would. Rank 0
# keeps waiting in its next all-reduce, and no error can come from rank 1: it runs no code. The launcher reads each
# rank's heartbeat and last collective from shared memory, and ends the job once rank 1 has been silent for
# `timeout` seconds, naming it.

# %%
import os
import signal
import threading
import time

from minimega.tools.train import train_worker


def rank_pids():
    """{'minimega-rank0': pid, ...} among this kernel's descendants: the ranks name themselves (see `ps`)."""
    parent, name = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        pid = int(stat.parent.name)
        name[pid], parent[pid] = text[text.index("(") + 1:text.rindex(")")], int(text[text.rindex(")") + 2:].split()[1])

    def mine(pid):
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == os.getpid():
                return True
        return False
    return {name[p]: p for p in name if name[p].startswith("minimega-rank") and mine(p)}


outcome = {}


def background_job():
    try:
        mm.launch(train_worker, 2, "tiny", mm.TrainConfig(batch_size=8), 2000, False, None, False, timeout=4)
    except mm.WorkerError as err:
        outcome["error"] = err


job = threading.Thread(target=background_job)
job.start()
while len(ranks := rank_pids()) < 2:
    time.sleep(0.1)
time.sleep(1.0)
os.kill(ranks["minimega-rank1"], signal.SIGSTOP)
stopped = time.monotonic()
job.join()
took = time.monotonic() - stopped
err = outcome["error"]

# %%
# NBVAL_CHECK_OUTPUT
print(type(err).__name__, "| rank named:", err.rank, "| ended within timeout + 5 s:", took < 4 + 5)
print(re.sub(r"\w+#\d+|\d+\.\d s", "…", str(err).splitlines()[0]))
print("ranks still alive:", [p for p in ranks.values() if Path(f"/proc/{p}").exists()
                              and Path(f"/proc/{p}/stat").read_text().split()[2] != "Z"])

# %% [markdown]
# The parts blanked with `…` vary from run to run: which collective rank 1 had reached when the signal came (e.g.
# `all_reduce#38`), and for how long it had been silent. `print(err)` shows them, and each rank's line: rank 0 one
# collective ahead, waiting.
#
# ## 8. A rank that dies: the elastic restart
# `minimega train --max-restarts 2 --save-dir ck --save-every 5` restarts the job from the latest complete checkpoint
# when a rank dies. `MINIMEGA_FAULT_STEP=1:7` makes rank 1 kill itself (SIGKILL) after step 7, on the first attempt
# only. The ranks take the notebook's environment as it is at each launch, so setting it here is enough.

# %%
import contextlib
import io

from minimega.tools.cli import main as minimega


def train(*flags):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert minimega(["train", "--nproc", "2", "--steps", "20", "--save-every", "5", "--json", *flags]) == 0
    return json.loads(out.getvalue().splitlines()[-1])


os.environ["MINIMEGA_FAULT_STEP"] = "1:7"
elastic = train("--save-dir", str(work / "elastic"), "--max-restarts", "2")
del os.environ["MINIMEGA_FAULT_STEP"]
straight = train("--save-dir", str(work / "straight"))


def final_state(directory):
    engine = mm.initialize(mm.GPT(mm.GPTConfig.tiny()), mm.TrainConfig(batch_size=8), mm.init_mesh())
    engine.load(directory)
    return engine.full_state_dict()


# %%
# NBVAL_CHECK_OUTPUT
(restart,) = elastic["restarts"]
print(f"rank {restart['rank']} died at step {restart['step']} ({restart['error']}); resumed from the checkpoint at "
      f"step {restart['resume_step']}: {restart['redone']} steps redone")
a, b = final_state(work / "elastic"), final_state(work / "straight")
print("final weights equal to the uninterrupted run, bit for bit:", all(torch.equal(a[k], b[k]) for k in b))
print("losses after the restart equal too:", elastic["losses"] == straight["losses"][restart["resume_step"]:])

# %%
# NBVAL_IGNORE_OUTPUT
fig = go.Figure(go.Scatter(x=list(range(20)), y=straight["losses"], name="uninterrupted", mode="lines",
                           line=dict(width=6, color="#bbb")))
fig.add_scatter(x=list(range(restart["resume_step"], 20)), y=elastic["losses"], mode="markers",
                name="after the restart", marker=dict(size=9))
fig.add_vline(x=restart["step"], line_dash="dot", annotation_text=f"rank {restart['rank']} killed")
fig.add_vline(x=restart["resume_step"], line_dash="dash", annotation_text="checkpoint resumed")
fig.update_layout(title="a rank killed at step 7, the job resumed from step 5", xaxis_title="step",
                  yaxis_title="loss", height=360)
fig

# %% [markdown]
# **Takeaway.** Save the training state in the model's own names and full shapes, and resharding is just loading:
# ZeRO-3 on two ranks resumes as tensor parallelism or on one rank, and the losses continue. Write to a hidden
# directory and rename it when complete, and a crash never leaves half a checkpoint; hash every file, and a flipped
# byte is caught before it trains. A heartbeat catches the rank that stops; a restart from the latest complete
# checkpoint turns a dead rank into a few redone steps and the same final bits.

# %%
shutil.rmtree(work)          # this lab's checkpoints were temporary
