"""`minimega train` end to end on 2 ranks, and its refusals."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from minimega.tools.cli import main


def test_train_two_ranks_loss_falls(capsys):
    assert main(["train", "--nproc", "2", "--preset", "tiny", "--steps", "30", "--lr", "3e-3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["final_loss"] < out["first_loss"] - 1.0
    psi = out["params"]
    assert out["algorithmic_bytes_sent_all_ranks"] == 2 * 30 * (2 * 1 / 2 * 4 * psi)     # 2 ranks, 30 DDP steps, ring model


def test_bad_layout_is_one_clear_line(capsys):
    assert main(["train", "--nproc", "2", "--dp", "3"]) == 2
    assert "dp*tp*pp = 3*1*1 = 3 != world size 2" in capsys.readouterr().err


NO_TORCH = """
import contextlib, io, runpy, sys, time
class Blocker:                                   # torch made unimportable, as on a machine without it
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"{name} is blocked: --help must not import torch")
sys.meta_path.insert(0, Blocker())
t0 = time.perf_counter()
sys.argv = ["minimega", "--help"]
try:
    runpy.run_module("minimega", run_name="__main__")
except SystemExit as e:
    assert e.code == 0, e.code
took = time.perf_counter() - t0
from minimega.tools.cli import COMMANDS, main
for name in COMMANDS:                            # every command's --help, in this same torch-free process
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([name, "--help"]) == 0, name
    assert f"usage: minimega {name}" in out.getvalue(), name
    if name == "train":
        print(out.getvalue())
print("torch loaded:", "torch" in sys.modules, "main help s:", round(took, 2))
"""


def test_every_help_prints_without_torch():
    """`minimega --help` and each command's `--help` with torch unimportable: the commands are listed, the
    `train` flags shown, and torch never loaded (it costs 10 s on a loaded machine, `estimate` 0.2 s)."""
    out = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert all(c in out.stdout for c in ("train", "estimate", "plan", "dry-run", "export-config", "serve", "cert"))
    assert "--zero-stage" in out.stdout and "--sp" in out.stdout                    # train --help
    assert "torch loaded: False" in out.stdout, out.stdout[-300:]


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


def _rank_pids(launcher: int) -> dict[str, int]:
    """{'minimega-rank0': pid, ...} among the descendants of ``launcher`` (ranks name themselves)."""
    parent, name = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        pid = int(stat.parent.name)
        name[pid] = text[text.index("(") + 1:text.rindex(")")]
        parent[pid] = int(text[text.rindex(")") + 2:].split()[1])
    def descends(pid):
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == launcher:
                return True
        return False
    return {name[p]: p for p in name if name[p].startswith("minimega-rank") and descends(p)}


WATCHDOG_TIMEOUT = 6        # seconds; `--timeout 20` behaves the same, 14 s later


def test_a_stopped_rank_ends_the_job_naming_it_and_its_collective(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = tmp_path / "stderr"                # a file, not a pipe: the forkserver, still tearing down, holds it
    with open(log, "w") as stderr:
        job = subprocess.Popen([sys.executable, "-m", "minimega", "train", "--nproc", "2", "--steps", "200",
                                "--timeout", str(WATCHDOG_TIMEOUT)], env=env, stdout=subprocess.DEVNULL,
                               stderr=stderr)
    try:
        started = time.monotonic()
        deadline = started + 120
        while len(ranks := _rank_pids(job.pid)) < 2 and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.1)
        assert len(ranks) == 2, "the ranks never started"
        start_s = time.monotonic() - started     # the run's own baseline: load slows this start and the exit alike
        time.sleep(1.0)                                     # let them train a few steps
        os.kill(ranks["minimega-rank1"], signal.SIGSTOP)
        stopped = time.monotonic()
        job.wait(timeout=WATCHDOG_TIMEOUT + 30)
        took = time.monotonic() - stopped
    finally:
        job.kill()
    err = log.read_text()
    margin = max(5.0, start_s)                  # ending the job may take as long as starting its ranks did
    print(f"SIGSTOP to exit: {took:.1f} s with --timeout {WATCHDOG_TIMEOUT} (margin {margin:.1f} s: the ranks "
          f"took {start_s:.1f} s to start)")
    assert job.returncode == 1 and took < WATCHDOG_TIMEOUT + margin, (job.returncode, took, start_s, err[-2000:])
    assert "watchdog: rank 1 of 2 stopped responding" in err and "process state: stopped" in err, err[-2000:]
    assert "the last collective it entered: all_reduce#" in err, err[-2000:]
    gone = [not Path(f"/proc/{p}").exists() or Path(f"/proc/{p}/stat").read_text().split()[2] == "Z"
            for p in ranks.values()]
    assert all(gone), "a rank outlived its job"


def _train_output(tmp_path, steps: int, nproc: int, terminal: bool) -> str:
    """stderr of `python -m minimega train` written to a log file, or to a pseudo-terminal as a shell gives it."""
    import fcntl
    import pty
    import struct
    import termios
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "100"}
    argv = [sys.executable, "-m", "minimega", "train", "--nproc", str(nproc), "--steps", str(steps)]
    if not terminal:
        log = tmp_path / "train.log"
        with open(log, "w") as err:
            done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=err, timeout=180)
        assert done.returncode == 0, log.read_text()
        return log.read_text()
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))     # 40 rows, 100 columns
    job = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:              # the terminal closed: every rank and the launcher have exited
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert job.wait(timeout=180) == 0
    return b"".join(chunks).decode()


def test_progress_in_a_log_file_is_plain_lines(tmp_path):
    text = _train_output(tmp_path, steps=30, nproc=2, terminal=False)
    assert "\r" not in text
    steps = [ln for ln in text.splitlines() if ln.startswith("step ")]
    assert [ln.split()[1] for ln in steps] == [f"{i}/30" for i in range(3, 31, 3)]      # a tenth of the run each
    assert all(len(ln) < 80 for ln in steps) and "loss" in steps[-1] and "tok/s" in steps[-1]
    assert max(map(len, text.splitlines())) < 200


def test_progress_on_a_terminal_is_a_bar(tmp_path):
    text = _train_output(tmp_path, steps=6, nproc=1, terminal=True)
    assert "\r" in text and "100%|" in text and "6/6 [" in text and "tok/s]" in text, text
    assert not any(ln.startswith("step ") for ln in text.splitlines())


def _run_json(argv, capsys) -> dict:
    assert main(argv) == 0
    out = capsys.readouterr().out.strip()
    return json.loads(out[out.index("{"):] if out.startswith("{") else out.splitlines()[-1])


def test_train_shows_memory_by_category_equal_to_estimate_and_zero3_below_zero0(capsys):
    """`minimega train` reports rank 0's model states at the optimizer step next to `minimega estimate`'s rows, the
    estimate of the run's own precision (bf16: fp32 gradients, 2 + 4 + 12 bytes per parameter)."""
    totals = {}
    for stage, precision in ((0, "fp32"), (3, "bf16")):
        summary = _run_json(["train", "--nproc", "2", "--zero-stage", str(stage), "--precision", precision,
                             "--steps", "2", "--json"], capsys)
        memory = summary["memory_rank0"]
        command = memory["estimate_command"].split()
        assert command[:2] == ["minimega", "estimate"] and command[-2:] == ["--precision", precision]
        estimate = _run_json([*command[1:], "--json"], capsys)["stages"][0]
        for row in ("params", "grads", "optimizer"):
            assert memory["measured"][row] == estimate[row] > 0, (stage, row)
        totals[stage] = sum(memory["measured"][r] for r in ("params", "grads", "optimizer"))
    assert totals[3] * 1.9 * 16 < totals[0] * 18         # ZeRO-3 on 2 ranks: half of every state (bf16 18 B/param, fp32 16)


def test_counts_take_suffixes(capsys):
    rows = _run_json(["estimate", "--params", "7.5B", "--dp", "64", "--stage", "3", "--json"], capsys)
    assert rows["params"] == 7.5e9
    assert main(["estimate", "--params", "7.5Q"]) == 2
    assert "7.5Q" in capsys.readouterr().err
