"""Step-through animations for the course site, one or more per chapter: each a list of frames computed from the package.

An animation is a grid (rows × columns of cells) shown one frame at a time by
``course/assets/javascripts/animate.js``. Every frame gives each cell a state (a CSS class and a short
label), a caption in the page's language, a meter (one number that runs with the frames: where memory
is the point, the bytes on one rank) and the data that moves in that frame. Nothing is drawn by hand:
the states come from the package, and tests/test_animations*.py check them against it.

    chapter  name                  frames from
    1        memory-stack          `estimate.state_bytes_per_param`, `activation_bytes_per_layer`, `model_state_breakdown`
    2        ring-all-reduce       the ring's chunk moves; bytes add up to `estimate.ring_bytes`
    3        zero-1, -2, -3        the recorded tiny GPT's units; collectives equal a real run's CommLog
    4        loss-scaler           `precision.DynamicLossScaler.update` over steps with overflows
    5        offload-nvme          `estimate.nvme_placement`, `nvme_bytes_per_step` per unit
    6        recompute             `activation_bytes_per_layer(recompute="full")`, `recompute_working_bytes`
    7        megatron-fg           `estimate.tp_comm_elements_per_layer`
    8        pipeline-*            the tick grid of `pipeline.schedules.plan`
    9        grid-3d               `ParallelDims.rank_of` and `group_ranks` per phase
    10       async-rollback        `health.HealthMonitor`'s verdict and the last checkpoint on disk
    11       fsdp-unit             `zero.stage3.UnitState` through one unit's step
    12       goodput               `estimate.mtbf_hours`, `young_daly_interval`, `goodput` (Llama 3's failure rate)
    13       step-split            `perf.step_time` of BLOOM-176B's published layout
    14       settings-flow         the exporters' DeepSpeed JSON, Megatron-LM flags and torchtitan TOML
    15       ring-attention        `context_parallel.chunk_ids`, `visibility`
    16       moe-route             `moe.MoELayer.select` and `assign_slots`; bytes equal `moe_alltoall_bytes`
    17       capstone              course/data/capstone.json (`figures.capstone`): predictions next to published numbers

`animation(name, lang)` returns the JSON-ready dict; the site hook (tools/learner_hook.py) embeds it in
the page that calls ``{{ animation("NAME") }}``.
"""
from __future__ import annotations

from minimega.figures.animations._base import LANGS, localize  # noqa: F401
from minimega.figures.animations.collectives import megatron_fg, ring_all_reduce, ring_attention  # noqa: F401
from minimega.figures.animations.pipeline_grid import SCHEDULE_OF, _slot, grid_of, pipeline  # noqa: F401
from minimega.figures.animations.zero import zero, zero_comm, zero_units  # noqa: F401
from minimega.figures.animations import layout, memory, outcomes, timeline

BUILDERS = {
    "memory-stack": memory.memory_stack,
    "ring-all-reduce": ring_all_reduce,
    "zero-1": lambda: zero(1), "zero-2": lambda: zero(2), "zero-3": lambda: zero(3),
    "loss-scaler": timeline.loss_scaler,
    "offload-nvme": memory.offload_nvme,
    "recompute": memory.recompute,
    "megatron-fg": megatron_fg,
    "pipeline-gpipe": lambda: pipeline("gpipe"), "pipeline-1f1b": lambda: pipeline("1f1b"),
    "pipeline-interleaved": lambda: pipeline("interleaved"), "pipeline-zb-h1": lambda: pipeline("zb_h1"),
    "grid-3d": layout.grid_3d,
    "async-rollback": timeline.async_rollback,
    "fsdp-unit": layout.fsdp_unit,
    "goodput": timeline.goodput,
    "step-split": timeline.step_split,
    "ring-attention": ring_attention,
    "moe-route": outcomes.moe_route,
    "capstone": outcomes.capstone,
}

CHAPTERS = {
    "01-memory": ["memory-stack"], "02-data-parallel": ["ring-all-reduce"], "03-zero": ["zero-3", "zero-2", "zero-1"],
    "04-mixed-precision": ["loss-scaler"], "05-offload": ["offload-nvme"], "06-activation-checkpointing": ["recompute"],
    "07-tensor-parallel": ["megatron-fg"],
    "08-pipeline-parallel": ["pipeline-gpipe", "pipeline-1f1b", "pipeline-interleaved", "pipeline-zb-h1"],
    "09-3d-parallel": ["grid-3d"], "10-checkpoints": ["async-rollback"], "11-fsdp": ["fsdp-unit"],
    "12-stack-and-cost": ["goodput"], "13-predicting-step-time": ["step-split"], "14-real-stacks": ["settings-flow"],
    "15-long-context": ["ring-attention"], "16-mixture-of-experts": ["moe-route"], "17-capstone": ["capstone"],
}
"""The animations each chapter's Picture section shows (the site test checks every page carries them)."""


def animation(name: str, lang: str = "en") -> dict:
    if name not in BUILDERS:
        raise KeyError(f"unknown animation {name!r}; have {sorted(BUILDERS)} (chapter 14's settings-flow runs the "
                       f"exporters: import minimega.tools.export_flow first)")
    return localize(BUILDERS[name](), lang)
