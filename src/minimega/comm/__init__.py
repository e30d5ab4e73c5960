"""Communication: every byte that crosses ranks goes through this package.

    collectives.py  all-reduce, reduce-scatter, all-gather, broadcast, all-to-all, p2p: the only caller of
                    torch.distributed's communication functions
    observers.py    the one interface that sees every call (issued, waited on, done)
    log.py          `CommLog`: what moved where, in ring-model bytes (an observer)
    wire.py         a simulated wire of fixed latency, so tests see overlap rather than assume it (an observer)
    autograd.py     collectives as autograd sees them: `exchange`, the all-to-all whose backward is itself
                    (Ulysses over cp, the experts' dispatch over ep)

Callers write ``comm.all_reduce(t, group)``: the names below are the package's interface.
"""
from .collectives import (Call, Group, Handle, P2P, all_gather, all_gather_object, all_reduce, all_reduce_mean,
                          all_to_all, any_rank, barrier, batch_p2p, broadcast, overlap, recv, reduce_scatter, send)
from .log import CommLog, CommRecord, ring_bytes
from .observers import OBSERVERS, attach, detach, notify, observing
from .wire import WIRE, blocked_seconds, delay

__all__ = ["Call", "Group", "Handle", "P2P", "all_gather", "all_gather_object", "all_reduce", "all_reduce_mean",
           "all_to_all", "any_rank", "barrier", "batch_p2p", "broadcast", "overlap", "recv", "reduce_scatter", "send",
           "CommLog", "CommRecord", "ring_bytes", "OBSERVERS", "attach", "detach", "notify", "observing", "WIRE",
           "blocked_seconds", "delay"]
