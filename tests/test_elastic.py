"""Elastic restart in `minimega train`: a rank killed mid-run, the job resumed from the latest checkpoint.

The oracle is the same command run straight through: with the same world size the restarted job must end
on the very same bits (data, optimizer state, step count and RNG all come back from the checkpoint); on a
smaller world (``--min-nproc``) the checkpoint is resharded and only the reduction order differs.
"""
import contextlib
import io
import json

import pytest
import torch

import minimega as mm
from minimega.tools.cli import main
from minimega.tools.elastic import FAULT_STEP_ENV, RESTART_ENV

STEPS, EVERY = 20, 5
FLAGS = ["train", "--nproc", "2", "--steps", str(STEPS), "--save-every", str(EVERY), "--lr", "3e-3", "--json"]


def _run(capsys, *flags) -> dict:
    assert main([*FLAGS, *flags]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _state(directory, step: int) -> dict:
    """Weights and optimizer state of the checkpoint at ``step``, loaded into a one-process engine."""
    engine = mm.initialize(mm.GPT(mm.GPTConfig.tiny()), mm.TrainConfig(lr=3e-3), mm.init_mesh())
    assert engine.load(directory / f"step-{step:08d}") == step
    flat = {f"param/{k}": v for k, v in engine.full_state_dict().items()}
    names = {p: n for n, p in engine.model.named_parameters()}
    for p, st in engine.optimizer.state.items():
        flat.update({f"{k}/{names[p]}": v for k, v in st.items()})
    return flat


def _max_abs(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted 20-step run on 2 ranks: its checkpoint directory (10, 15, 20 kept) and losses."""
    directory = tmp_path_factory.mktemp("straight")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*FLAGS, "--save-dir", str(directory)]) == 0
    return directory, json.loads(out.getvalue().strip().splitlines()[-1])["losses"]


def test_restart_at_the_same_size_ends_on_the_same_bits(straight, tmp_path, capsys, monkeypatch):
    capsys.readouterr()
    monkeypatch.setenv(FAULT_STEP_ENV, "1:7")               # rank 1 SIGKILLs itself after step 7
    out = _run(capsys, "--save-dir", str(tmp_path), "--max-restarts", "2")
    (event,) = out["restarts"]
    assert (event["rank"], event["step"], event["resume_step"], event["redone"], event["nproc"]) == (1, 7, 5, 2, 2)
    assert "killed by signal SIGKILL" in event["error"]
    assert out["first_step"] == 5 and len(out["losses"]) == STEPS - 5
    ours, ref = _state(tmp_path, STEPS), _state(straight[0], STEPS)
    assert out["losses"] == straight[1][5:]
    assert ours.keys() == ref.keys() and any(k.startswith("exp_avg_sq/") for k in ref)
    unequal = [k for k in ref if not torch.equal(ours[k], ref[k])]
    assert not unequal, f"{len(unequal)} of {len(ref)} tensors differ, e.g. {unequal[:3]}"
    assert RESTART_ENV not in __import__("os").environ


def test_restart_on_fewer_ranks_reshards_and_stays_close(straight, tmp_path, capsys, monkeypatch):
    """Lose rank 1 of 2 at step 7, come back on 1 rank from the step-5 checkpoint (resharded on load).

    Compared with the straight 2-rank run: (1) the loss of step 6, the first one computed from the
    resumed step-5 state, and every later loss; (2) the weights at step 10, the first checkpoint written
    after the resume. Only the reduction order differs (one rank sums the whole batch; two ranks sum
    halves and average), about 1e-7 per step; Adam then amplifies it where gradients are tiny (its
    update is ~lr whatever the gradient's size), so the drift grows with the steps that follow.
    """
    capsys.readouterr()
    monkeypatch.setenv(FAULT_STEP_ENV, "1:7")
    out = _run(capsys, "--save-dir", str(tmp_path), "--max-restarts", "1", "--min-nproc", "1")
    (event,) = out["restarts"]
    assert (event["rank"], event["step"], event["resume_step"], event["nproc"]) == (1, 7, 5, 1)
    assert out["nproc"] == 1 and out["first_step"] == 5
    straight, ref_losses = straight
    loss_diffs = [abs(a - b) for a, b in zip(out["losses"], ref_losses[5:], strict=True)]
    weights = {step: _max_abs(*({k: v for k, v in _state(d, step).items() if k.startswith("param/")}
                                for d in (tmp_path, straight))) for step in (10, 15, 20)}
    print(f"resumed on 1 rank: |loss - straight| at step 6 {loss_diffs[0]:.2e}, max over 6..20 "
          f"{max(loss_diffs):.2e}; max |w - w_straight| at steps 10/15/20: {weights}")
    assert loss_diffs[0] <= 1e-5 and weights[10] <= 1e-5, (loss_diffs, weights)


def test_without_restarts_a_dead_rank_fails_the_job(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(FAULT_STEP_ENV, "0:2")
    assert main([*FLAGS[:3], "--steps", "4", "--save-dir", str(tmp_path), "--save-every", "2"]) == 1
    assert "rank 0 of 2 was killed by signal SIGKILL" in capsys.readouterr().err


def test_elastic_flags_are_checked_before_any_rank_starts(capsys):
    assert main(["train", "--nproc", "2", "--max-restarts", "1"]) == 2
    assert "--max-restarts needs --save-dir and --save-every" in capsys.readouterr().err
    assert main(["train", "--nproc", "2", "--min-nproc", "3", "--max-restarts", "1", "--save-dir", "x",
                 "--save-every", "1"]) == 2
    assert "--min-nproc must lie in [1, --nproc=2], got 3" in capsys.readouterr().err
    assert main(["train", "--timeout", "0"]) == 2
    assert "--timeout: 0 is not allowed; give a finite number > 0" in capsys.readouterr().err


# ---- a restart shrinks only to a size the engine accepts (`engine.validate` through `train._fits`) ---------

SHRINK_FLAGS = ["--steps", "2", "--save-every", "1", "--seq-len", "32", "--lr", "3e-3", "--json"]
SHRINK = {  # id: (layout flags, nproc, the size a restart after losing one rank must come back on)
    # the old rule (n % (tp*pp) == 0 and the batch splits over n/(tp*pp)) chose 3, 3, 4, 4: every rank refused it
    "cp2": (["--cp", "2", "--batch-size", "12"], 4, 2),
    "ep2-experts2": (["--ep", "2", "--experts", "2", "--batch-size", "12"], 4, 2),
    "pp2-mb4": (["--pp", "2", "--micro-batches", "4", "--batch-size", "12"], 6, 2),
    "accum4": (["--gradient-accumulation-steps", "4", "--batch-size", "24"], 6, 3),
}


@pytest.mark.parametrize("case", SHRINK)
def test_shrink_picks_the_largest_size_validate_accepts(case):
    """Pure arithmetic (no rank): losing one rank of ``nproc``, `shrink` lands on the expected size."""
    import functools

    from minimega.tools.cli import build_parser
    from minimega.tools.elastic import shrink
    from minimega.tools.train import _check_train_args, _fits
    flags, nproc, want = SHRINK[case]
    args = build_parser().parse_args(["train", "--nproc", str(nproc), *flags, *SHRINK_FLAGS, "--save-dir", "x",
                                      "--max-restarts", "1", "--min-nproc", "1"])
    fits = functools.partial(_fits, args, _check_train_args(args)[0])
    assert shrink(nproc, 1, 1, fits) == want


def _consolidated(step_dir) -> dict:
    from safetensors.torch import load_file

    from minimega import checkpoint
    return load_file(str(checkpoint.consolidate(step_dir, step_dir.parent / f"{step_dir.name}.safetensors")))


@pytest.mark.slow
@pytest.mark.parametrize("case", SHRINK)
def test_a_restart_shrinks_to_a_valid_size_and_matches_a_straight_resume(case, tmp_path, capsys, monkeypatch):
    """Kill rank 1 after step 1 of 2 (``--max-restarts 1 --min-nproc 2``): the job comes back on the size
    `validate` accepts and finishes. Oracle: a straight `minimega train --resume` of the same checkpoint on
    that size. Same world, same layout, same data, same reduction order: the weights must be equal bit for
    bit (any difference would be a state the restart lost or invented, not float noise)."""
    flags, nproc, want = SHRINK[case]
    run, ref = tmp_path / "run", tmp_path / "ref"
    capsys.readouterr()
    monkeypatch.setenv(FAULT_STEP_ENV, "1:1")
    assert main(["train", "--nproc", str(nproc), *flags, *SHRINK_FLAGS, "--save-dir", str(run),
                 "--max-restarts", "1", "--min-nproc", "2"]) == 0, capsys.readouterr().err[-2000:]
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (event,) = out["restarts"]
    assert (event["rank"], event["nproc"], out["nproc"]) == (1, want, want), event
    resume = event["resume_step"]
    monkeypatch.delenv(FAULT_STEP_ENV)
    straight = ["--resume", str(run / f"step-{resume:08d}")] if resume else []
    assert main(["train", "--nproc", str(want), *flags, *SHRINK_FLAGS[:-1], "--steps", str(2 - resume), *straight,
                 "--save-dir", str(ref)]) == 0, capsys.readouterr().err[-2000:]
    ours, theirs = _consolidated(run / "step-00000002"), _consolidated(ref / "step-00000002")
    assert ours.keys() == theirs.keys()
    diff = max((ours[k] - theirs[k]).abs().max().item() for k in ours)
    print(f"{case}: {nproc} -> {want} ranks, resumed at step {resume}; max |w - w_straight| = {diff:.3g}")
    assert diff == 0.0, f"{case}: the restarted run's weights differ from a straight resume by {diff:.3g}"
