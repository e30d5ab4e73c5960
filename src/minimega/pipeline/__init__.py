"""Pipeline parallelism: `stage` cuts the model, `schedules` orders the passes, `runtime` runs them.

GPipe (Huang et al. 2019, arXiv:1811.06965), 1F1B (PipeDream-Flush), interleaved 1F1B with v
virtual stages per rank (Narayanan et al. 2021, arXiv:2104.04473 §2.2) and ZB-H1, 1F1B with the
backward split into input- and weight-gradient passes (Qi et al. 2023, arXiv:2401.10241 §2.1).
"""
from .runtime import Pipeline
from .schedules import SCHEDULES, Action, Plan, bubble_slots, check, peak_in_flight, plan
from .stage import StageChunk, layer_bounds, split_model

__all__ = ["Pipeline", "SCHEDULES", "Action", "Plan", "plan", "check", "bubble_slots", "peak_in_flight",
           "StageChunk", "layer_bounds", "split_model"]
