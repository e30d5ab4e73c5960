"""The step-through pictures of chapters 1, 4-6, 9-14, 16 and 17 show the package's numbers.

Each picture's frames are checked against an oracle outside the animation: a published count (GPT-2's
124,439,808 parameters), a formula in the test (Korthikanti's sbh(34 + 5as/h), ZeRO-Infinity's 12Ψ/N_d on
disk), DeepSpeed's loss-scaler rule worked out by hand, Megatron's rank order, the exporters' own output,
an argmax of the router's logits, and course/data/capstone.json's summary.
"""
import json
import math

import pytest

from minimega import estimate as est
from minimega.figures import animations as fa
from minimega.figures.animations import layout, memory, outcomes, timeline


def _meters(anim):
    return [f["meter"]["value"] for f in anim["frames"]]


def test_every_chapter_has_a_picture_with_a_meter_on_every_frame():
    import minimega.tools.export_flow  # noqa: F401  (chapter 14's picture runs the exporters: the tools layer)
    assert len(fa.CHAPTERS) == 17 and all(n in fa.BUILDERS for names in fa.CHAPTERS.values() for n in names)
    for name in fa.BUILDERS:
        anim = fa.animation(name, "nl")
        assert anim["meter_label"] and all(f["meter"] and f["meter"]["text"] for f in anim["frames"]), name
        assert all(isinstance(f["caption"], str) for f in anim["frames"]), name


def test_memory_stack_counts_gpt2_and_zero_splits_it():
    anim = memory.memory_stack(dp=4)
    n = anim["n_params"]
    assert n == 124_439_808                                           # GPT-2 small, tied embeddings (HF's count)
    s, b, h, a, L = 1024, 8, 768, 12, 12
    acts = L * s * b * h * (34 + 5 * a * s / h)                        # Korthikanti et al. 2022, Table 2
    m = _meters(anim)
    assert m[:5] == pytest.approx([0, 2 * n, 4 * n, 16 * n, 16 * n + acts])
    assert m[5:] == pytest.approx([(4 + 12 / 4) * n + acts, (2 + 14 / 4) * n + acts, 16 * n / 4 + acts])
    last = anim["frames"][-1]["cells"]
    assert all(row[0] == row[r] for row in last for r in range(4))     # every rank holds the same


def test_loss_scaler_follows_deepspeeds_rule():
    anim = timeline.loss_scaler()
    # window 4, hysteresis 2, overflows at steps 5, 6, 11, worked out by hand from DeepSpeed's DynamicLossScaler
    want = [2 ** 16] * 3 + [2 ** 17] * 2 + [2 ** 16] * 4 + [2 ** 17] * 5 + [2 ** 18]
    assert anim["scales"] == want and _meters(anim)[1:] == want
    skipped = [t + 1 for t, c in enumerate(anim["frames"][-1]["cells"][1]) if c["s"] == "none"]
    assert skipped == [5, 6, 11]


def test_offload_puts_twelve_bytes_per_shard_element_on_nvme():
    anim = memory.offload_nvme(dp=2, stage=2)
    padded = sum(u["padded"] for u in fa.zero_units())
    assert anim["frames"][0]["meter"]["value"] == 2 * padded          # 16-bit parameters only; no gradients at rest
    nvme = sum(est.nvme_placement(u["padded"], 2, 2)["nvme"] for u in fa.zero_units())
    assert nvme == pytest.approx(12 * padded / 2)                      # master + m + v of the shard (ZeRO-Infinity)
    assert max(_meters(anim)) == 2 * padded + 2 * max(u["padded"] for u in fa.zero_units())


def test_recompute_peak_is_the_kept_inputs_plus_one_layer():
    anim = memory.recompute()
    s, b, h, a, L = 1024, 8, 768, 12, 12
    layer = s * b * h * (34 + 5 * a * s / h)
    assert max(_meters(anim)) == pytest.approx(L * 2 * s * b * h + layer)
    assert L * layer > 9 * max(_meters(anim))                          # what recomputation saves here
    assert _meters(anim)[-1] == 0


def test_grid_3d_groups_are_megatrons():
    anim = layout.grid_3d(2, 2, 2)
    want = {"tp": [[0, 1], [2, 3], [4, 5], [6, 7]], "pp": [[0, 4], [1, 5], [2, 6], [3, 7]],
            "dp": [[0, 2], [1, 3], [4, 6], [5, 7]]}
    for f in anim["frames"][1:]:
        assert f["groups"] == want[f["dim"]]
        labels = [c["t"] for row in f["cells"] for c in row]
        for g, members in enumerate(want[f["dim"]]):
            assert sorted(int(t[1:].split("·")[0]) for t in labels if t.endswith("·" + "ABCD"[g])) == members


def test_async_rollback_goes_to_the_last_checkpoint_on_disk():
    anim = timeline.async_rollback(every=4, write_steps=2, fault=11)
    assert anim["rollback_to"] == 8
    ev = {e["step"]: e for e in anim["events"]}
    assert ev[11]["verdict"] == "non-finite loss" and ev[10]["on_disk"] == 4 and ev[11]["on_disk"] == 8
    assert timeline.async_rollback(fault=10)["rollback_to"] == 4        # step 8 still being written
    m = _meters(anim)
    assert m[len(anim["events"]) + 1] == 11 - 8                         # the rollback frame: steps 9-11 redone
    assert max(m) == 4 + 2                                               # a checkpoint lands 2 steps after its save


def test_fsdp_unit_walks_the_engines_unit_states():
    from minimega.zero.stage3 import UnitState
    anim = layout.fsdp_unit("blocks.1", dp=2)
    states = [UnitState(f["state"]) for f in anim["frames"]]
    S, G, U = UnitState.SHARDED, UnitState.GATHERING, UnitState.UNSHARDED
    assert states == [S, G, U, S, G, U, S, S]
    n = anim["numel"]
    assert [(f["comm"]["op"], f["comm"]["elements"]) for f in anim["frames"] if f["comm"]] == \
        [("all_gather", n), ("all_gather", n), ("reduce_scatter", n)]
    assert max(_meters(anim)) == n * (2 + 2 + 12 / 2)


def test_goodput_per_gpu_count():
    anim = timeline.goodput()
    for run, f in zip(anim["runs"], anim["frames"][1:]):
        mtbf = 3600 * 24 * 54 / 419 * 16384 / run["gpus"]            # Llama 3: 419 interruptions, 54 days, 16,384 GPUs
        tau = math.sqrt(2 * 60 * mtbf)
        assert f["meter"]["value"] == pytest.approx(100 * (1 - 60 / tau - tau / 2 / mtbf))


def test_step_split_adds_up_to_the_step():
    from minimega.analysis import perf
    anim = timeline.step_split("bloom-176b", "a100-80gb")
    t = perf.step_time(perf.preset_config("bloom-176b"), "a100-80gb")
    assert sum(f["seconds"] for f in anim["frames"][1:]) == pytest.approx(t["total"])
    assert _meters(anim)[-1] == pytest.approx(t["total"]) and anim["frames"][1]["seconds"] == pytest.approx(t["compute"])


def test_settings_flow_reads_the_exporters():
    from minimega.tools import export_flow
    anim = export_flow.settings_flow()
    rows = {f: [c["t"] for c in row] for f, row in zip(export_flow.SHOWN, anim["frames"][-1]["cells"])}
    assert rows["tp"] == ["—", "--tensor-model-parallel-size = 2", "parallelism.tensor_parallel_degree = 2"]
    assert rows["zero_stage"][0] == "zero_optimization.stage = 0"
    assert rows["gradient_clipping"] == ["gradient_clipping = 1.0", "--clip-grad = 1.0", "training.max_norm = 1.0"]
    assert rows["batch_size"] == ["train_batch_size = 32", "--global-batch-size = 32", "training.global_batch_size = 32"]


def test_moe_route_equals_the_router_and_the_bytes_model():
    import torch
    from minimega import GPTConfig
    from minimega.parallel.moe.layer import MoEConfig, MoELayer
    anim = outcomes.moe_route(ep=2, tokens=4)
    torch.manual_seed(0)
    layer = MoELayer(GPTConfig.tiny(), MoEConfig(**outcomes.MOE))
    x = torch.randn(2, 4, 64)
    top = (x @ layer.router.weight.T).argmax(-1).tolist()              # top-1 of the logits = of the softmax
    assert anim["routes"]["expert"] == top
    C = math.ceil(1.25 * 4 / 4)
    for r in range(2):                                                 # first come, first served per expert
        fits = [top[r][:t].count(e) < C for t, e in enumerate(top[r])]
        assert anim["routes"]["fits"][r] == fits
    assert _meters(anim)[-1] == 4 * (2 - 1) / 2 * 4 * C * 64 * 4 == est.moe_alltoall_bytes(1, 1, 4, 64, 2, 4, 1, 1.25)


def test_capstone_lands_every_published_number():
    from minimega.figures.capstone import DATA
    summary = json.loads(DATA.read_text(encoding="utf-8"))["summary"]
    anim = outcomes.capstone()
    assert len(anim["frames"]) - 1 == summary["compared"] and _meters(anim)[-1] == summary["within"]
