"""Chapter 14's picture: one run's settings flowing into the DeepSpeed, Megatron-LM and torchtitan configs, read back
from what the exporters write (`export_deepspeed`, `export_megatron`, `export_table.TABLE`).

It lives with the exporters (the tools layer) because it runs them; importing it adds "settings-flow" to the
figures' animations (`minimega.figures.animations.BUILDERS`), which the site's hook does before it builds the pages.
"""
from __future__ import annotations

import json

import minimega as mm
from minimega.figures.animations import BUILDERS
from minimega.figures.animations._base import _w, cell, frame, meter
from minimega.tools.export_deepspeed import to_deepspeed
from minimega.tools.export_megatron import to_megatron, torchtitan_sections
from minimega.tools.export_table import TABLE

SETTINGS = dict(tp=2, pp=2, zero_stage=0, batch_size=32, micro_batches=4, gradient_clipping=1.0, lr=3e-4,
                activation_checkpointing="full", schedule="1f1b", sequence_parallel=True)
SHOWN = ("tp", "pp", "zero_stage", "batch_size", "micro_batches", "activation_checkpointing", "gradient_clipping", "lr")


def exports(settings: dict = SETTINGS, dp: int = 2) -> tuple[dict, list, dict]:
    """The run's DeepSpeed config (with Megatron-DeepSpeed), Megatron-LM flags and torchtitan sections."""
    cfg, model = mm.TrainConfig(**settings), mm.GPTConfig.tiny()
    return to_deepspeed(cfg, dp, megatron=True), to_megatron(cfg, dp, model), torchtitan_sections(cfg, dp, model)


def lookup(target: str, key: str, exported) -> str | None:
    """The value `exported` (one target's output) gives `key` (a TABLE cell's first word), or None."""
    key = key.rstrip(",:")
    if target == "megatron":
        if key not in exported:
            return None
        i = exported.index(key)
        return exported[i + 1] if i + 1 < len(exported) and not exported[i + 1].startswith("--") else "on"
    node = exported
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return json.dumps(node) if not isinstance(node, str) else node


def settings_flow(settings: dict = SETTINGS, dp: int = 2) -> dict:
    out = dict(zip(("deepspeed", "megatron", "torchtitan"), exports(settings, dp)))
    table = {row[0]: row[1:] for row in TABLE}
    cols = ("deepspeed", "megatron", "torchtitan")
    grid = [[cell("future") for _ in cols] for _ in SHOWN]
    frames = [frame([list(r) for r in grid], _w(
        f"One run on {dp * settings['tp'] * settings['pp']} GPUs (dp {dp}); each setting flows into the three stacks' "
        "configs, read back from what the exporters write.", f"Eén run op {dp * settings['tp'] * settings['pp']} GPU's "
        f"(dp {dp}); elke instelling gaat naar de configs van de drie stacks, teruggelezen uit wat de exporters "
        "schrijven."), (), meter(0, "d", f"/{len(SHOWN) * 3}"))]
    carried = 0
    for i, field in enumerate(SHOWN):
        texts = []
        for j, target in enumerate(cols):
            words_ = table[field][j]
            key = words_.split()[0].rstrip(",:") if not words_.startswith("—") else None
            value = lookup(target, key, out[target]) if key else None
            grid[i][j] = cell(target if value is not None else "none",
                              f"{key} = {value}" if value is not None else "—")
            carried += value is not None
            texts.append(grid[i][j]["t"])
        frames.append(frame([list(r) for r in grid], _w(
            f"{field} = {settings.get(field)}: DeepSpeed {texts[0]}; Megatron-LM {texts[1]}; torchtitan {texts[2]}.",
            f"{field} = {settings.get(field)}: DeepSpeed {texts[0]}; Megatron-LM {texts[1]}; torchtitan {texts[2]}."),
            [(i, j) for j in range(3)], meter(carried, "d", f"/{len(SHOWN) * 3}")))
    return {"name": "settings-flow", "settings": settings, "dp": dp,
            "title": _w("One run's settings in three stacks", "De instellingen van één run in drie stacks"),
            "rows": [_w(f, f) for f in SHOWN],
            "cols": [_w("DeepSpeed (ds_config.json)", "DeepSpeed (ds_config.json)"), _w("Megatron-LM flags", "Megatron-LM-flags"),
                     _w("torchtitan (TOML)", "torchtitan (TOML)")],
            "legend": {"deepspeed": _w("in ds_config.json", "in ds_config.json"), "megatron": _w("a flag", "een flag"),
                       "torchtitan": _w("a TOML key", "een TOML-sleutel"),
                       "none": _w("elsewhere (Megatron-DeepSpeed's command line) or the default",
                                  "elders (commandoregel van Megatron-DeepSpeed) of de standaard")},
            "frames": frames, "meter_label": _w("Settings carried", "Instellingen meegenomen")}


BUILDERS["settings-flow"] = settings_flow
