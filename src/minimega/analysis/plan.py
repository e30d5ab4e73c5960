"""`plan()`: every dp × tp × pp × ZeRO × recomputation × micro-batch × schedule layout of a model on a
cluster, the ones that fit memory ranked by predicted throughput (``perf.step_time``); ``minimega plan``.

Rules of the search (each one a constraint the stacks themselves impose):
    tp divides the heads (and the key/value heads under GQA) and stays inside an NVLink domain (TP is on the
    critical path: NVLink only): the node's 8 GPUs on DGX/HGX machines, a rack's 72 on GB200 NVL72
    (`Hardware.domain`); ``tps`` narrows it;
    pp ≤ layers; dp = GPUs / (tp·pp) divides the global batch, and micro-batches divide the rest;
    ZeRO-2/3 only without pp (`mesh.py`'s note on composing: they would reduce or gather every micro-batch);
    interleaved 1F1B with v chunks only when pp·v divides the layers and pp divides m (Megatron's rule);
    sequence parallelism only with tp > 1 (and never with experts); with experts, ep runs over the
    divisors of dp that also divide the experts (ep is carved out of dp). GPipe is searched only when asked for (``schedules``): it times
    like 1F1B and holds m micro-batches instead of p, so it never beats it.

Context parallelism is searched when asked for (``cps``, ``minimega plan --cp 1 2 4 8``), with the engine's
rules (`parallel.context.check`): cp divides the GPUs left after tp and splits seq_len into 2·cp chunks; no
cp with pp, with capacity-routed experts (capacity is a budget per whole sequence; experts routed dropless are
searched with cp, as the engine trains them) or with sequence parallelism (cp already splits the sequence); the attention is a
fused kernel. cp·tp may span nodes (the ring's hops and the all-to-alls are priced on the link that spans
cp·tp ranks). Each cp > 1 is searched with every variant in ``cp_attentions``: 'ring', and 'ulysses' where
tp·cp divides the heads. ZeRO shards over dp·cp, so a ZeRO stage needs dp·cp > 1, not dp > 1.
"""
from __future__ import annotations

import itertools
from dataclasses import asdict

from .. import analysis as est
from .perf import PerfConfig, step_time
from .hardware import Hardware, hardware

GB = 1e9
MICRO_BATCHES = (1, 2, 4, 8, 16)
VIRTUAL = (2, 4)


def days_and_cost(result: dict, tokens: float, price_per_gpu_hour: float, global_batch: int, seq_len: int) -> dict:
    """Days to train on `tokens` at the predicted step time, GPU-hours and cost (`estimate.gpu_hours`, `run_cost`)."""
    steps = tokens / (global_batch * seq_len)
    seconds = steps * result["total"]
    hours = est.gpu_hours(result["n_gpus"], seconds)
    return {"days": seconds / 86400, "gpu_hours": hours, "cost": est.run_cost(hours, price_per_gpu_hour)}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _cp_variants(model: dict, n: int, tp: int, cps, cp_attentions) -> list[tuple[int, str]]:
    """(cp, attention) pairs to search with tensor parallelism ``tp`` on ``n`` GPUs (see the module docstring)."""
    out = []
    for cp in cps:
        if cp == 1:
            out.append((1, "ring"))
        elif n % (tp * cp) == 0 and model["seq_len"] % (2 * cp) == 0 and model.get("attention", "unfused") == "fused" \
                and (not model.get("experts", 0) or model.get("moe_dispatch") == "dropless"):
            kv = model.get("kv_heads", 0) or model["heads"]          # Ulysses splits query and key/value heads
            heads_split = model["heads"] % (tp * cp) == 0 and kv % (tp * cp) == 0
            out += [(cp, a) for a in cp_attentions if a == "ring" or heads_split]
    return out


def check_tps(tps, hw: Hardware) -> None:
    """Refuse asked-for tp degrees that leave the NVLink domain, by name."""
    far = [t for t in tps if not (isinstance(t, int) and 1 <= t <= hw.domain)]
    if far:
        raise ValueError(f"tp {far}: tensor parallelism stays inside one NVLink domain, {hw.domain} GPUs on "
                         f"{hw.name}; ask for tp <= {hw.domain} (GB200 NVL72's domain is 72)")


def layouts(model: dict, n_gpus: int, global_batch: int, hw: Hardware, *, zero_stages=(0, 1, 2, 3),
            recompute=("none", "selective", "full"), schedules=("1f1b", "interleaved"),
            micro_batches=MICRO_BATCHES, sp=(False, True), cps=(1,), cp_attentions=est.CP_ATTENTION, tps=None,
            **fixed):
    """Yield every valid `PerfConfig` of `model` (layers, hidden, heads, vocab, seq_len) on `n_gpus`."""
    if tps is not None:
        check_tps(tps, hw)
    for tp in _divisors(n_gpus):
        if (tp > hw.domain or model["heads"] % tp or (model.get("kv_heads", 0) or model["heads"]) % tp
                or (tps is not None and tp not in tps)):
            continue
        for cp, cp_attention in _cp_variants({**model, **fixed}, n_gpus, tp, cps, cp_attentions):
            yield from _layouts_at(model, n_gpus, global_batch, tp, cp, cp_attention, zero_stages, recompute,
                                   schedules, micro_batches, sp, fixed)


def _layouts_at(model, n_gpus, global_batch, tp, cp, cp_attention, zero_stages, recompute, schedules,
                micro_batches, sp, fixed):
    """The layouts with this tp and (cp, variant): pp over what is left, then dp, ZeRO, recomputation, ..."""
    for pp in _divisors(n_gpus // (tp * cp)):
        dp = n_gpus // (tp * cp * pp)
        if pp > model["layers"] or global_batch % dp or (cp > 1 and pp > 1):
            continue
        experts = model.get("experts", 0)
        eps = [e for e in _divisors(dp) if experts % e == 0] if experts else [1]
        for z, rc, b, s, ep in itertools.product(zero_stages, recompute, micro_batches, sp, eps):
            if (z >= 2 and pp > 1) or (z > 0 and dp * cp == 1) or (s and (tp == 1 or experts or cp > 1)) \
                    or (global_batch // dp) % b:
                continue
            m = global_batch // (dp * b)
            scheds = [("1f1b", 1)] if pp == 1 else \
                [(sc, v) for sc in schedules for v in ((1,) if sc != "interleaved" else VIRTUAL)
                 if sc != "interleaved" or (model["layers"] % (pp * v) == 0 and m % pp == 0)]
            for sched, v in scheds:
                if pp > 1 and sched not in schedules:
                    continue
                yield PerfConfig(**model, **fixed, tp=tp, pp=pp, dp=dp, zero_stage=z, recompute=rc,
                                 micro_batch=b, sp=s, schedule=sched, virtual_stages=v, global_batch=global_batch,
                                 **({"ep": ep} if experts else {}),
                                 **({"cp": cp, "cp_attention": cp_attention} if cp > 1 else {}))


# --8<-- [start:plan]
def plan(model: dict, n_gpus: int, global_batch: int, hw: Hardware | str = "a100-80gb", *, top: int = 10,
         memory_fraction: float = 0.9, tokens: float | None = None, price_per_gpu_hour: float = 0.0, **options) -> dict:
    """Rank the layouts of `model` on `n_gpus` GPUs that fit `memory_fraction` of a GPU's memory.

    Args:
        model: layers, hidden, heads, vocab, seq_len (and optionally precision, fp32_grads, dropout,
            attention, position_embedding, pp_partition, stack: fixed for every layout).
        options: restrict the search, e.g. ``recompute=("full",)``, ``schedules=("1f1b",)``, ``zero_stages=(0, 1)``,
            or widen it: ``cps=(1, 2, 4, 8)`` searches context parallelism (``cp_attentions``: its variants);
            ``tps=(8, 16)`` searches only those tp degrees (each at most the NVLink domain, else refused).
    Returns:
        ``{"searched", "fit", "top": [row, ...]}``; a row is the layout, its `step_time` breakdown, memory
        per GPU and, with `tokens`, days, GPU-hours and cost.
    """
    hw = hardware(hw) if isinstance(hw, str) else hw
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction={memory_fraction}: must be in (0, 1]")
    if not (isinstance(n_gpus, int) and n_gpus >= 1):
        raise ValueError(f"n_gpus={n_gpus!r}: expected an integer >= 1")
    search = {k: options.pop(k) for k in ("zero_stages", "recompute", "schedules", "micro_batches", "sp", "cps",
                                          "cp_attentions", "tps") if k in options}
    shape = {**model, **options}
    searched, fits = 0, []
    budget = hw.memory_bytes * memory_fraction
    for cfg in layouts(shape, n_gpus, global_batch, hw, **search):
        searched += 1
        mem = est.memory_per_gpu(cfg.memory_config())["total"]
        if mem > budget:
            continue
        fits.append((cfg, step_time(cfg, hw)))
    fits.sort(key=lambda cr: (-cr[1]["tokens_per_s"], cr[1]["memory"]["total"]))
    rows = []
    for cfg, r in fits[:top]:
        row = {"layout": layout_name(cfg), "config": asdict(cfg), **{k: v for k, v in r.items() if k != "memory"},
               "memory_gb": r["memory"]["total"] / GB}
        if tokens:
            row.update(days_and_cost(r, tokens, price_per_gpu_hour, global_batch, cfg.seq_len))
        rows.append(row)
    return {"searched": searched, "fit": len(fits), "n_gpus": n_gpus, "hardware": hw.name, "top": rows,
            "ranked": [layout_name(c) for c, _ in fits]}
# --8<-- [end:plan]


SHAPE_KEYS = ("layers", "hidden", "heads", "vocab", "seq_len", "precision", "fp32_grads", "position_embedding",
              "pp_partition", "attention", "experts", "top_k", "capacity_factor", "moe_dispatch", "expert_ffn",
              "shared_experts", "kv_heads", "ffn", "mlp", "tied", "bias")


def preset_shape(name: str) -> dict:
    """The fixed part of an `estimate.PRESETS` entry (its layout left out), with the run's stack and dropout."""
    if name not in est.PRESETS:
        raise ValueError(f"model preset {name!r}: expected one of {sorted(est.PRESETS)}")
    shape = {k: v for k, v in est.PRESETS[name].items() if k in SHAPE_KEYS}
    if name == "bloom-176b":
        shape.update(dropout=False, stack="megatron-deepspeed")
    if name == "mt-nlg-530b":
        shape.update(stack="megatron-deepspeed")
    if name in est.LLAMA_PRESETS:                                   # no dropout in Llama's pre-training
        shape.update(dropout=False)
    return shape


def plan_rank(preset: str, n_gpus: int, global_batch: int, layout: str, hw: str = "a100-80gb", **options) -> int:
    """Rank of `layout` among the fitting layouts of a preset's shape (0 if it does not fit)."""
    return rank_of(plan(preset_shape(preset), n_gpus, global_batch, hw, top=0, **options), layout) or 0


def layout_name(cfg: PerfConfig) -> str:
    """dp8-tp4-pp12 z1 full b2 1f1b (+sp, +v2; dp8-ep4-tp1-pp1 with experts; dp2-cp8-tp4-pp1 … ulysses with cp)."""
    ep = f"-ep{cfg.ep}" if cfg.experts else ""
    cp = f"-cp{cfg.cp}" if cfg.cp > 1 else ""
    s = f"dp{cfg.dp}{ep}{cp}-tp{cfg.tp}-pp{cfg.pp} z{cfg.zero_stage} {cfg.recompute} b{cfg.micro_batch}"
    if cfg.cp > 1:
        s += f" {cfg.cp_attention}"
    if cfg.pp > 1:
        s += f" {cfg.schedule}" + (f" v{cfg.virtual_stages}" if cfg.schedule == "interleaved" else "")
    return s + (" sp" if cfg.sp else "")


def rank_of(result: dict, name: str) -> int | None:
    """1-based rank of a layout name in a `plan` result (None if it did not fit or was not searched)."""
    try:
        return result["ranked"].index(name) + 1
    except ValueError:
        return None
