"""One training step and what it needs: the engine that composes the parallelisms, and its parts.

    engine.py                 `initialize(model, config, mesh) -> Engine`: TP, recomputation, the pipeline split,
                              DDP or ZeRO, in that order; `train_step`, `eval_step`, `save`, `load`, `report`
    optimizer.py              the engine's one optimizer: every part that steps this rank's parameters
    precision.py              fp32, bf16 and fp16 policies, the loss scaler
    fp8.py                    fp8 linears with delayed scaling
    activation_checkpoint.py  full and selective recomputation
    health.py                 loss spikes, non-finite gradients, rollback
"""
