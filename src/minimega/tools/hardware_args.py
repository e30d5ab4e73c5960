"""``--gpu`` / ``--custom``: the hardware flags of `minimega plan` and `minimega dry-run`."""
from __future__ import annotations

import argparse

from ..analysis.hardware import HARDWARE, Hardware, hardware, parse_custom


def add_hardware_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--gpu", choices=sorted(HARDWARE), default="a100-80gb", help="hardware preset (default a100-80gb)")
    g.add_argument("--custom", default=None, help="custom hardware: " + parse_custom.__doc__.split("\n\n")[1].strip())


def hardware_from_args(args: argparse.Namespace) -> Hardware:
    return parse_custom(args.custom) if args.custom else hardware(args.gpu)
