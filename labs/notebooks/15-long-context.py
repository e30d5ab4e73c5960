# %% [markdown]
# # Lab 15 · Long context: split the sequence, pass K/V around a ring
#
# **Why.** Activations grow with the sequence length s; fused attention removes the s² term and recomputation
# shrinks the rest, but what is left still grows with s. Context parallelism (cp) splits each sequence over cp
# ranks: everything per token runs on s/cp tokens, and attention gets the other ranks' keys and values by ring
# attention (Liu et al. 2023, arXiv:2310.01889): K/V blocks travel around the ring while each rank folds them into
# an online softmax. Rank r holds chunks r and 2·cp-1-r of 2·cp, so the causal work is the same on every rank.
#
# This lab trains the tiny GPT on 2 ranks with the sequence whole (dp = 2) and split (cp = 2), checks that both
# train the same model, counts the ring's bytes against the closed form, and measures the activations per rank.

# %%

import minimega as mm
from minimega import estimate as est
import checks      # labs/checks.py: the exercise checks
import figures     # labs/figures.py: plotly figures from reports
import workers     # labs/workers.py: the functions each rank runs

# %% [markdown]
# ## 1. The same model, rows split or sequences split
# 8 sequences of 32 tokens per step. With dp = 2 each rank takes 4 whole sequences; with cp = 2 each rank takes
# all 8 sequences but only 16 tokens of each (chunks 0 and 3, or 1 and 2, of 4 chunks of 8 tokens).

# %%
runs = {cp: mm.launch(workers.train_cp, 2, mm.TrainConfig(batch_size=8, cp=cp), timeout=300) for cp in (1, 2)}

# %%
# NBVAL_CHECK_OUTPUT
for cp, reports in runs.items():
    r = reports[0]
    groups = sorted({e["group"] for e in r["comm_events"]})
    print(f"cp={cp} dp={r['dp']}: losses {[round(x, 4) for x in r['losses']]}, collectives over {groups}")

# %% [markdown]
# Same losses: both are the single-process model. Under cp the gradients are averaged over the dp × cp group
# (`dp_cp`), and the ring's sends and receives run over `cp`.
#
# ## 2. The ring's bill
# Per layer and step a rank sends cp-1 K/V blocks forward, cp-1 backward and cp dK/dV accumulators, each block
# 2 · rows · (s/cp) · D elements: (6·cp - 4) · rows · (s/cp) · D in all.

# %%
# NBVAL_CHECK_OUTPUT
r = runs[2][0]
m = r["model"]
ring = [e for e in r["comm_events"] if e["group"] == "cp"]
sent = sum(e["sent_bytes"] for e in ring)
formula = len(r["losses"]) * est.cp_ring_bytes(m.n_layer, 8, m.block_size, m.n_embd, 2)
print(f"{sum(e['op'] == 'send' for e in ring)} sends, {sent:,.0f} B sent by rank 0; formula {formula:,.0f} B")

# %% [markdown]
# ## 3. Activations per rank against s
# One forward of 4 sequences, on one process (cp = 1) and split over 2 ranks (cp = 2), for growing s: the bytes
# autograd saves for the backward (`saved_activation_bytes`).

# %%
seq_lens = [32, 64, 128, 256]
one = mm.launch(workers.cp_activation_bytes, 1, seq_lens, timeout=300)[0]
two = mm.launch(workers.cp_activation_bytes, 2, seq_lens, timeout=300)[0]

# %%
# NBVAL_CHECK_OUTPUT
for s, a, b in zip(seq_lens, one, two):
    print(f"s={s:4d}: cp=1 {a:>10,} B, cp=2 {b:>10,} B per rank, ratio {a / b:.3f}")

# %%
# NBVAL_IGNORE_OUTPUT
fig = figures.activation_lines(seq_lens, {"cp = 1": one, "cp = 2, per rank": two},
                              "saved activations of one forward, tiny GPT, 4 sequences", "sequence length s (tokens)",
                              "bytes per rank")
fig.show()

# %% [markdown]
# Linear in s (PyTorch's attention on the CPU is fused: no s² scores are kept), and halved per rank by cp = 2:
# ring attention keeps Q, K, V, its output and one log-sum-exp per row, all for the rank's own s/cp tokens.
#
# ## 4. Exercise: which tokens a rank holds
# Complete `rank_positions` in `labs/exercises/cp_chunks.py`: the global positions of the tokens of rank r under
# the load-balanced split (chunk r, then chunk 2·cp-1-r).

# %%
# NBVAL_CHECK_OUTPUT
mine = checks.exercise("cp_chunks")        # labs/exercises/ (labs/solutions/ if MINIMEGA_LAB_SOLUTIONS=1)
checks.check_cp_chunks(mine.rank_positions)

# %% [markdown]
# **Takeaway.** Context parallelism divides activations by cp, since everything but attention is per token. Ring
# attention sends about 6 · rows · s · D elements per layer and step whatever cp is, and hides them behind the
# attention compute, which grows like (s/cp)² per step. Pairing each early chunk with its mirror balances the
# causal work.
