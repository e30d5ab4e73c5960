"""Exercise (lab 13-predicting-step-time): the α-β time of a collective.

A message of S bytes over a link costs α (start-up latency) plus S/β (bytes over bandwidth). A ring
collective over n ranks runs in steps, and every step pays α:

    reduce-scatter, all-gather   n-1 steps; each rank sends (n-1)/n · S in all
    all-reduce                   a reduce-scatter then an all-gather: 2(n-1) steps, 2(n-1)/n · S
    send/recv (point to point)   one message: α + S/β, whatever n is

One rank (n = 1) has nobody to talk to. Write the formula, then run the check cell: it compares your
function with `minimega.analysis.perf.collective_time` on a grid of sizes, rank counts and links, and the lab then
uses your function to predict gloo on this machine.
"""
from __future__ import annotations


def collective_seconds(op: str, size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """Seconds for one ring collective (or a send/recv) of a `size_bytes` buffer over `n` ranks.

    Args:
        op: "all_reduce", "reduce_scatter", "all_gather" or "send_recv".
        size_bytes: S, the full buffer (for reduce-scatter the input, for all-gather the output).
        n: ranks in the group (n >= 1).
        alpha: seconds of latency per message (per ring step).
        beta: bytes per second one rank sends.

    Returns:
        The time in seconds.
    """
    raise NotImplementedError("exercise: complete collective_seconds in labs/exercises/alpha_beta.py")
