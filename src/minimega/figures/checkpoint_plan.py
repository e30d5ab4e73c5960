"""The read plan, drawn: which rank reads which box of which saved file, from a real save and load.

    python -m minimega.figures.checkpoint_plan      # records course/data/checkpoint-plan.json (2 + 2 gloo ranks)

The recording saves the tiny GPT under dp = 2, ZeRO-3, then loads it under tp = 2 and keeps each
rank's plan (`loading.load(stats=...)`). `read_plan_figure` draws, for the first block's MLP weights,
the chunks each old rank wrote (outlines) and the boxes each new rank reads (fills).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[3] / "course" / "data" / "checkpoint-plan.json"
TENSORS = ("param/blocks.0.mlp.fc.weight", "param/blocks.0.mlp.proj.weight")
MODEL = dict(block_size=32)


def _save(directory: str) -> None:
    import torch
    import minimega as mm
    from minimega import data
    mesh = mm.init_mesh(mm.ParallelDims(dp=2))
    config = mm.TrainConfig(zero_stage=3, batch_size=8, seed=1)
    torch.manual_seed(1)
    engine = mm.initialize(mm.GPT(mm.GPTConfig.tiny(**MODEL)), config, mesh)
    for batch in data.batches(mesh, 1, 8, 32, seed=1):
        engine.train_step(batch)
    engine.save(directory)


def _load(directory: str) -> dict:
    import torch
    import minimega as mm
    from minimega import checkpoint
    mesh = mm.init_mesh(mm.ParallelDims(tp=2))
    torch.manual_seed(1)
    engine = mm.initialize(mm.GPT(mm.GPTConfig.tiny(**MODEL)), mm.TrainConfig(tp=2, batch_size=8, seed=1), mesh)
    stats: dict = {}
    checkpoint.load(engine, directory, stats=stats)
    return {"rank": mesh.rank, "bytes_read": stats["bytes_read"], "bytes_needed": stats["bytes_needed"],
            "reads": [{"tensor": n, "file": f, "offsets": list(o), "lengths": list(l)}
                      for n, f, o, l in stats["reads"] if n in TENSORS]}


def record_plan(out: Path = DATA) -> Path:
    import tempfile
    import minimega as mm
    with tempfile.TemporaryDirectory() as tmp:
        mm.launch(_save, 2, tmp)
        ranks = mm.launch(_load, 2, tmp)
        manifest = json.loads((Path(tmp) / "step-00000001" / "manifest.json").read_text())
    trace = {"schema": 1, "source": {"saved": "dp=2, ZeRO-3", "loaded": "tp=2", "model": "tiny(block_size=32)"},
             "tensors": {n: {"shape": manifest["tensors"][n]["shape"],
                             "chunks": [{k: c[k] for k in ("file", "offsets", "lengths")}
                                        for c in manifest["tensors"][n]["chunks"]]} for n in TENSORS},
             "ranks": ranks}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(trace, indent=1) + "\n")
    return out


def read_plan_figure(path: Path = DATA, lang: str = "en"):
    """Two panels (fc: rows split over tp; proj: columns split): saved chunks outlined, reads filled by rank."""
    from plotly.subplots import make_subplots
    from minimega.figures.words import num, words
    from minimega.figures.style import PALETTE, house_layout
    t = words(lang)
    trace = json.loads(Path(path).read_text())
    names = list(trace["tensors"])
    fig = make_subplots(rows=1, cols=len(names), horizontal_spacing=0.12,
                        subplot_titles=[f"{n.removeprefix('param/blocks.0.')}<br>{trace['tensors'][n]['shape']}"
                                        for n in names])
    dash = {0: "solid", 1: "dash"}
    for col, name in enumerate(names, 1):
        for r in trace["ranks"]:
            reads = [x for x in r["reads"] if x["tensor"] == name]
            for i, x in enumerate(reads):                 # a filled box per read, coloured by the reading rank
                (r0, c0), (nr, nc) = x["offsets"], x["lengths"]
                fig.add_scatter(x=[c0, c0 + nc, c0 + nc, c0, c0], y=[r0, r0, r0 + nr, r0 + nr, r0], fill="toself",
                                mode="lines", line=dict(width=0), fillcolor=PALETTE[r["rank"]], opacity=0.45,
                                name=t("new rank {rank} (tp) reads").format(rank=r["rank"]), legendgroup=f"rank{r['rank']}",
                                showlegend=col == 1 and i == 0, row=1, col=col,
                                hovertemplate=t("new rank {rank} reads rows {r0}–{r1}, columns {c0}–{c1} of {file}")
                                .format(rank=r["rank"], r0=r0, r1=r0 + nr - 1, c0=c0, c1=c0 + nc - 1, file=x["file"])
                                + "<extra></extra>")
        for i, c in enumerate(trace["tensors"][name]["chunks"]):  # an outline per saved chunk, dashed by file
            (r0, c0), (nr, nc) = c["offsets"], c["lengths"]
            old = int(c["file"][6:11])
            fig.add_scatter(x=[c0, c0 + nc, c0 + nc, c0, c0], y=[r0, r0, r0 + nr, r0 + nr, r0], mode="lines",
                            line=dict(color=PALETTE[5], width=2, dash=dash.get(old, "dot")),
                            name=t("chunk written by old rank {rank} (ZeRO-3)").format(rank=old), legendgroup=f"old{old}",
                            showlegend=col == 1 and all(int(d["file"][6:11]) != old
                                                        for d in trace["tensors"][name]["chunks"][:i]),
                            row=1, col=col, hoverinfo="skip")
        # one "row" title, at the left: between the panels it would sit on the first one's boxes
        fig.update_yaxes(autorange="reversed", title_text=t("row") if col == 1 else None, row=1, col=col)
        fig.update_xaxes(title_text=t("column"), row=1, col=col)
    total = ", ".join(f"rank {r['rank']} {num(r['bytes_read'] / 1e3, '.0f', lang)} kB" for r in trace["ranks"])
    house_layout(fig, t("Saved under {saved}, loaded under {loaded}: each new rank reads only its slice ({total} in all), "
                   "first block's MLP").format(saved=trace["source"]["saved"], loaded=trace["source"]["loaded"],
                                               total=total), "", "", lang)
    fig.update_layout(title_pad_b=48)              # above the two-line panel titles
    return fig


if __name__ == "__main__":
    print(record_plan(Path(sys.argv[1]) if len(sys.argv) > 1 else DATA))
