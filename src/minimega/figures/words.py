"""The chapter figures' words in Dutch, keyed on the English text the figure code writes.

A figure builder (`minimega.figures.plots`) writes each visible string through ``t = words(lang)``:
``t("GB per GPU (log scale)")``. In English `t` returns the text; in Dutch it looks the text up in
`NL`, and a string with no entry stops the build with its name, so no figure goes out half
translated. Templates keep ``{name}`` fields for numbers, which `num` formats with the language's
decimal comma; plotly formats the numbers in hover templates itself, following ``layout.separators``
(`SEPARATORS`). Terms Dutch practitioners keep in English (ZeRO, all-reduce, pipeline bubble,
optimizer states, forward, backward, rank, stage) stay English, as in the Dutch chapters.
"""
from __future__ import annotations

from collections.abc import Callable

# plotly's layout.separators: decimal mark, then thousands separator
SEPARATORS = {"en": ".,", "nl": ",."}

NL: dict[str, str] = {
    # zero-memory-vs-dp, zero-breakdown, bytes-per-param, comm-vs-dp
    "Model states per GPU, Ψ = {psi}B, mixed-precision Adam (K = 12)":
        "Model states per GPU bij Ψ = {psi}B, mixed-precision Adam (K = 12)",
    "data-parallel degree N_d (log scale)": "data-parallelle graad N_d (logschaal)",
    "GB per GPU (log scale)": "GB per GPU (logschaal)",
    "Where the bytes go: Ψ = {psi}B on N_d = {dp} GPUs": "Waar de bytes heen gaan: Ψ = {psi}B op N_d = {dp} GPU's",
    "mixed precision (2 + 2 + 12)": "mixed precision (2 + 2 + 12)",
    "Bytes per parameter per GPU at N_d = {dp}": "Bytes per parameter per GPU bij N_d = {dp}",
    "bytes per parameter": "bytes per parameter",
    "Sent per rank per step, Ψ = {psi}B in {bits}-bit (ring model)":
        "Verstuurd per rank per stap, Ψ = {psi}B in {bits}-bit (ringmodel)",
    "GB sent per rank per step": "GB verstuurd per rank per stap",
    # bubble-vs-microbatches
    "% idle": "% stilstand",
    "interleaved 1F1B, p = {p}, v = 2": "interleaved 1F1B, p = {p}, v = 2",
    "interleaved": "interleaved",
    "Pipeline bubble: (p−1)/(v·m + p−1) of each step is idle":
        "Pipeline bubble: (p−1)/(v·m + p−1) van elke stap staat stil",
    "micro-batches per step m": "micro-batches per stap m",
    "idle share of the step (%)": "aandeel stilstand in de stap (%)",
    # activations-gpt3, activations-vs-seq, tp-scaling
    "none (t = 1)": "geen (t = 1)",
    "TP t = 8": "TP t = 8",
    "TP + SP": "TP + SP",
    "TP + selective": "TP + selectief",
    "TP + SP + selective": "TP + SP + selectief",
    "full recompute": "volledige herberekening",
    " MB per layer": " MB per laag",
    "Activations one GPT-3 layer keeps for backward (s = 2048, b = 1)":
        "Activaties die één GPT-3-laag bewaart voor de backward (s = 2048, b = 1)",
    "MB per layer per GPU (log scale)": "MB per laag per GPU (logschaal)",
    "no recomputation": "geen herberekening",
    "selective": "selectief",
    "full recomputation": "volledige herberekening",
    "fused attention, no recomputation": "fused attention, geen herberekening",
    "Activations of {layers} layers, h = {hidden}, a = {heads}, b = 1, one GPU (with the recomputed layer)":
        "Activaties van {layers} lagen, h = {hidden}, a = {heads}, b = 1, één GPU (met de herberekende laag)",
    "sequence length s (tokens, log scale)": "sequentielengte s (tokens, logschaal)",
    "GB (log scale)": "GB (logschaal)",
    "sent per layer, fwd + bwd (16-bit)": "verstuurd per laag, fwd + bwd (16-bit)",
    "Tensor parallelism on a GPT-3 layer (s = 2048, b = 1)": "Tensor parallelism op een GPT-3-laag (s = 2048, b = 1)",
    "tensor-parallel degree t": "tensor-parallelle graad t",
    "MB per GPU per layer": "MB per GPU per laag",
    # presets-memory, offload-split
    "Memory per GPU for the calculator presets": "Geheugen per GPU voor de presets van de calculator",
    "stage 2, optimizer to CPU": "stage 2, optimizer naar CPU",
    "stage 2, optimizer to NVMe": "stage 2, optimizer naar NVMe",
    "stage 3, all to CPU": "stage 3, alles naar CPU",
    "on the GPU": "op de GPU",
    "Model states of Ψ = {psi}B on {dp} GPU: where they live": "Model states van Ψ = {psi}B op {dp} GPU: waar ze staan",
    "Model states of Ψ = {psi}B on {dp} GPUs: where they live": "Model states van Ψ = {psi}B op {dp} GPU's: waar ze staan",
    # ddp-overlap, zero-prefetch, pipeline-recorded: spans on a time axis
    "optimizer step": "optimizer-stap",
    "rank {rank} compute": "rank {rank} rekent",
    "rank {rank} all-reduce": "rank {rank} all-reduce",
    ": %{base:.1f} to %{x:.1f} ms long": ": vanaf %{base:.1f} ms, %{x:.1f} ms lang",
    ": %{base:.2f} to %{x:.2f} ms long": ": vanaf %{base:.2f} ms, %{x:.2f} ms lang",
    "bucket all-reduce, issued → waited on": "all-reduce van een bucket, gestart → afgewacht",
    "bucket issued": "bucket gestart",
    "bucket %{customdata[0]} (%{customdata[1]:.0f} kB) issued at %{x:.1f} ms":
        "bucket %{customdata[0]} (%{customdata[1]:.0f} kB) gestart op %{x:.1f} ms",
    "DDP on {world} ranks: {buckets} buckets start their all-reduce during the backward (step {step}, recorded)":
        "DDP op {world} ranks: {buckets} buckets starten hun all-reduce tijdens de backward (stap {step}, gemeten)",
    "time from the start of the step's forward (ms)": "tijd vanaf het begin van de forward van de stap (ms)",
    "all-gather in flight (issued → waited on)": "all-gather onderweg (gestart → afgewacht)",
    "%{y}: gather of %{customdata[0]:.0f} kB, %{base:.2f} to %{x:.2f} ms long":
        "%{y}: gather van %{customdata[0]:.0f} kB, vanaf %{base:.2f} ms, %{x:.2f} ms lang",
    "unit forward": "forward van de unit",
    "all-gather issued": "all-gather gestart",
    "%{y}: issued at %{x:.2f} ms": "%{y}: gestart op %{x:.2f} ms",
    "ZeRO-3 forward on rank 0 of {world}: block k+1's all-gather is issued before block k computes (step {step}, recorded)":
        "ZeRO-3-forward op rank 0 van {world}: de all-gather van blok k+1 start voordat blok k rekent (stap {step}, gemeten)",
    "{schedule} rank {rank}<br>({idle}/{ticks} slots idle)": "{schedule} rank {rank}<br>({idle}/{ticks} slots stil)",
    "One recorded step, p = {p}, m = {m}: both idle (p−1)/(m+p−1) = {share} of slots":
        "Eén gemeten stap, p = {p}, m = {m}: beide staan (p−1)/(m+p−1) = {share} van de slots stil",
    "time from the start of the step (ms)": "tijd vanaf het begin van de stap (ms)",
    # memory-measured, zero-memory-measured, activations-measured, tp-comm-per-layer, comm-wire
    "Adam momentum + variance, 8 B": "Adam-momentum + variantie, 8 B",
    "estimate: 16 B × Ψ, Ψ = {n}": "schatting: 16 B × Ψ, Ψ = {n}",
    "estimate": "schatting",
    "formula": "formule",
    "measured": "gemeten",
    "Model states per rank, measured after a backward (tiny GPT, fp32 AdamW)":
        "Model states per rank, gemeten na een backward (kleine GPT, fp32 AdamW)",
    "model_state_bytes_padded (16, 12, 10, 8 B × Ψ_pad / stage)":
        "model_state_bytes_padded (16, 12, 10, 8 B × Ψ_pad per stage)",
    "Model states on rank 0 at the optimizer step, N_d = {dp} (tiny GPT, fp32 AdamW, recorded)":
        "Model states op rank 0 bij de optimizer-stap, N_d = {dp} (kleine GPT, fp32 AdamW, gemeten)",
    "measured, saved_tensors_hooks": "gemeten, saved_tensors_hooks",
    "formula: gpt_activation_bytes_per_layer": "formule: gpt_activation_bytes_per_layer",
    "none": "geen",
    "full": "volledig",
    "Activations one block keeps per rank, by recomputation mode (b = {b}, s = {s}, h = {h}, a = {a}, fp32, dropout)":
        "Activaties die één blok per rank bewaart, per herberekeningsmodus (b = {b}, s = {s}, h = {h}, a = {a}, fp32, dropout)",
    "kB kept for backward (1 kB = 10³ B)": "kB bewaard voor de backward (1 kB = 10³ B)",
    "block {i}": "blok {i}",
    "replicated grads": "gerepliceerde gradiënten",
    "8bsh(t−1)/t × 4 B per block (Narayanan et al.)": "8bsh(t−1)/t × 4 B per blok (Narayanan e.a.)",
    "Bytes each rank sends per step, by layer: tiny GPT, t = {t}, b = {b}, s = {s}, h = {h} (recorded)":
        "Bytes die elke rank per stap verstuurt, per laag: kleine GPT, t = {t}, b = {b}, s = {s}, h = {h} (gemeten)",
    "kB sent per rank per step": "kB verstuurd per rank per stap",
    "{op}, {n} ranks": "{op}, {n} ranks",
    "<br>measured / ring model = ": "<br>gemeten / ringmodel = ",
    "What gloo sends per rank, over the ring model's (n−1)/n·S per phase (TCP payload, loopback)":
        "Wat gloo per rank verstuurt, gedeeld door (n−1)/n·S per fase van het ringmodel (TCP-payload, loopback)",
    "buffer S, KiB (log scale)": "buffer S, KiB (logschaal)",
    "measured ÷ ring model": "gemeten ÷ ringmodel",
    "ring model": "ringmodel",
    "1 + 1/n at n = {n}": "1 + 1/n bij n = {n}",
    # checkpoint-read-plan (minimega.figures.checkpoint_plan)
    "new rank {rank} (tp) reads": "nieuwe rank {rank} (tp) leest",
    "new rank {rank} reads rows {r0}–{r1}, columns {c0}–{c1} of {file}":
        "nieuwe rank {rank} leest rijen {r0}–{r1}, kolommen {c0}–{c1} van {file}",
    "chunk written by old rank {rank} (ZeRO-3)": "chunk geschreven door oude rank {rank} (ZeRO-3)",
    "row": "rij",
    "column": "kolom",
    "Saved under {saved}, loaded under {loaded}: each new rank reads only its slice ({total} in all), first block's MLP":
        "Opgeslagen onder {saved}, geladen onder {loaded}: elke nieuwe rank leest alleen zijn deel ({total} in totaal), "
        "MLP van het eerste blok",
}

TABLES = {"nl": NL}


def words(lang: str) -> Callable[[str], str]:
    """The translator for `lang`: English text in, the text in `lang` out (a missing entry is an error)."""
    if lang == "en":
        return lambda text: text
    if lang not in TABLES:
        raise ValueError(f"figure language {lang!r}: expected 'en' or one of {', '.join(TABLES)}")
    table = TABLES[lang]

    def t(text: str) -> str:
        if text not in table:
            raise KeyError(f"figure text {text!r} has no {lang} entry: add it to minimega.figures.words.{lang.upper()}")
        return table[text]
    return t


def num(value: float, fmt: str, lang: str) -> str:
    """`value` formatted with `fmt` (``".3g"``, ``","``), with `lang`'s decimal mark and thousands separator."""
    text = format(value, fmt)
    if lang not in SEPARATORS:
        raise ValueError(f"figure language {lang!r}: expected one of {', '.join(SEPARATORS)}")
    return text.translate(str.maketrans(".,", SEPARATORS[lang]))
