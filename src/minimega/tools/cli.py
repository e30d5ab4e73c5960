"""``minimega``: the command line. Each command lives in its own module; this one assembles them.

    train          tools/train.py           estimate   tools/estimate_cli.py    plan        tools/plan_cli.py
    calibrate      tools/calibrate_cli.py   record     tools/record_cli.py      checkpoint  tools/checkpoint_cli.py
    dry-run        tools/dry_run_cli.py     trace      tools/trace_cli.py
    export-config  tools/export_config.py   serve, cert, exam   classroom/cli.py
"""
from __future__ import annotations

import argparse
import sys

from .args import Parser
from .checkpoint_cli import add_checkpoint_parser
from .train import add_train_parser


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="minimega", description="minimega: train, estimate, plan, export-config, checkpoint; serve the course and its exam; verify certificates.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    add_checkpoint_parser(sub)
    from ..classroom.checkbank import add_exam_parser
    from ..classroom.cli import add_cert_parser, add_serve_parser
    from .dry_run_cli import add_dry_run_parser
    from .estimate_cli import add_estimate_parser
    from .export_config import add_export_parser
    from .record_cli import add_record_parser
    from .calibrate_cli import add_calibrate_parser
    from .plan_cli import add_plan_parser
    from .trace_cli import add_trace_parser
    add_estimate_parser(sub)
    add_plan_parser(sub)
    add_dry_run_parser(sub)
    add_calibrate_parser(sub)
    add_export_parser(sub)
    add_record_parser(sub)
    add_trace_parser(sub)
    add_serve_parser(sub)
    add_cert_parser(sub)
    add_exam_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..checkpoint import CheckpointError
    from ..launch import WorkerError

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:      # --help, or a refused command line (already explained on stderr)
        return exit_.code
    try:
        return args.func(args)
    except WorkerError as exc:       # a rank failed: its message already names it and carries its traceback
        print(f"\nminimega {args.command}: {exc}", file=sys.stderr)      # below any progress bar
        return 1
    except (ValueError, CheckpointError) as exc:   # configuration mistakes, unusable checkpoints: one line
        print(f"minimega {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
