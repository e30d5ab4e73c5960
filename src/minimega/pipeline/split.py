"""ZB-H1's split backward of one chunk: B (the input gradient) now, W (the weight gradients) later, each once.

The autograd graph of a chunk has one path that carries the gradient down to the chunk's input (the
residual stream) and, hanging off it, short branches that end at the weights. The node where a weight's
branch leaves the input path is its *split point*: a linear's matmul (dX = dY·W on the path, dW = dYᵀ·X on
the branch), a LayerNorm. B walks the graph once to find them, hooks each to keep the gradient that flows
into it, and asks autograd for the input gradient only, so each split point computes just its dX. W then
starts autograd *at the split points* (``GradientEdge``s seeded with the kept gradients), for the weights
only: each split point now computes just its dW, and nothing on the input path runs a second time.
This is the approach of ``torch.distributed.pipelining``'s ``stage_backward_input`` /
``stage_backward_weight``; the GradientEdge form keeps every layer as it is (no custom linear).

What the split holds between B and W (`Owed.held_bytes`): one gradient per split point, the size of
that layer's output (B/m · T · D, or · 4D for the MLP's first linear), on top of the graph's saved
tensors that 1F1B holds anyway until its backward (the weight gradients need the layers' inputs).
W frees both.

A chunk whose input needs no gradient (chunk 0: token ids) has no input path: its B does nothing and its
W is the whole backward.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node


def _node(t: torch.Tensor) -> Node:
    """The graph node a tensor's gradient enters: its grad_fn, or a leaf's AccumulateGrad."""
    if t.grad_fn is not None:
        return t.grad_fn
    return t.view_as(t).grad_fn.next_functions[0][0]


def _consumers(root: Node) -> dict[Node, list[Node]]:
    """For every node below ``root``, the nodes that pass gradient into it (the graph's edges reversed)."""
    up: dict[Node, list[Node]] = {root: []}
    stack = [root]
    while stack:
        node = stack.pop()
        for child, _ in node.next_functions:
            if child is None:
                continue
            if child not in up:
                up[child] = []
                stack.append(child)
            up[child].append(node)
    return up


def _above(start: Node, up: dict, stop: set | frozenset = frozenset()) -> tuple[set, set]:
    """Nodes whose gradient flows on into ``start`` (start included), not walking past ``stop``; and the
    ``stop`` nodes met."""
    seen, met, stack = {start}, set(), [start]
    while stack:
        for parent in up.get(stack.pop(), ()):
            if parent in stop:
                met.add(parent)
            elif parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen, met


@dataclass
class Owed:
    """What W needs of one (chunk, micro-batch): weight groups, their split points and the kept gradients."""

    groups: list[tuple[list[torch.Tensor], list[Node]]] = field(default_factory=list)
    grads: dict[Node, tuple] = field(default_factory=dict)
    whole: tuple | None = None          # (output, grad_output, params): W runs the whole backward (no split)

    @property
    def held_bytes(self) -> int:
        return sum(g.numel() * g.element_size() for gs in self.grads.values() for g in gs if g is not None)


def _groups(params: list[torch.Tensor], up: dict, path: set) -> list[tuple[list[torch.Tensor], list[Node]]] | None:
    """Weights grouped by shared split points; None where one weight's split points lie on one path
    (a weight used twice in a row: starting at both would count the later use twice)."""
    groups: list[tuple[list, set]] = []
    for p in params:
        acc = _node(p)
        if acc not in up:                                   # not used in this graph: no gradient
            continue
        _, points = _above(acc, up, path)
        if not points:
            return None
        joined = [g for g in groups if g[1] & points]
        merged = ([p] + [q for g in joined for q in g[0]], points.union(*(g[1] for g in joined)))
        groups = [g for g in groups if not g[1] & points] + [merged]
    for _, points in groups:
        if len(points) > 1 and any(_above(a, up, frozenset())[0] & (points - {a}) for a in points):
            return None
    return [(ps, list(points)) for ps, points in groups]


# --8<-- [start:zb_input_grad]
def input_grad(out: torch.Tensor, grad: torch.Tensor | None, inp: torch.Tensor,
               params: list[torch.Tensor]) -> tuple[torch.Tensor | None, Owed]:
    """B: d loss / d input only; returns it and what W needs (the split points' incoming gradients)."""
    if not inp.requires_grad:                               # chunk 0: token ids
        return None, Owed(whole=(out, grad, params))
    up = _consumers(out.grad_fn)
    path, _ = _above(_node(inp), up)                        # every node the input gradient flows through
    groups = _groups(params, up, path)
    if groups is None:
        (dx,) = torch.autograd.grad(out, inp, grad, retain_graph=True)
        return dx, Owed(whole=(out, grad, params))
    owed = Owed(groups=groups)

    def keep(node):
        def hook(grad_outputs):
            owed.grads[node] = tuple(grad_outputs)
        return hook
    handles = [node.register_prehook(keep(node)) for _, points in groups for node in points]
    try:
        (dx,) = torch.autograd.grad(out, inp, grad, retain_graph=True)    # the split points compute dX only
    finally:
        for h in handles:
            h.remove()
    return dx, owed
# --8<-- [end:zb_input_grad]


# --8<-- [start:zb_weight_grad]
def weight_grad(owed: Owed) -> None:
    """W: weight gradients into ``.grad`` (post-accumulate hooks fire as in a plain backward), autograd started
    at the split points with the gradients B kept, so the input path does not run again."""
    if owed.whole is not None:
        out, grad, params = owed.whole
        torch.autograd.backward(out, grad, inputs=params)
        owed.whole = None
        return
    for params, points in owed.groups:
        edges = [(GradientEdge(node, i), g) for node in points for i, g in enumerate(owed.grads.get(node, ()))
                 if g is not None]
        if edges:
            torch.autograd.backward([e for e, _ in edges], [g for _, g in edges], inputs=params)
    owed.groups, owed.grads = [], {}
# --8<-- [end:zb_weight_grad]
