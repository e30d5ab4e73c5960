"""Model FLOPs utilisation that published training runs report, by model size: the range a prediction is read
against. `minimega plan` flags a predicted MFU above the range of runs near the model's size, since the α-β and
roofline model counts no kernel below its roofline, no straggler, no data loader and no failure.

Each point: (parameters, MFU, where it is published). Sources (/work/shared/reference/training-stacks.md §2.6-2.7):
picotron's README; Korthikanti et al. 2022 (arXiv:2205.05198) Table 5, selective recomputation with sequence
parallelism on A100; Chowdhery et al. 2022 (PaLM, arXiv:2204.02311) on TPU v4; Llama 3 (arXiv:2407.21783) Table 4,
BF16 MFU 38-43 % on 8K-16K H100.
"""
from __future__ import annotations

import math

PUBLISHED_MFU = (
    (1.7e9, 0.50, "SmolLM-1.7B on 8 H100, picotron (~50 %)"),
    (7e9, 0.38, "LLaMA-2-7B on 64 H100, picotron"),
    (22e9, 0.415, "22B on 8 A100, Korthikanti et al. 2022"),
    (175e9, 0.514, "GPT-3 175B on 64 A100, Korthikanti et al. 2022"),
    (405e9, 0.38, "Llama 3 405B on 16K H100, Llama 3 paper"),
    (405e9, 0.43, "Llama 3 405B on 8K H100, Llama 3 paper"),
    (530e9, 0.560, "MT-NLG 530B on 280 A100, Korthikanti et al. 2022"),
    (540e9, 0.462, "PaLM 540B on 6144 TPU v4, Chowdhery et al. 2022"),
    (1e12, 0.563, "1T on 512 A100, Korthikanti et al. 2022"),
)
NEAR = 4.0   # runs within this factor of the model's parameter count are "of its size"


def published_mfu_range(n_params: float) -> tuple[float, float, list[str]]:
    """(lowest, highest, sources) of the published MFU of runs within a factor `NEAR` of ``n_params`` parameters
    (the nearest run if none is that close). Llama 3 8B (8.0e9): LLaMA-2-7B's 38 % and the 22B's 41.5 %."""
    if not n_params > 0:
        raise ValueError(f"n_params={n_params!r}: expected a positive parameter count")
    near = [p for p in PUBLISHED_MFU if max(n_params / p[0], p[0] / n_params) <= NEAR]
    if not near:
        near = [min(PUBLISHED_MFU, key=lambda p: abs(math.log(n_params / p[0])))]
    return min(p[1] for p in near), max(p[1] for p in near), list(dict.fromkeys(p[2] for p in near))


def mfu_caveat(n_params: float, mfu: float) -> str | None:
    """One line when ``mfu`` is above what published runs of this size report, else None."""
    lo, hi, sources = published_mfu_range(n_params)
    if mfu <= hi:
        return None
    pct = lambda x: f"{round(100 * x, 1):g}"                  # noqa: E731  (38, 41.5)
    span = (pct(lo) if lo == hi else f"{pct(lo)}-{pct(hi)}") + "%"
    return (f"caveat: a predicted MFU of {mfu:.1%} is above the {span} that published runs of this size report "
            f"({'; '.join(sources)}); the model counts no kernel below its roofline, no straggler and no data "
            f"loader: read it as a ceiling")

