"""`minimega train` end to end on 2 ranks, and its refusals."""
import json
import subprocess
import sys

from minimega.cli import main


def test_train_two_ranks_loss_falls(capsys):
    assert main(["train", "--nproc", "2", "--preset", "tiny", "--steps", "30", "--lr", "3e-3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["final_loss"] < out["first_loss"] - 1.0
    psi = out["params"]
    assert out["algorithmic_bytes_sent_all_ranks"] == 2 * 30 * (2 * 1 / 2 * 4 * psi)     # 2 ranks, 30 DDP steps, ring model


def test_bad_layout_is_one_clear_line(capsys):
    assert main(["train", "--nproc", "2", "--dp", "3"]) == 2
    assert "dp*tp*pp = 3*1*1 = 3 != world size 2" in capsys.readouterr().err


def test_module_entry_point_help():
    out = subprocess.run([sys.executable, "-m", "minimega", "train", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "--zero-stage" in out.stdout and "--sp" in out.stdout


def test_save_resume_and_consolidate_from_the_command_line(tmp_path, capsys):
    ck = str(tmp_path / "ck")
    assert main(["train", "--nproc", "2", "--steps", "4", "--save-dir", ck, "--save-every", "2", "--json"]) == 0
    assert (tmp_path / "ck" / "latest").read_text() == "step-00000004"
    assert main(["train", "--nproc", "1", "--steps", "2", "--resume", ck, "--save-every", "2", "--json"]) == 0
    assert (tmp_path / "ck" / "latest").read_text() == "step-00000006"      # continued from step 4 on 1 rank
    assert main(["checkpoint", "consolidate", ck, str(tmp_path / "w.safetensors")]) == 0
    assert (tmp_path / "w.safetensors").stat().st_size > 4 * 234_048
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "empty")]) == 2
    assert "no checkpoint in" in capsys.readouterr().err
