"""minimega: ZeRO, tensor and pipeline parallelism rebuilt small, and proven against PyTorch.

    import minimega as mm
    reports = mm.launch(worker, 2, mm.TrainConfig(zero_stage=0))

The public API is the table below. Each name is imported on first use: the commands that never train
(`minimega serve`, `cert`, `exam`, `estimate`, `plan`) start in a fraction of a second, without torch.
"""
from importlib import import_module as _import, util as _util
import sys as _sys
import types as _types
from typing import TYPE_CHECKING as _TYPE_CHECKING

from .version import __version__

_PUBLIC = {"GPT": ".model", "GPTConfig": ".config", "TrainConfig": ".config", "ParallelDims": ".mesh",
           "Mesh": ".mesh", "init_mesh": ".mesh", "launch": ".run.launch", "WorkerError": ".run.launch",
           "LaunchTimeout": ".run.launch", "initialize": ".train.engine", "Engine": ".train.engine"}
_MODULES = ("comm", "data", "estimate")   # estimate: the estimators (`minimega/estimate.py`), no torch

__all__ = [*_PUBLIC, *_MODULES, "__version__"]


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(_import(_PUBLIC[name], __name__), name)
    elif name in _MODULES or _util.find_spec(f"{__name__}.{name}") is not None:
        value = _import(f".{name}", __name__)      # mm.comm, mm.moe, ...
    else:
        raise AttributeError(f"module 'minimega' has no attribute {name!r}")
    globals()[name] = value                      # imported once: later lookups are plain attributes
    return value


class _Package(_types.ModuleType):
    """A module must never replace the public function of the same name (`mm.launch` is the function)."""

    def __setattr__(self, name, value):
        if not (name in _PUBLIC and isinstance(value, _types.ModuleType)):
            super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package

if _TYPE_CHECKING:                               # for editors and type checkers: the same names, imported eagerly
    from . import analysis as estimate, comm, data  # noqa: F401
    from .config import GPTConfig, TrainConfig  # noqa: F401
    from .train.engine import Engine, initialize  # noqa: F401
    from .run.launch import LaunchTimeout, WorkerError, launch  # noqa: F401
    from .mesh import Mesh, ParallelDims, init_mesh  # noqa: F401
    from .model import GPT  # noqa: F401
