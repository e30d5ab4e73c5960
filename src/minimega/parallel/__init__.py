"""How the model is split across ranks, one file per parallelism (ZeRO and the pipeline have their own packages).

    data_parallel.py  DDP: bucketed all-reduce of the gradients over dp
    grad_sync.py      the one gradient-sync protocol (hooks start reductions, `finish_grad_sync()` ends them),
                      and the global gradient norm for clipping
    tensor.py         Megatron tensor parallelism: the f/g regions, column/row linears, vocab-parallel
                      embedding and cross-entropy, sequence parallelism, `ParallelGPT`
    tensor_blocks.py  attention and SwiGLU blocks built from the tensor-parallel linears
    rng.py            per-tp-rank dropout streams
    context.py        context parallelism: ring attention over cp
    ulysses.py        context parallelism by all-to-all (DeepSpeed-Ulysses)
    moe/              mixture of experts and expert parallelism over ep
"""
