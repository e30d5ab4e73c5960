"""Mixture of experts: routed experts in every block's MLP, expert parallelism over the ep group.

    layer.py     the router, the experts and the layer (capacity dispatch; the model's MoE variant)
    dropless.py  dropless dispatch: tokens sorted by expert, variable row counts over the all-to-all
    balance.py   load balancing without an auxiliary loss: the routing bias, sequence means
    zero.py      the experts' gradient sync over edp and their optimizer states under ZeRO-1
"""
