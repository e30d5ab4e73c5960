"""minimega: ZeRO, tensor and pipeline parallelism rebuilt small, and proven against PyTorch.

    import minimega as mm
    reports = mm.launch(worker, 2, mm.TrainConfig(zero_stage=0))
"""
import sys as _sys

from . import comm, data
from .config import GPTConfig, TrainConfig
from .engine import Engine, initialize
from .launch import LaunchTimeout, WorkerError, launch
from .mesh import Mesh, ParallelDims, init_mesh
from .model import GPT

from . import analysis as estimate  # the estimators under the name the course and DESIGN.md use

_sys.modules[__name__ + ".estimate"] = estimate   # so `import minimega.analysis as est` works too

from .version import __version__
__all__ = ["GPT", "GPTConfig", "TrainConfig", "ParallelDims", "Mesh", "init_mesh", "launch", "WorkerError",
           "LaunchTimeout", "initialize", "Engine", "comm", "data", "estimate", "__version__"]
