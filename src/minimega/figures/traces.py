"""The course's recorded traces by name and where they are written: `minimega record --help` reads them without
loading torch (`figures.record`, which runs the jobs, does)."""
from pathlib import Path

TRACES = ("ddp-overlap", "memory", "tp-comm", "activations", "zero-memory", "zero-prefetch", "pipeline", "comm-wire")
DEFAULT_OUT = Path("course") / "data"
