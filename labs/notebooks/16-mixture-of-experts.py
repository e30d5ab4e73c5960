# %% [markdown]
# # Lab 16 · Mixture of experts: route tokens, split the experts, pay in all-to-alls
#
# **Why.** A mixture-of-experts (MoE) layer replaces a block's MLP with E experts and a router that sends each
# token to its top-k of them (GShard, arXiv:2006.16668; Switch, arXiv:2101.03961). Parameters grow E-fold, the
# FLOPs per token only k-fold. Expert parallelism (ep) splits the experts over ranks; the tokens then travel to
# their experts and back with two all-to-alls per layer in the forward and two in the backward.
#
# This lab trains the tiny MoE GPT on 2 ranks with the experts replicated (ep = 1) and split (ep = 2), checks that
# both train the same model, counts the all-to-all bytes against the closed form, and looks at what the router did.

# %%
import plotly.graph_objects as go

import minimega as mm
from minimega import estimate as est
import checks      # labs/checks.py: the exercise checks
import workers     # labs/workers.py: the functions each rank runs

# %% [markdown]
# ## 1. The same model, experts replicated or split
# 4 experts, top-2, capacity factor 1.25, sequences of 32 tokens: each expert takes at most
# ceil(1.25 · 2 · 32 / 4) = 20 tokens of a sequence. Both jobs use dp = 2 (each rank gets 4 of the 8 sequences);
# `ep=2` gives each rank 2 of the 4 experts.

# %%
runs = {ep: mm.launch(workers.train_moe, 2, mm.TrainConfig(batch_size=8, ep=ep), timeout=300) for ep in (1, 2)}

# %%
# NBVAL_CHECK_OUTPUT
for ep, reports in runs.items():
    r = reports[0]
    print(f"ep={ep}: losses {[round(x, 4) for x in r['losses']]}, rank 0 holds "
          f"{r['memory']['params']:,} B of parameters")

# %% [markdown]
# Same losses: routing and capacity are decided per sequence, so splitting the experts changes where they run, not
# what they compute. Rank 0 holds less under ep = 2: half the experts.
#
# ## 2. The all-to-all bill
# Each all-to-all sends (ep-1)/ep of the (E, rows · C, D) slot buffer; per step 4 per layer.

# %%
# NBVAL_CHECK_OUTPUT
r = runs[2][0]
m, moe_cfg = r["model"], r["moe_config"]
a2a = [e for e in r["comm_events"] if e["op"] == "all_to_all"]
formula = len(r["losses"]) * est.moe_alltoall_bytes(m.n_layer, 4, m.block_size, m.n_embd, 2, moe_cfg.n_experts,
                                                   moe_cfg.top_k, moe_cfg.capacity_factor)
print(f"{len(a2a)} all-to-alls, {sum(e['sent_bytes'] for e in a2a):,.0f} B sent by rank 0; formula {formula:,.0f} B")

# %% [markdown]
# ## 3. What the router did
# Tokens each expert was sent (both ranks together) and how many it dropped for lack of slots, per layer.

# %%
# NBVAL_IGNORE_OUTPUT
routed = [[sum(x) for x in zip(*(rep["moe"]["routed"][layer] for rep in runs[2]))] for layer in range(m.n_layer)]
dropped = [[sum(x) for x in zip(*(rep["moe"]["dropped"][layer] for rep in runs[2]))] for layer in range(m.n_layer)]
fig = go.Figure()
for layer in range(m.n_layer):
    fig.add_bar(name=f"layer {layer} kept", x=[f"expert {e}" for e in range(moe_cfg.n_experts)],
                y=[a - b for a, b in zip(routed[layer], dropped[layer])], offsetgroup=layer)
    fig.add_bar(name=f"layer {layer} dropped", x=[f"expert {e}" for e in range(moe_cfg.n_experts)],
                y=dropped[layer], offsetgroup=layer, base=[a - b for a, b in zip(routed[layer], dropped[layer])],
                marker_pattern_shape="/")
fig.update_layout(title="tokens per expert over 3 steps (kept, dropped on top)", yaxis_title="tokens",
                  barmode="group")
fig.show()

# %% [markdown]
# An untrained router is not balanced: some experts get more than their slots and drop tokens. The load-balancing
# loss (α · E · Σ f_e · P_e, 1 when balanced) pushes the router towards equal shares as training goes on.
#
# ## 4. Exercise: who gets a slot
# Complete `assign_slots` in `labs/exercises/moe_slots.py`: GShard's priority queues every token's first choice
# in token order, then every second choice; an expert keeps its first `capacity` arrivals.

# %%
# NBVAL_CHECK_OUTPUT
mine = checks.exercise("moe_slots")        # labs/exercises/ (labs/solutions/ if MINIMEGA_LAB_SOLUTIONS=1)
checks.check_moe_slots(mine.assign_slots)

# %% [markdown]
# **Takeaway.** Expert parallelism divides the experts' memory by ep and adds 4 all-to-alls per MoE layer and step,
# each moving nearly the whole slot buffer (k · capacity factor × the layer's activations); unlike tp's all-reduces
# the volume does not shrink with more ranks, which is why ep groups stay on fast links.
