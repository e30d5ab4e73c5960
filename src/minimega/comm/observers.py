"""The one interface through which anything watches the collectives of `minimega.comm`.

An observer is any object with three methods, each given the `comm.Call` being made:

    issued(call)    the collective was issued (synchronous or not); ``call.buffers`` are now in flight
    waiting(call)   this rank starts blocking on it (at once for a synchronous call, at ``Handle.wait()``
                    for an asynchronous one)
    done(call)      it completed: the rank stops waiting and its buffers are free

Four attach here: the `comm.log.CommLog` (what moved where), the simulated wire (`comm.wire`: a delay
per collective, and the time spent blocked), the launcher's watchdog (`watchdog.RankStatus`: which
collective a rank waits in, and since when) and the peak-memory tracker (`measure.PeakTracker`: the
buffers in flight).
"""
from __future__ import annotations

from contextlib import contextmanager

OBSERVERS: list = []


def attach(observer) -> None:
    """Tell ``observer`` about every collective from now on (until `detach`)."""
    OBSERVERS.append(observer)


def detach(observer) -> None:
    OBSERVERS.remove(observer)


@contextmanager
def observing(observer):
    """``with observing(x):`` attach ``x`` for the block."""
    attach(observer)
    try:
        yield observer
    finally:
        detach(observer)


def notify(event: str, call) -> None:
    """Call ``event`` ('issued', 'waiting' or 'done') on every observer, in the order they attached."""
    for observer in OBSERVERS:
        getattr(observer, event)(call)
