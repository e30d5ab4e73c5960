"""Chapters 4, 10, 12 and 13: things that happen over time, one column per step or per share of the time.

    loss-scaler     `precision.DynamicLossScaler.update` over 15 steps with overflows at steps 5, 6 and 11
    async-rollback  saves every 4 steps, written in the background; a non-finite loss (`health.HealthMonitor`)
                    rolls back to the last checkpoint that is on disk
    goodput         per GPU count, the share of wall time left after checkpoints and failures
                    (`estimate.mtbf_hours`, `young_daly_interval`, `checkpoint_waste`, `goodput`)
    step-split      one step of BLOOM-176B's published layout split into compute, exposed comm, bubble, overhead
                    and optimizer (`perf.step_time`)
"""
from __future__ import annotations

import math

from minimega import estimate as est
from minimega.figures.animations._base import _w, cell, frame, meter, words
from minimega.figures.words import num

# ------------------------------------------------------------------------------------------------

OVERFLOWS = (5, 6, 11)


def loss_scaler(steps: int = 15, window: int = 4, hysteresis: int = 2, overflows=OVERFLOWS) -> dict:
    """The scale after each step, the scaler's own `update` deciding (DeepSpeed's rule, window shortened to 4)."""
    from minimega.train.precision import DynamicLossScaler
    scaler = DynamicLossScaler(init_scale=2.0 ** 16, window=window, hysteresis=hysteresis)
    cols = [[cell("future")] * 3 for _ in range(steps)]
    frames, scales = [], []

    def snap(caption, t=None):
        cells = [[cols[c][r] for c in range(steps)] for r in range(3)]
        frames.append(frame(cells, caption, [(r, t) for r in range(3)] if t is not None else (),
                            meter(scaler.scale, ",.0f"), scale=scaler.scale))

    snap(_w(f"fp16 training starts at loss scale 2^16; the scale doubles after {window} clean steps and halves "
            f"when an overflow comes after {hysteresis - 1} absorbed one (hysteresis {hysteresis}).",
            f"fp16-training begint met loss scale 2^16; de scale verdubbelt na {window} schone stappen en halveert "
            f"bij een overflow na {hysteresis - 1} opgevangen overflow (hysteresis {hysteresis})."))
    for t in range(steps):
        before, hyst = scaler.scale, scaler.cur_hysteresis
        overflow = (t + 1) in overflows
        scaler.update(overflow)
        scales.append(scaler.scale)
        exp = round(math.log2(scaler.scale))
        cols[t] = [cell("lost" if overflow else "work", "inf" if overflow else "ok"),
                   cell("none" if overflow else "work", "skip" if overflow else "✓"),
                   cell("up" if scaler.scale > before else "down" if scaler.scale < before else "same", f"2^{exp}")]
        if overflow and scaler.scale < before:
            en, nl = (f"the second overflow in a row: the step is skipped and the scale halves to 2^{exp}.",
                      f"de tweede overflow op rij: de stap vervalt en de scale halveert naar 2^{exp}.")
        elif overflow:
            en, nl = (f"inf in the gradients: the step is skipped; hysteresis absorbs it ({hyst} → "
                      f"{scaler.cur_hysteresis}), the scale stays 2^{exp}.",
                      f"inf in de gradiënten: de stap vervalt; de hysteresis vangt het op ({hyst} → "
                      f"{scaler.cur_hysteresis}), de scale blijft 2^{exp}.")
        elif scaler.scale > before:
            en, nl = (f"{window} clean steps since the last overflow: the scale doubles to 2^{exp}.",
                      f"{window} schone stappen sinds de laatste overflow: de scale verdubbelt naar 2^{exp}.")
        else:
            en, nl = f"clean, the update is applied; the scale stays 2^{exp}.", \
                f"schoon, de update wordt toegepast; de scale blijft 2^{exp}."
        snap(_w(f"Step {t + 1}: {en}", f"Stap {t + 1}: {nl}"), t)
    frames[-1]["caption"] = {k: v + (f" {scaler.skipped} of {steps} steps skipped." if k == "en" else
                                     f" {scaler.skipped} van {steps} stappen overgeslagen.")
                             for k, v in frames[-1]["caption"].items()}
    return {"name": "loss-scaler", "window": window, "hysteresis": hysteresis, "overflows": list(overflows),
            "scales": scales, "title": _w("The dynamic loss scaler over 15 fp16 steps", "De dynamische loss scaler over 15 fp16-stappen"),
            "rows": [_w("gradients", "gradiënten"), _w("update", "update"), _w("loss scale", "loss scale")],
            "cols": [_w(str(t + 1), str(t + 1)) for t in range(steps)], "compact": True,
            "legend": {"work": _w("finite, applied", "eindig, toegepast"), "lost": _w("overflow", "overflow"),
                       "none": _w("skipped", "overgeslagen"), "up": _w("scale doubled", "scale verdubbeld"),
                       "down": _w("scale halved", "scale gehalveerd"), "same": _w("scale kept", "scale gehouden")},
            "frames": frames, "meter_label": _w("Loss scale", "Loss scale")}


# ------------------------------------------------------------------------------------------------

def async_rollback(every: int = 4, write_steps: int = 2, fault: int = 11, resume_to: int = 12) -> dict:
    """Steps on a timeline: a save every `every` steps (a short snapshot, then `write_steps` steps of background
    write); at step `fault` a non-finite loss, which `HealthMonitor` flags; the run rolls back to the last
    checkpoint whose write finished and redoes the steps since."""
    from minimega.train.health import HealthMonitor
    monitor = HealthMonitor(window=8, min_history=2)
    timeline = list(range(1, fault + 1)) + ["rollback"]
    on_disk, writing, events = 0, {}, []
    for step in range(1, fault + 1):
        done = [s for s, end in writing.items() if end == step]
        for s in done:
            on_disk = s
            del writing[s]
        verdict = monitor.check(step, math.nan if step == fault else 1.0, None)
        events.append({"step": step, "snapshot": step % every == 0 and verdict is None, "writing": sorted(writing),
                       "on_disk": on_disk, "verdict": verdict.kind if verdict else None})
        if step % every == 0 and verdict is None:
            writing[step] = step + write_steps + 1         # written during the next `write_steps` steps
    target = on_disk
    redo = list(range(target + 1, resume_to + 1))
    timeline += redo
    rows = ("train", "snap", "write", "disk")
    cols = [[cell("future")] * 4 for _ in timeline]
    frames = []

    def snap(caption, k, risk):
        cells = [[cols[c][r] for c in range(len(timeline))] for r in range(4)]
        frames.append(frame(cells, caption, [(r, k) for r in range(4)] if k is not None else (),
                            meter(risk, "d")))

    snap(_w(f"A save every {every} steps: a short snapshot blocks the step, the write then runs for {write_steps} "
            "steps in the background. A checkpoint counts only once it is on disk.",
            f"Elke {every} stappen een save: een korte snapshot houdt de stap op, het schrijven loopt daarna "
            f"{write_steps} stappen op de achtergrond. Een checkpoint telt pas als het op schijf staat."), None, 0)
    for k, e in enumerate(events):
        bad = e["verdict"] is not None
        cols[k] = [cell("lost" if bad else "work", "✗" if bad else str(e["step"])),
                   cell("save" if e["snapshot"] else "none", "S" if e["snapshot"] else ""),
                   cell("save" if e["writing"] else "none", ",".join(map(str, e["writing"])) if e["writing"] else ""),
                   cell("kept" if e["on_disk"] else "none", str(e["on_disk"]) if e["on_disk"] else "·")]
        if bad:
            cap = _w(f"Step {e['step']}: {e['verdict']}. HealthMonitor stops the run.",
                     f"Stap {e['step']}: niet-eindige loss. HealthMonitor stopt de run.")
        elif e["snapshot"]:
            cap = _w(f"Step {e['step']}: snapshot for the checkpoint of step {e['step']}; training goes on while it "
                     "is written.", f"Stap {e['step']}: snapshot voor het checkpoint van stap {e['step']}; de training "
                     "gaat door terwijl het geschreven wordt.")
        elif e["writing"]:
            cap = _w(f"Step {e['step']}: step {e['writing'][0]}'s checkpoint is still being written; a failure now would "
                     f"go back to step {e['on_disk']}.", f"Stap {e['step']}: het checkpoint van stap {e['writing'][0]} "
                     f"wordt nog geschreven; een fout nu gaat terug naar stap {e['on_disk']}.")
        else:
            cap = _w(f"Step {e['step']}: training; the last checkpoint on disk is step {e['on_disk']}.",
                     f"Stap {e['step']}: training; het laatste checkpoint op schijf is stap {e['on_disk']}.")
        snap(cap, k, e["step"] - e["on_disk"])
    k = len(events)
    cols[k] = [cell("lost", "↺"), cell("none"), cell("none"), cell("kept", str(target))]
    snap(_w(f"Rollback: load step {target}'s checkpoint; steps {target + 1}–{fault} are lost and redone.",
            f"Terugrollen: laad het checkpoint van stap {target}; stappen {target + 1}–{fault} zijn verloren en "
            "worden opnieuw gedaan."), k, fault - target)
    for j, step in enumerate(redo):
        cols[k + 1 + j] = [cell("work", str(step)), cell("none"), cell("none"), cell("kept", str(target))]
        again = step <= fault
        snap(_w(f"Step {step}" + (" again." if again else ": past the failure, on the restored run."),
                f"Stap {step}" + (" opnieuw." if again else ": voorbij de fout, op de herstelde run.")), k + 1 + j, step - target)
    return {"name": "async-rollback", "every": every, "write_steps": write_steps, "fault": fault,
            "rollback_to": target, "events": events,
            "title": _w("An async save and a rollback, step by step", "Een async save en een rollback, stap voor stap"),
            "rows": [_w("training", "training"), _w("snapshot (blocks)", "snapshot (blokkeert)"),
                     _w("write (background)", "schrijven (achtergrond)"), _w("last on disk", "laatste op schijf")],
            "cols": [_w(str(t), str(t)) if t != "rollback" else _w("↺", "↺") for t in timeline], "compact": True,
            "legend": {"work": _w("a step", "een stap"), "save": _w("saving", "opslaan"), "lost": _w("failed", "mislukt"),
                       "kept": _w("checkpoint on disk", "checkpoint op schijf"), "none": _w("nothing", "niets")},
            "frames": frames, "meter_label": _w("Steps at risk (since the last checkpoint on disk)",
                                                "Stappen op het spel (sinds het laatste checkpoint op schijf)")}


# ------------------------------------------------------------------------------------------------

def goodput(gpus=(1024, 16384, 131072), save_s: float = 60.0, slots: int = 40) -> dict:
    """Per GPU count, each slot 1/`slots` of wall time: useful work, checkpoint saves, work lost to failures."""
    rows = []
    frames = []
    grid = [[cell("future") for _ in range(slots)] for _ in gpus]
    frames.append(frame([list(r) for r in grid], _w(
        f"Wall time of a run on 1,024, 16,384 and 131,072 GPUs, each bar {slots} slices. Failures at Llama 3's rate; "
        f"a save costs {save_s:.0f} s; checkpoints every τ* = √(2 · save · MTBF).",
        f"Wandtijd van een run op 1.024, 16.384 en 131.072 GPU's, elke balk {slots} stukjes. Fouten in het tempo van "
        f"Llama 3; een save kost {save_s:.0f} s; checkpoints elke τ* = √(2 · save · MTBF)."), (), meter(100, ".1f", " %")))
    for i, n in enumerate(gpus):
        mtbf = 3600 * est.mtbf_hours(n)
        tau = est.young_daly_interval(save_s, mtbf)
        good = est.goodput(tau, save_s, mtbf)
        saving = save_s / tau
        lost = 1 - good - saving
        k_save, k_lost = max(1, round(saving * slots)), max(1, round(lost * slots))
        grid[i] = [cell("work") for _ in range(slots - k_save - k_lost)] + [cell("save", "S")] * k_save + \
            [cell("lost", "✗")] * k_lost
        rows.append({"gpus": n, "mtbf_s": mtbf, "interval_s": tau, "goodput": good, "saving": saving, "lost": lost})
        frames.append(frame([list(r) for r in grid], words(lambda lang: (
            f"{num(n, ',', lang)} GPUs: a failure every {num(mtbf / 3600, '.2f', lang)} h, a save every "
            f"{num(tau / 60, '.0f', lang)} min. Saving takes {num(100 * saving, '.1f', lang)} %, redoing lost work "
            f"{num(100 * lost, '.1f', lang)} %: goodput {num(100 * good, '.1f', lang)} %." if lang == "en" else
            f"{num(n, ',', lang)} GPU's: elke {num(mtbf / 3600, '.2f', lang)} uur een fout, elke "
            f"{num(tau / 60, '.0f', lang)} min een save. Opslaan kost {num(100 * saving, '.1f', lang)} %, verloren werk "
            f"overdoen {num(100 * lost, '.1f', lang)} %: goodput {num(100 * good, '.1f', lang)} %.")),
            [(i, c) for c in range(slots - k_save - k_lost, slots)], meter(100 * good, ".1f", " %")))
    return {"name": "goodput", "save_s": save_s, "runs": rows,
            "title": _w("Failures and checkpoints eat the wall time", "Fouten en checkpoints eten de wandtijd op"),
            "rows": [words(lambda lang, n=n: f"{num(n, ',', lang)} GPUs" if lang == "en" else
                           f"{num(n, ',', lang)} GPU's") for n in gpus],
            "cols": [_w(str(c + 1), str(c + 1)) for c in range(slots)], "compact": True,
            "legend": {"work": _w("useful work", "nuttig werk"), "save": _w("saving", "opslaan"),
                       "lost": _w("lost and redone", "verloren en opnieuw"), "future": _w("not yet", "nog niet")},
            "frames": frames, "meter_label": _w("Goodput", "Goodput")}


# ------------------------------------------------------------------------------------------------

PARTS = (("compute", ("forward", "backward", "recompute"), _w("compute (fwd, bwd, recompute)", "rekenen (fwd, bwd, herberekening)")),
         ("tp", ("tp_comm",), _w("TP comm (exposed)", "TP-comm (zichtbaar)")),
         ("p2p", ("p2p",), _w("pipeline send/recv", "pipeline send/recv")),
         ("bubble", ("bubble",), _w("pipeline bubble", "pipelinebubbel")),
         ("dp", ("dp_comm",), _w("DP comm (exposed)", "DP-comm (zichtbaar)")),
         ("overhead", ("stack_overhead",), _w("stack overhead", "overhead van de stack")),
         ("optim", ("optimizer", "offload", "disk"), _w("optimizer", "optimizer")))


def step_split(preset: str = "bloom-176b", hw: str = "a100-80gb", slots: int = 40) -> dict:
    """`perf.step_time`'s parts of one step, added one per frame, each row its share of `slots` slices."""
    from minimega.analysis import perf
    cfg = perf.preset_config(preset)
    t = perf.step_time(cfg, hw)
    parts = [(key, sum(t[k] for k in keys), label) for key, keys, label in PARTS]
    grid = [[cell("future") for _ in range(slots)] for _ in parts]
    frames = [frame([list(r) for r in grid], words(lambda lang: (
        f"One training step of {preset} on {cfg.tp * cfg.pp * cfg.dp} {hw} GPUs (tp {cfg.tp}, pp {cfg.pp}, dp {cfg.dp}, "
        f"{cfg.micro_batches} micro-batches), as chapter 13's model predicts it." if lang == "en" else
        f"Eén trainingsstap van {preset} op {cfg.tp * cfg.pp * cfg.dp} {hw}-GPU's (tp {cfg.tp}, pp {cfg.pp}, dp "
        f"{cfg.dp}, {cfg.micro_batches} micro-batches), zoals het model van hoofdstuk 13 hem voorspelt.")),
        (), meter(0, ",.2f", " s"))]
    at, done = 0, 0.0
    for i, (key, secs, label) in enumerate(parts):
        n = max(1, round(secs / t["total"] * slots)) if secs > 0 else 0
        n = min(n, slots - at)
        grid[i] = [cell("future")] * at + [cell(key)] * n + [cell("future")] * (slots - at - n)
        at, done = at + n, done + secs
        frames.append(frame([list(r) for r in grid], words(lambda lang, label=label: (
            f"+ {label[lang]}: {num(secs, ',.2f', lang)} s ({num(100 * secs / t['total'], '.1f', lang)} % of the step)."
            if lang == "en" else
            f"+ {label[lang]}: {num(secs, ',.2f', lang)} s ({num(100 * secs / t['total'], '.1f', lang)} % van de stap).")),
            [(i, c) for c in range(at - n, at)], meter(done, ",.2f", " s"), seconds=secs))
    frames[-1]["caption"] = {k: v + (f" Total {num(t['total'], ',.1f', k)} s, MFU {num(100 * t['mfu'], '.1f', k)} %."
                                     if k == "en" else f" Samen {num(t['total'], ',.1f', k)} s, MFU "
                                     f"{num(100 * t['mfu'], '.1f', k)} %.") for k, v in frames[-1]["caption"].items()}
    return {"name": "step-split", "preset": preset, "hw": hw, "total_s": t["total"],
            "title": _w(f"Where one step's time goes: {preset}", f"Waar de tijd van één stap heen gaat: {preset}"),
            "rows": [label for _, _, label in PARTS], "cols": [_w(str(c + 1), str(c + 1)) for c in range(slots)],
            "compact": True, "legend": {**{key: label for key, _, label in PARTS}, "future": _w("—", "—")},
            "frames": frames, "meter_label": _w("Seconds of the step so far", "Seconden van de stap tot nu toe")}
