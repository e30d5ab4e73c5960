"""``minimega checkpoint info | consolidate | export | import``: inspect and convert distributed checkpoints."""
from __future__ import annotations

import json

from ..config import GPTConfig


def add_checkpoint_parser(sub) -> None:
    p = sub.add_parser("checkpoint", help="inspect or consolidate a distributed checkpoint")
    csub = p.add_subparsers(dest="action", required=True)
    c = csub.add_parser("consolidate", help="write full fp32 weights (model.py keys) to one safetensors file")
    c.add_argument("dir", help="checkpoint directory (a step-… folder, or its parent with 'latest')")
    c.add_argument("out", help="output .safetensors file")
    c.set_defaults(func=_cmd_consolidate)
    i = csub.add_parser("info", help="print a checkpoint's manifest summary after checking the manifest, the "
                                             "checksums and every shard's header")
    i.add_argument("dir")
    i.set_defaults(func=_cmd_info)
    e = csub.add_parser("export", help="write a checkpoint for other tools: torch DCP, or one safetensors file")
    e.add_argument("dir", help="checkpoint directory (a step-… folder, or its parent with 'latest')")
    e.add_argument("out", help="output: a directory (dcp) or a .safetensors file")
    e.add_argument("--format", required=True, choices=["dcp", "safetensors"],
                   help="dcp: torch.distributed.checkpoint (dcp.load reads it into model.py's or FSDP2's state "
                        "dict); safetensors: consolidated fp32 weights")
    e.set_defaults(func=_cmd_export)
    m = csub.add_parser("import", help="a minimega checkpoint (weights) from a torch DCP directory of model.py's "
                                       "state dict (e.g. saved under FSDP2)")
    m.add_argument("source", help="the DCP directory")
    m.add_argument("dir", help="the minimega checkpoint directory to create (its step-… and 'latest')")
    m.add_argument("--preset", default="tiny", choices=["tiny", "small", "gpt2", "tiny-llama"],
                   help="model size (default: tiny)")
    m.add_argument("--model-config", default="{}", help="GPTConfig overrides as JSON, e.g. '{\"block_size\": 32}'")
    m.add_argument("--step", type=int, default=0, help="the step to record (default: 0)")
    m.set_defaults(func=_cmd_import)


def _cmd_consolidate(args) -> int:
    from .. import checkpoint
    out = checkpoint.consolidate(args.dir, args.out)
    print(f"wrote {out} ({out.stat().st_size / 2**20:.2f} MiB)")
    return 0


def _cmd_export(args) -> int:
    from .. import checkpoint
    out = checkpoint.export_dcp(args.dir, args.out) if args.format == "dcp" else \
        checkpoint.export_safetensors(args.dir, args.out)
    print(f"wrote {out} ({args.format})")
    return 0


def _cmd_import(args) -> int:
    from .. import checkpoint
    try:
        overrides = json.loads(args.model_config)
    except ValueError as exc:
        raise ValueError(f"--model-config is not JSON ({exc})") from None
    if not isinstance(overrides, dict):
        raise ValueError("--model-config must be a JSON object of GPTConfig fields")
    try:
        config = GPTConfig.preset(args.preset, **overrides)
    except TypeError as exc:
        raise ValueError(f"--model-config: {exc}") from None
    out = checkpoint.import_dcp(args.source, args.dir, config, step=args.step)
    print(f"wrote {out}")
    return 0


def _cmd_info(args) -> int:
    from .. import checkpoint
    path, manifest = checkpoint.checked(args.dir)        # manifest, sha256 of every file, every shard's header
    print(json.dumps({"path": str(path), "step": manifest["step"], "layout": manifest["layout"],
                      "files": len(manifest["files"]), "bytes": sum(f["bytes"] for f in manifest["files"].values()),
                      "tensors": len(manifest["tensors"]), "checks": "ok"}, indent=1))
    return 0
