"""TrainConfig on the command line: one flag per field (``--zero-stage``, ``--tp`` …), the MoE flags, and the
config they build. Shared by ``minimega train`` and ``minimega export-config``."""
from __future__ import annotations

import argparse
import dataclasses
import functools
import typing

from ..config import TrainConfig


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field; defaults stay None so --config files are only overridden when set."""
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        flags = [f"--{f.name.replace('_', '-')}", *f.metadata.get("flags", ())]
        flags = list(dict.fromkeys(flags))
        doc = _field_doc(f.name)
        hint = hints[f.name]
        if hint is bool:
            parser.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=doc)
        elif f.name == "betas":
            parser.add_argument(*flags, dest=f.name, type=float, nargs=2, default=None, help=doc)
        else:
            base = typing.get_args(hint)[0] if typing.get_origin(hint) in (typing.Union, getattr(__import__("types"), "UnionType", None)) else hint
            parser.add_argument(*flags, dest=f.name, type=base, default=None,
                                help=f"{doc} (default: {f.default})")


@functools.lru_cache(maxsize=1)
def _config_source() -> tuple[str, ...]:
    """TrainConfig's source lines, read once (parsing them per field cost seconds on every command)."""
    import inspect
    return tuple(inspect.getsource(TrainConfig).splitlines())


def _field_doc(name: str) -> str:
    """The docstring under a TrainConfig field (read from the source, shown in --help)."""
    lines = _config_source()
    for i, line in enumerate(lines):
        if line.strip().startswith(f"{name}:") and i + 1 < len(lines) and lines[i + 1].strip().startswith('"""'):
            return lines[i + 1].strip().strip('"')
    return ""


def moe_config(args: argparse.Namespace):
    """The MoEConfig the --experts/--top-k/--capacity-factor/... flags ask for, or None (a dense model)."""
    from ..parallel.moe.layer import MoEConfig
    given = {k: v for k, v in (("n_experts", args.experts), ("top_k", args.top_k),
                               ("capacity_factor", args.capacity_factor),
                               ("dispatch", getattr(args, "moe_dispatch", None)),
                               ("z_loss_coef", getattr(args, "moe_z_loss", None)),
                               ("bias_update_rate", getattr(args, "moe_bias_rate", None)),
                               ("n_shared_experts", getattr(args, "shared_experts", None)),
                               ("expert_hidden", getattr(args, "expert_hidden", None))) if v is not None}
    if given and "n_experts" not in given:
        raise ValueError(f"{', '.join(MOE_FLAGS[k] for k in given)} need --experts N (they shape a mixture "
                         f"of experts)")
    return MoEConfig(**given) if given else None


def build_train_config(args: argparse.Namespace, dp: int) -> TrainConfig:
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                 if getattr(args, f.name, None) is not None}
    if "betas" in overrides:
        overrides["betas"] = tuple(overrides["betas"])
    if args.config:
        return TrainConfig.from_deepspeed(args.config, dp=dp, **overrides)
    return TrainConfig(**overrides)


MOE_FLAGS = {"n_experts": "--experts", "top_k": "--top-k", "capacity_factor": "--capacity-factor",
             "dispatch": "--moe-dispatch", "z_loss_coef": "--moe-z-loss", "bias_update_rate": "--moe-bias-rate",
             "n_shared_experts": "--shared-experts", "expert_hidden": "--expert-hidden"}


def given_flags(args: argparse.Namespace) -> dict[str, str]:
    """{config field: the flag that set it} for the fields given on the command line (not from --config)."""
    fields = {f.name: f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(TrainConfig)
              if getattr(args, f.name, None) is not None}
    moe = {"n_experts": args.experts, "top_k": args.top_k, "capacity_factor": args.capacity_factor,
           **{name: getattr(args, f"moe_{key}", None) for name, key in
              (("dispatch", "dispatch"), ("z_loss_coef", "z_loss"), ("bias_update_rate", "bias_rate"))},
           "n_shared_experts": getattr(args, "shared_experts", None), "expert_hidden": getattr(args, "expert_hidden", None)}
    fields.update({name: flag for name, flag in MOE_FLAGS.items() if moe[name] is not None})
    if args.dp is not None:
        fields["dp"] = "--dp"
    return fields
