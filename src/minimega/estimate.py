"""`minimega.estimate`: the estimators of `minimega.analysis` under the name the course and DESIGN.md use.

    import minimega.estimate as est
    est.model_state_bytes(7.5e9, 64, 3)

This module is `minimega.analysis` itself: importing it puts that package in its place. It is loaded when it
is named, never by `import minimega`, so a training rank loads no estimator (tests/test_front_door.py).
"""
import sys

from . import analysis

sys.modules[__name__] = analysis
