"""ZeRO behind the engine and the CLI: `minimega train --zero-stage 3` trains, and bad combinations fail clearly."""
import json

import pytest

from minimega.tools.cli import main


def test_cli_trains_with_zero_stage_3(capsys):
    steps = 10
    assert main(["train", "--nproc", "2", "--zero-stage", "3", "--steps", str(steps), "--lr", "3e-3",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["final_loss"] < out["first_loss"] - 0.5
    psi = out["params"]             # the tiny preset's units divide by 2: no padding
    # Stage 3: all-gather (forward) + all-gather (backward) + reduce-scatter, each (n-1)/n · 4Ψ, on 2 ranks.
    assert out["algorithmic_bytes_sent_all_ranks"] == 2 * steps * 3 * (1 / 2) * 4 * psi


@pytest.mark.parametrize("argv, message", [
    (["--precision", "fp8"], "precision='fp8' needs zero_stage >= 1"),
    (["--offload"], "offload_optimizer needs zero_stage >= 1"),
    (["--zero-stage", "4"], "--zero-stage must be 0, 1, 2 or 3"),
], ids=["fp8-stage0", "offload-stage0", "stage4"])
def test_bad_combinations_are_refused_before_any_rank_starts(argv, message, capsys):
    assert main(["train", "--nproc", "2", "--steps", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "rank" not in err          # refused in the parent, not by a worker
