# %% [markdown]
# # Lab 15 · Long context: split the sequence, pass K/V around a ring
#
# **Why.** Activations grow with the sequence length s; fused attention removes the s² term and recomputation
# shrinks the rest, but what is left still grows with s. Context parallelism (cp) splits each sequence over cp
# ranks: everything per token runs on s/cp tokens, and attention gets the other ranks' keys and values by ring
# attention (Liu et al. 2023, arXiv:2310.01889): K/V blocks travel around the ring while each rank folds them into
# an online softmax. Rank r holds chunks r and 2·cp-1-r of 2·cp, so the causal work is the same on every rank.
#
# DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv:2309.14509) reaches the same result another way: all-to-alls
# over cp trade the sequence split for a head split around attention, so each rank attends over the whole
# sequence for nh/cp of the heads.
#
# This lab trains the tiny GPT on 2 ranks with the sequence whole (dp = 2) and split (cp = 2), checks that both
# train the same model, counts the ring's bytes against the closed form, and measures the activations per rank.
# Then it trains the same model with Ulysses instead of the ring and sets the two side by side: losses,
# bytes sent, activations kept.

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
# ## 4. Ulysses: all-to-all over heads instead of a ring
# The same 8 sequences, the same chunks per rank, `cp_attention="ulysses"`. Before attention three all-to-alls
# turn q, k and v from (B, nh, s/cp, hs) into (B, nh/cp, s, hs): every token, half the heads (the tiny GPT has
# nh = 4, so cp can grow to 4). A fourth turns the output back; the backward runs the four again on the gradients.

# %%
ulysses = mm.launch(workers.train_cp, 2, mm.TrainConfig(batch_size=8, cp=2, cp_attention="ulysses"), timeout=300)

# %%
# NBVAL_CHECK_OUTPUT
by_attention = {"ring": runs[2][0], "ulysses": ulysses[0]}
for name, r in by_attention.items():
    print(f"{name:8s} losses {[round(x, 4) for x in r['losses']]}")
gap = max(abs(a - b) for a, b in zip(runs[2][0]["losses"], ulysses[0]["losses"]))
print(f"the same model: losses within 1e-5 of each other: {gap < 1e-5}")

# %% [markdown]
# Same losses: both compute exact causal attention, only the exchanges differ. Their bill, per step on rank 0,
# against `estimate.cp_ring_bytes` and `estimate.cp_ulysses_bytes`: each of Ulysses' 8 all-to-alls per layer sends
# (cp-1)/cp of a rows · (s/cp) · D buffer, 8 · (cp-1)/cp · rows · (s/cp) · D in all against the ring's
# (6·cp - 4) · rows · (s/cp) · D.

# %%
# NBVAL_CHECK_OUTPUT
steps, cp = len(ulysses[0]["losses"]), 2
measured = {}
for name, r in by_attention.items():
    events = [e for e in r["comm_events"] if e["group"] == "cp"]
    ops = sorted({e["op"] for e in events})
    measured[name] = sum(e["sent_bytes"] for e in events) / steps
    formula = est.cp_bytes(name, m.n_layer, 8, m.block_size, m.n_embd, cp)
    print(f"{name:8s} {len(events):3d} events {ops}: {measured[name]:,.0f} B sent per step; "
          f"formula {formula:,.0f} B; equal to the byte: {measured[name] == formula}")
print(f"Ulysses / ring at cp = {cp}: {measured['ulysses'] / measured['ring']:.3f}")

# %% [markdown]
# Half the ring's bytes at cp = 2, and the gap widens with cp: the ring sends about 6 · rows · s · D per layer
# whatever cp is, Ulysses 8 · rows · s · D / cp. The formulas for this model, with the two measurements on them
# (Ulysses stops at cp = nh = 4: a rank needs at least one whole head):

# %%
# NBVAL_IGNORE_OUTPUT
cps = [2, 4, 8, 16]
fig = figures.formula_lines(
    {"ring": (cps, [est.cp_ring_bytes(m.n_layer, 8, m.block_size, m.n_embd, c) / 1e3 for c in cps]),
     "Ulysses": ([2, 4], [est.cp_ulysses_bytes(m.n_layer, 8, m.block_size, m.n_embd, c) / 1e3 for c in (2, 4)])},
    {"ring": (cp, measured["ring"] / 1e3), "Ulysses": (cp, measured["ulysses"] / 1e3)},
    "bytes one rank sends per step for attention, tiny GPT, 8 × 32 tokens", "cp (ranks per sequence)",
    "kB sent per rank per step")
fig.show()

# %% [markdown]
# Fewer bytes, but not free: every all-to-all stands between two computations (nothing to hide it behind, where
# the ring overlaps its hops with attention), and memory grows. The attention kernel keeps its output in the
# head-split layout for its backward, while the output projection keeps its input in the sequence-split one:
# one (rows, s/cp, D) tensor per layer more than the ring (`estimate.ulysses_activation_bytes`).

# %%
ulysses_two = mm.launch(workers.cp_activation_bytes, 2, seq_lens, 4, "ulysses", timeout=300)[0]

# %%
# NBVAL_CHECK_OUTPUT
for s, b, u in zip(seq_lens, two, ulysses_two):
    extra = m.n_layer * est.ulysses_activation_bytes(est.MemoryConfig(
        layers=m.n_layer, hidden=m.n_embd, heads=m.n_head, vocab=m.vocab_size, seq_len=s, micro_batch=4,
        precision="fp32", cp=2, cp_attention="ulysses"))[0]
    print(f"s={s:4d}: ring {b:>10,} B, Ulysses {u:>10,} B per rank: {u - b:>7,} B more; "
          f"formula {extra:>9,.0f} B; equal to the byte: {u - b == extra}")

# %%
# NBVAL_IGNORE_OUTPUT
fig = figures.activation_lines(seq_lens, {"cp = 1": one, "cp = 2, ring, per rank": two,
                                          "cp = 2, Ulysses, per rank": ulysses_two},
                              "saved activations of one forward, tiny GPT, 4 sequences", "sequence length s (tokens)",
                              "bytes per rank")
fig.show()

# %% [markdown]
# ## 5. Exercise: which tokens a rank holds
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
# causal work. Ulysses trains the same model with 8 · (cp-1)/cp · rows · (s/cp) · D elements per layer (half the
# ring's at cp = 2, falling as 1/cp), at the price of all-to-alls on the critical path, one more activation per
# layer, and cp ≤ n_head.
