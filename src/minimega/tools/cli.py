"""``minimega``: the command line. Each command lives in its own module; this one assembles them.

    train          tools/train.py           estimate   tools/estimate_cli.py    plan        tools/plan_cli.py
    calibrate      tools/calibrate_cli.py   record     tools/record_cli.py      checkpoint  tools/checkpoint_cli.py
    dry-run        tools/dry_run_cli.py     trace      tools/trace_cli.py
    export-config  tools/export_config.py   serve, cert, exam   classroom/cli.py
"""
from __future__ import annotations

import argparse
import sys

from importlib import import_module

from .args import Parser

# Each command: the module that adds its parser (and runs it), and that function's name.
COMMANDS = {"train": (".train", "add_train_parser"), "checkpoint": (".checkpoint_cli", "add_checkpoint_parser"),
            "estimate": (".estimate_cli", "add_estimate_parser"), "plan": (".plan_cli", "add_plan_parser"),
            "dry-run": (".dry_run_cli", "add_dry_run_parser"), "calibrate": (".calibrate_cli", "add_calibrate_parser"),
            "export-config": (".export_config", "add_export_parser"), "record": (".record_cli", "add_record_parser"),
            "trace": (".trace_cli", "add_trace_parser"), "serve": ("..classroom.cli", "add_serve_parser"),
            "cert": ("..classroom.cli", "add_cert_parser"), "exam": ("..classroom.checkbank", "add_exam_parser")}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The command line. Given ``argv``, only the named command's module is imported: `minimega serve`, `cert`
    and `exam` then start without torch (4 s and 200 MB less). `--help`, or an unknown command, loads them all."""
    parser = Parser(prog="minimega", description="minimega: train, estimate, plan, export-config, checkpoint; serve the course and its exam; verify certificates.")
    sub = parser.add_subparsers(dest="command", required=True)
    named = next((a for a in argv or () if not a.startswith("-")), None)
    for name, (module, add) in COMMANDS.items():
        if named not in COMMANDS or named == name:
            getattr(import_module(module, __package__), add)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser(argv).parse_args(argv)
    except SystemExit as exit_:      # --help, or a refused command line (already explained on stderr)
        return exit_.code
    try:
        return args.func(args)
    except Exception as exc:
        from ..checkpoint import CheckpointError    # imported here: the service commands never load torch
        from ..run.launch import WorkerError
        if isinstance(exc, WorkerError) and exc.exc_type == "CheckpointError":   # a rank refused the checkpoint
            reason = exc.remote_traceback.strip().splitlines()[-1].split(": ", 1)[-1] if exc.remote_traceback else exc
            print(f"minimega {args.command}: error: rank {exc.rank}: {reason}", file=sys.stderr)
            return 2
        if isinstance(exc, WorkerError):  # a rank failed: its message already names it and carries its traceback
            print(f"\nminimega {args.command}: {exc}", file=sys.stderr)      # below any progress bar
            return 1
        if isinstance(exc, (ValueError, CheckpointError)):   # configuration mistakes, unusable checkpoints: one line
            print(f"minimega {args.command}: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
