"""The estimators under the name the course uses: ``import minimega.estimate as est`` gives ``minimega.analysis``."""
import sys

from . import analysis

sys.modules[__name__] = analysis
