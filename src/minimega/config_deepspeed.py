"""The DeepSpeed JSON reader behind `TrainConfig.from_deepspeed`: every key it accepts maps onto a
`TrainConfig` field, every other key is refused by name (with the reason where DeepSpeed has it and minimega
does not). Values are taken as JSON types: ``"false"`` is not a bool and ``"16"`` is not an int.
"""
from __future__ import annotations

import math


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_real(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


DS_MAX_BYTES = 2**20

# DeepSpeed keys minimega knows and refuses, with the reason (anything else unknown is refused too).
_DS_REFUSED = {
    "steps_per_print": "minimega prints every step (and `minimega train --json` the summary); there is no interval",
    "wall_clock_breakdown": "step timings are always recorded: Engine.report()['timeline']",
    "zero_optimization.allgather_bucket_size": "minimega's ZeRO all-gathers one unit (embeddings, a block, the "
                                               "head) per call, so there is no bucket to size",
    "zero_optimization.contiguous_gradients": "minimega's ZeRO always keeps gradients in flat contiguous buffers; "
                                              "there is nothing to switch",
    "zero_optimization.offload_optimizer.pin_memory": "the CPU store pins its buffers itself when CUDA is present",
}
_DS_KINDS = {"int": (is_int, "an integer"), "bool": (lambda v: isinstance(v, bool), "true or false"),
             "number": (is_real, "a finite number"), "str": (lambda v: isinstance(v, str), "a string")}


def _ds_section(config: dict, key: str, allowed: set[str], path: str | None = None) -> dict:
    """``config[key]`` (``config`` itself for key ''), checked to be an object with only ``allowed`` keys;
    ``path``: its dotted name in the file when it is nested deeper than the top level."""
    section = config if not key else config[key]
    key = path or key
    where = f"{key}." if key else ""
    if not isinstance(section, dict):
        raise ValueError(f"DeepSpeed config: '{key or 'the top level'}' must be a JSON object, got {section!r}")
    for k in section:
        if f"{where}{k}" in _DS_REFUSED:
            raise ValueError(f"DeepSpeed config: {where}{k} is not supported: {_DS_REFUSED[where + k]}; remove it")
    if unknown := sorted(set(section) - allowed):
        raise ValueError(f"DeepSpeed config: unsupported key(s) {', '.join(where + k for k in unknown)}; "
                         f"supported here: {', '.join(sorted(allowed))}")
    return section


def _ds_get(section: dict, key: str, kind: str, where: str = ""):
    """``section[key]`` if it has the JSON type ``kind`` (no coercion), else a ValueError naming the key."""
    value = section[key]
    ok, what = _DS_KINDS[kind]
    if not ok(value):
        raise ValueError(f"DeepSpeed config: {where}{key}={value!r} must be {what} (a JSON "
                         f"{'boolean' if kind == 'bool' else kind}, not {type(value).__name__})")
    return value


def read_deepspeed(config: dict, dp: int | None) -> dict:
    """TrainConfig fields from a DeepSpeed config dict (see `TrainConfig.from_deepspeed`)."""
    out: dict = {}
    top = _ds_section(config, "", {"train_batch_size", "train_micro_batch_size_per_gpu",
                                   "gradient_accumulation_steps", "gradient_clipping", "optimizer",
                                   "zero_optimization", "bf16", "fp16", "data_types", "communication_data_type"})
    ga = _ds_get(top, "gradient_accumulation_steps", "int") if "gradient_accumulation_steps" in top else 1
    out["gradient_accumulation_steps"] = ga
    tb = _ds_get(top, "train_batch_size", "int") if "train_batch_size" in top else None
    mb = _ds_get(top, "train_micro_batch_size_per_gpu", "int") if "train_micro_batch_size_per_gpu" in top else None
    if tb is not None:
        out["batch_size"] = tb
    if mb is not None:
        if dp is None:
            raise ValueError("DeepSpeed config: train_micro_batch_size_per_gpu needs the data-parallel degree: "
                             "pass dp= (the global batch is micro * gradient_accumulation_steps * dp)")
        if tb is not None and tb != mb * ga * dp:
            raise ValueError(f"DeepSpeed config: train_batch_size={tb} != train_micro_batch_size_per_gpu * "
                             f"gradient_accumulation_steps * dp = {mb} * {ga} * {dp} = {mb * ga * dp}")
        out["batch_size"] = mb * ga * dp
    if "gradient_clipping" in top:
        out["gradient_clipping"] = _ds_get(top, "gradient_clipping", "number")
    if "optimizer" in top:
        opt = _ds_section(top, "optimizer", {"type", "params"})
        kind = _ds_get(opt, "type", "str", "optimizer.").lower() if "type" in opt else "adamw"
        if kind not in ("adamw", "adam", "sgd"):
            raise ValueError(f"DeepSpeed config: optimizer.type={opt.get('type')!r}; supported: AdamW, Adam, SGD")
        mode = True                         # DeepSpeed: "Adam" decouples weight decay (AdamW) unless adam_w_mode false
        if "params" in opt:
            params = _ds_section(opt, "params", {"lr", "betas", "eps", "weight_decay", "adam_w_mode"},
                                 "optimizer.params")
            if "adam_w_mode" in params:
                mode = _ds_get(params, "adam_w_mode", "bool", "optimizer.params.")
                if kind != "adam":
                    raise ValueError(f"DeepSpeed config: optimizer.params.adam_w_mode={mode} has an effect only with "
                                     f"type Adam (AdamW always decouples weight decay); remove it")
        out["optimizer"] = "adamw" if kind == "adam" and mode else kind
        if "params" in opt:
            for k in ("lr", "eps", "weight_decay"):
                if k in params:
                    out[k] = _ds_get(params, k, "number", "optimizer.params.")
            if "betas" in params:
                betas = params["betas"]
                if not isinstance(betas, list) or len(betas) != 2 or not all(is_real(b) for b in betas):
                    raise ValueError(f"DeepSpeed config: optimizer.params.betas={betas!r} must be a list of two numbers")
                out["betas"] = tuple(betas)
    if "zero_optimization" in top:
        z = _ds_section(top, "zero_optimization", {
            "stage", "reduce_bucket_size", "overlap_comm", "stage3_param_persistence_threshold",
            "stage3_prefetch_bucket_size", "offload_optimizer"})
        w = "zero_optimization."
        stage = _ds_get(z, "stage", "int", w) if "stage" in z else 0
        out["zero_stage"] = stage
        if "reduce_bucket_size" in z:
            size = _ds_get(z, "reduce_bucket_size", "number", w)
            if stage != 0:
                raise ValueError(f"DeepSpeed config: zero_optimization.reduce_bucket_size with stage={stage} is not "
                                 "supported: minimega's ZeRO reduce-scatters one unit (embeddings, a block, the head) "
                                 "per call; the bucket size applies to DDP (stage 0) only; remove it")
            if size <= 0:
                raise ValueError(f"DeepSpeed config: zero_optimization.reduce_bucket_size={size} must be > 0")
            out["bucket_mb"] = size * 4 / 2**20                        # fp32 elements -> MiB
        # DeepSpeed's default is stage-dependent: on at stage 3 only (runtime/zero/config.py, overlap_comm_valid).
        out["overlap_comm"] = _ds_get(z, "overlap_comm", "bool", w) if "overlap_comm" in z else stage == 3
        if "stage3_param_persistence_threshold" in z:
            out["param_persistence_threshold"] = _ds_get(z, "stage3_param_persistence_threshold", "int", w)
        if "stage3_prefetch_bucket_size" in z:
            if _ds_get(z, "stage3_prefetch_bucket_size", "number", w) != 0:
                raise ValueError("DeepSpeed config: zero_optimization.stage3_prefetch_bucket_size > 0 is not "
                                 "supported: minimega prefetches exactly the next unit; use 0 (no prefetch) or "
                                 "remove the key (prefetch on)")
            out["prefetch"] = False
        if "offload_optimizer" in z:
            off = _ds_section(z, "offload_optimizer", {"device", "nvme_path"}, w + "offload_optimizer")
            device = _ds_get(off, "device", "str", w + "offload_optimizer.") if "device" in off else "none"
            if device not in ("cpu", "nvme", "none"):
                raise ValueError(f"DeepSpeed config: offload_optimizer.device={device!r}; supported: cpu, nvme, none")
            out["offload_optimizer"] = device != "none"
            if (device == "nvme") != ("nvme_path" in off):
                raise ValueError(f"DeepSpeed config: offload_optimizer.device={device!r} "
                                 + ("needs nvme_path (the directory for the files)" if device == "nvme" else
                                    "with nvme_path: nvme_path has an effect only with device 'nvme'; remove it"))
            if device == "nvme":
                out["nvme_path"] = _ds_get(off, "nvme_path", "str", w + "offload_optimizer.")
    else:
        out["overlap_comm"] = False     # no ZeRO section: stage 0, DeepSpeed reduces after backward
    enabled = {}
    for name, keys in (("bf16", {"enabled"}), ("fp16", {"enabled", "loss_scale", "initial_scale_power",
                                                        "loss_scale_window", "hysteresis", "min_loss_scale"})):
        if name in top:
            section = _ds_section(top, name, keys)
            enabled[name] = _ds_get(section, "enabled", "bool", f"{name}.") if "enabled" in section else False
    if "fp16" in top:
        fp16 = top["fp16"]
        extra = sorted(set(fp16) - {"enabled"})
        if extra and not enabled["fp16"]:
            raise ValueError(f"DeepSpeed config: fp16.{extra[0]} has an effect only with fp16.enabled=true; "
                             "remove it or enable fp16")
        for key, kind in (("loss_scale", "number"), ("initial_scale_power", "int"), ("loss_scale_window", "int"),
                          ("hysteresis", "int"), ("min_loss_scale", "number")):
            if key in fp16:
                out[key] = _ds_get(fp16, key, kind, "fp16.")
    if enabled.get("bf16") and enabled.get("fp16"):
        raise ValueError("DeepSpeed config: fp16 and bf16 are both enabled; enable at most one")
    out["precision"] = "bf16" if enabled.get("bf16") else "fp16" if enabled.get("fp16") else "fp32"
    sums = {**(_ds_section(top, "data_types", {"grad_accum_dtype"}) if "data_types" in top else {}),
            **{k: top[k] for k in ("communication_data_type",) if k in top}}      # bf16: fp32 sums (main_grad)
    if any(v != "fp32" for v in sums.values()) or (sums and out["precision"] != "bf16"):
        raise ValueError(f"DeepSpeed config: {sums}: minimega sums gradients in fp32 under bf16 only; use 'fp32' or remove")
    return out
