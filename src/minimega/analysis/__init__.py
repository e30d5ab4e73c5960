"""Analysis: what the core's numbers should be, predicted before anything runs.

The estimators are pure functions of a few integers (no torch), one concern per file:

    memory.py          model states per rank (ZeRO paper), padded flat buffers, peak bytes during a step
    communication.py   bytes on the wire (ring model): data, tensor, context and expert parallelism
    activations.py     saved activations per layer (Korthikanti et al.), recomputation, the experts'
    pipeline.py        bubbles and micro-batches in flight
    flops.py           parameters, FLOPs, MFU, time, GPU-hours and money
    goodput.py         failure rate vs GPU count, the Young/Daly checkpoint interval, time lost per failure
    shapes.py          block shapes after GPT-2: GQA, SwiGLU, untied heads, bias-free blocks (Llama)
    calculator.py      everything per GPU (`MemoryConfig`, `memory_per_gpu`, published presets)
    disk.py            the disk tier of offload (ZeRO-Infinity): bytes on disk and read/written per step

and above them the step-time model (``perf.py``, ``hardware.py``), the planner (``plan.py``) and the
calibration on this machine (``calibrate.py``). This package gathers every estimator under one name,
``minimega.analysis`` (the course's ``minimega.analysis``): ``est.model_state_bytes(7.5e9, 64, 3)``.
The core never imports analysis; where they share a rule (a flat buffer's padding, an expert's slots), both
read it from the core's torch-free ``minimega/sizes.py``, so the prediction and the code cannot disagree on it,
and importing the estimators never loads torch.
"""
from .activations import *  # noqa: F403
from .calculator import *  # noqa: F403
from .communication import *  # noqa: F403
from .disk import *  # noqa: F403
from .flops import *  # noqa: F403
from .goodput import *  # noqa: F403
from .memory import *  # noqa: F403
from .pipeline import *  # noqa: F403
from .shapes import *  # noqa: F403
