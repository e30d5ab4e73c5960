"""Exercise (lab 16-mixture-of-experts): which tokens an expert keeps when it is over capacity.

Each token of a sequence picks its top-k experts. An expert has ``capacity`` slots per sequence; when more
tokens choose it, the extra ones are dropped (the residual connection carries them past the layer).
Which ones? GShard's priority: first every token's *first* choice, in token order, then every token's
second choice, and so on. An expert fills its slots 0, 1, 2, ... in that order.

Complete ``assign_slots``; the lab's check compares it with `minimega.parallel.moe.layer.assign_slots` on many routings.
"""
from __future__ import annotations


def assign_slots(choices: list[list[int]], n_experts: int, capacity: int) -> list[list[int | None]]:
    """The slot each (token, choice) takes in its expert, or None when the expert is full.

    Args:
        choices: one list per token of the sequence, its k distinct expert ids, best first.
        n_experts: E.
        capacity: slots per expert in this sequence.

    Returns:
        A list shaped like ``choices``: ``out[t][j]`` is the 0-based slot of token t's j-th choice in
        expert ``choices[t][j]``, or None if that expert's slots were all taken by then.

    Example: choices [[0, 1], [0, 1], [0, 2]], capacity 2 -> [[0, 0], [1, 1], [None, 0]]
    (token 2's first choice comes third in expert 0's queue).
    """
    raise NotImplementedError("exercise: complete assign_slots in labs/exercises/moe_slots.py")
