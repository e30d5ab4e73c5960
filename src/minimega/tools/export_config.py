"""The same run in the real stacks' own words: a `TrainConfig` as DeepSpeed, Megatron-LM and torchtitan config.

    to_deepspeed(cfg, dp)                 the ds_config.json dict (from_deepspeed reads it back to the same config)
    to_deepspeed(cfg, dp, megatron=True)  the ds_config.json that goes with Megatron-DeepSpeed's command line
    to_megatron(cfg, dp, model)           Megatron-LM's pretrain_gpt.py arguments, as an argv list
    to_torchtitan(cfg, dp, model)         torchtitan's TOML job config (the sections of v0.2.2's JobConfig)

Each exporter either writes a setting the target reads with the same meaning, or raises `ExportError` naming
the setting and the target ("what a target cannot express is an error"). Where the target holds the setting
with a narrower scope (Megatron-LM never decays biases and LayerNorm weights), the export goes through and
`notes()` says so. `TABLE` is the one mapping the exporters follow; chapter 14 prints it and a test pins the
exporters to it.

Sources the names are checked against (paths at the snapshot commits; DeepSpeed's are also checked live
by `check_deepspeed` when `deepspeed` imports):
    DeepSpeed 0.19.8       deepspeed/runtime/config.py (DeepSpeedConfig, DEEPSPEED_OPTIMIZERS, ADAM_W_MODE),
                           deepspeed/runtime/zero/config.py (DeepSpeedZeroConfig, pydantic, extra keys forbidden),
                           deepspeed/runtime/engine.py (_do_optimizer_sanity_check: bf16 + stage 0 + a pipeline
                           -> BF16_Optimizer, which shards the optimizer states: BLOOM's "stage 0")
    Megatron-LM d98e8a6    megatron/training/arguments.py (explicit flags), megatron/training/argument_utils.py
                           (dataclass field foo_bar -> --foo-bar; a True default -> --no-foo-bar),
                           megatron/core/{model_parallel_config,transformer/transformer_config}.py,
                           megatron/core/optimizer/{optimizer_config,__init__}.py, megatron/training/config/*.py
    torchtitan v0.2.2      torchtitan/config/job_config.py (the last release configured by TOML; the Python
                           config registry replaced it in #2386)
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from ..config import GPTConfig, TrainConfig
from .export_deepspeed import check_deepspeed, to_deepspeed
from .export_megatron import MEGATRON_FLAGS, TORCHTITAN_KEYS, to_megatron, to_torchtitan, torchtitan_sections  # noqa: F401
from .export_table import TABLE, TARGETS, ExportError, get_field, markdown_table  # noqa: F401  (the public names)
from .export_slurm import SlurmJob, to_slurm
from .train_args import add_config_flags, build_train_config



# ------------------------------------------------------------------------------------------------
# Notes and presets

def notes(cfg: TrainConfig, target: str, model: GPTConfig | None = None) -> list[str]:
    """What the export carries with a narrower or different scope on the target (not refused, but not identical)."""
    out = []
    if target == "megatron":
        if model is not None and not model.bias:
            out.append("Megatron-LM's LayerNorm always has a bias; minimega's GPT has none when bias=False")
        if cfg.weight_decay:
            out.append("Megatron-LM skips weight decay on biases and 1-D weights (LayerNorm); minimega decays "
                       "every tensor (megatron/core/optimizer/__init__.py L110-120)")
    return out


@dataclass(frozen=True)
class Preset:
    """A published run: the model shape, the TrainConfig and the data-parallel degree it ran with."""
    model: GPTConfig
    train: TrainConfig
    dp: int
    source: str


# --8<-- [start:bloom]
def bloom_176b() -> Preset:
    """BLOOM-176B's parallel layout, precision and optimizer (bigscience tr11-176B-ml, 384 A100s, 48 nodes).

    70 layers, hidden 14336, 112 heads, sequence 2048, vocabulary padded to 250880; TP=4, PP=12, DP=8;
    micro-batch 2, global batch 2048; bf16 with DeepSpeed's BF16_Optimizer (ZeRO-1 at "stage 0");
    full activation checkpointing; Adam (0.9, 0.95, 1e-8), lr 6e-5, weight decay 0.1, clip 1.0, seed 42.
    Sources: bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm L63-147 and README.md L178-187.
    Differences from BLOOM's model that a GPTConfig cannot state: ALiBi instead of learned positions,
    a LayerNorm after the embedding, tied embeddings (`notes`). The lr schedule (warm-up, cosine decay)
    and the batch-size ramp-up are not TrainConfig fields: minimega keeps lr constant.
    """
    model = GPTConfig(vocab_size=250880, block_size=2048, n_layer=70, n_head=112, n_embd=14336, bias=True, dropout=0.0)
    train = TrainConfig(tp=4, pp=12, zero_stage=1, precision="bf16", activation_checkpointing="full",
                        schedule="1f1b", micro_batches=2048 // (8 * 2), batch_size=2048, seq_len=2048,
                        gradient_clipping=1.0, optimizer="adamw", lr=6e-5, betas=(0.9, 0.95), eps=1e-8,
                        weight_decay=0.1, seed=42, overlap_comm=False)
    return Preset(model=model, train=train, dp=8,
                  source="bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm")
# --8<-- [end:bloom]


PRESETS = {"bloom-176b": bloom_176b}


# ------------------------------------------------------------------------------------------------
# minimega export-config

def add_export_parser(sub) -> None:
    """`minimega export-config --deepspeed | --megatron | --torchtitan` (TrainConfig flags as in `train`)."""
    p = sub.add_parser("export-config", help="write a run's config for DeepSpeed, Megatron-LM or torchtitan",
                       description="Export a TrainConfig (flags as in `minimega train`) to a real stack's config. "
                                   "A setting the target cannot express is an error naming it.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--deepspeed", dest="target", action="store_const", const="deepspeed",
                       help="ds_config.json (with --megatron-deepspeed: the one that goes with Megatron-DeepSpeed)")
    which.add_argument("--megatron", dest="target", action="store_const", const="megatron",
                       help="Megatron-LM pretrain_gpt.py arguments")
    which.add_argument("--torchtitan", dest="target", action="store_const", const="torchtitan",
                       help="torchtitan (v0.2.2) TOML job config")
    which.add_argument("--slurm", dest="target", action="store_const", const="slurm",
                       help="an sbatch script: srun starts one `minimega train` per rank, SIGUSR1 before the time "
                            "limit saves a checkpoint, the job requeues itself and resumes")
    job = p.add_argument_group("with --slurm")
    for field in dataclasses.fields(SlurmJob):
        job.add_argument(f"--{field.name.replace('_', '-')}", dest=f"slurm_{field.name}", default=field.default,
                         type=type(field.default) if field.default is not None else str,
                         help=f"(default: {field.default})")
    p.add_argument("--megatron-deepspeed", action="store_true",
                   help="with --deepspeed: tp, pp, recomputation, seq_len and seed go on Megatron-DeepSpeed's command line")
    p.add_argument("--preset", default="tiny", choices=["tiny", "small", "gpt2", *PRESETS],
                   help="model shape; a published run's name also sets its TrainConfig and dp (default: tiny)")
    p.add_argument("--nproc", type=int, default=None,
                   help="ranks; dp = nproc / (tp * pp * cp) (default: the preset's dp, or 1)")
    p.add_argument("--config", default=None, help="start from a DeepSpeed-style JSON config; flags override it")
    p.add_argument("--out", default=None, help="write to this file instead of standard output")
    p.add_argument("--no-check", action="store_true", help="do not parse the ds_config with DeepSpeed's own classes")
    add_config_flags(p)
    p.set_defaults(func=_cmd_export)


def _cmd_export(args) -> int:
    import sys
    from pathlib import Path

    preset = PRESETS[args.preset]() if args.preset in PRESETS else None
    model = preset.model if preset else GPTConfig.preset(args.preset)
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                 if getattr(args, f.name, None) is not None}
    tp, pp = overrides.get("tp", preset.train.tp if preset else 1), overrides.get("pp", preset.train.pp if preset else 1)
    cp = overrides.get("cp", 1)
    given = [f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(SlurmJob)
             if getattr(args, f"slurm_{f.name}") != f.default]
    if given and args.target != "slurm":
        raise ValueError(f"{', '.join(given)} shape a Slurm job script: they go with --slurm")
    if args.target == "slurm":
        ranks = args.slurm_nodes * args.slurm_tasks_per_node
        if args.nproc not in (None, ranks):
            raise ValueError(f"--nproc {args.nproc} but --nodes x --tasks-per-node = {ranks}: give one of the two")
        args.nproc = ranks
    if args.nproc is not None:
        if args.nproc < 1 or args.nproc % (tp * pp * cp):
            raise ValueError(f"--nproc {args.nproc} is not a positive multiple of tp * pp * cp = {tp * pp * cp}")
        dp = args.nproc // (tp * pp * cp)
    else:
        dp = preset.dp if preset else 1
    if preset and not args.config:
        cfg = preset.train.replace(**{k: tuple(v) if k == "betas" else v for k, v in overrides.items()})
    else:
        cfg = build_train_config(args, dp)
    if args.megatron_deepspeed and args.target != "deepspeed":
        raise ValueError("--megatron-deepspeed goes with --deepspeed")
    if args.target == "deepspeed":
        ds = to_deepspeed(cfg, dp, megatron=args.megatron_deepspeed)
        text = json.dumps(ds, indent=2) + "\n"
        if not args.no_check:
            try:
                version = check_deepspeed(ds, dp)
                print(f"minimega export-config: checked against DeepSpeed {version}'s config classes", file=sys.stderr)
            except ImportError:
                print("minimega export-config: deepspeed is not installed; keys not checked against its classes",
                      file=sys.stderr)
    elif args.target == "megatron":
        argv = to_megatron(cfg, dp, model)
        pairs, i = [], 0
        while i < len(argv):
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            pairs.append(" ".join(argv[i:i + 2]) if has_value else argv[i])
            i += 2 if has_value else 1
        text = "pretrain_gpt.py \\\n    " + " \\\n    ".join(pairs) + "\n"
    elif args.target == "slurm":
        if preset:
            raise ValueError(f"--slurm --preset {args.preset}: `minimega train` builds tiny, small or gpt2")
        job = SlurmJob(**{f.name: getattr(args, f"slurm_{f.name}") for f in dataclasses.fields(SlurmJob)})
        text = to_slurm(cfg, job, args.preset)
    else:
        text = to_torchtitan(cfg, dp, model)
    for note in notes(cfg, args.target, model):
        print(f"minimega export-config: note: {note}", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text, end="")
    return 0
