"""minimega under Slurm: the host-list expander and the rank environment (no cluster), a preemption notice to the
local launcher, and, on a one-host Slurm cluster brought up once per session (`slurm_cluster.py`), `srun -n 2`
against the local launcher, `scancel --signal=USR1` and a requeue that resumes to the same weights."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from minimega import checkpoint
from minimega.run import slurm

SRC = str(Path(__file__).resolve().parents[1] / "src")
# Small, fast steps: the run must last long enough to be preempted, and no longer.
TRAIN = ["--seq-len", "32", "--batch-size", "4", "--save-every", "4"]
TOTAL = 40


HOST_CASES = [
    ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
    ("a1,b[2-3]", ["a1", "b2", "b3"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[008-010]", ["n008", "n009", "n010"]),
    ("vm", ["vm"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("x[1,3],y-[09-10]", ["x1", "x3", "y-09", "y-10"]),
]
HOSTLISTS = [text for text, _ in HOST_CASES]


@pytest.mark.parametrize("text, hosts", HOST_CASES)
def test_host_lists_expand_as_scontrol_show_hostnames(text, hosts):
    assert slurm.expand_hostlist(text) == hosts


@pytest.mark.parametrize("text, words", [("gpu[01-04", "never closed"), ("gpu[4-1]", "backwards"),
                                         ("gpu[a-b]", "not a number"), ("", "empty"), ("gpu1]", "unbalanced"),
                                         ("n[1-999999]", "over 100000")])
def test_bad_host_lists_are_refused_by_name(text, words):
    with pytest.raises(ValueError, match=words):
        slurm.expand_hostlist(text)


def test_tasks_per_node_and_port():
    assert slurm.tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert slurm.master_port("123456") == 15000 + 123456 % 20000
    with pytest.raises(ValueError, match="SLURM_JOB_ID"):
        slurm.master_port("")


def test_rank_environment_from_an_srun_task():
    task = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
            "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[03-06]", "SLURM_STEP_NODELIST": "gpu[03-04]",
            "SLURM_STEP_TASKS_PER_NODE": "4,4", "SLURM_JOB_ID": "4242"}
    assert slurm.in_srun_task(task)
    assert slurm.rank_environment(task) == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                                            "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "gpu03",
                                            "MASTER_PORT": str(15000 + 4242)}
    assert slurm.rank_environment({**task, "MASTER_PORT": "29500"})["MASTER_PORT"] == "29500"
    assert not slurm.in_srun_task({k: v for k, v in task.items() if k != "SLURM_STEP_ID"})    # the batch shell
    assert not slurm.in_srun_task({**task, "RANK": "0"})                                     # a torchrun worker
    with pytest.raises(ValueError, match="SLURM_PROCID"):
        slurm.rank_environment({**task, "SLURM_PROCID": "8"})


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "minimega", "train", *args]


def _env(base: dict | None = None) -> dict:
    base = os.environ if base is None else base
    return {**base, "PYTHONPATH": os.pathsep.join([SRC, base.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}


def _report(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert len(lines) == 1, f"expected one JSON report, got {len(lines)}:\n{out}"
    return json.loads(lines[0])


def _wait_for_checkpoint(directory: Path, proc: subprocess.Popen, limit: float = 240) -> None:
    deadline = time.monotonic() + limit
    while not (directory / "latest").exists():
        assert proc.poll() is None, f"the run ended before its first checkpoint: {proc.communicate()}"
        assert time.monotonic() < deadline, "no checkpoint within the limit"
        time.sleep(0.05)


def _preempted(proc: subprocess.Popen, directory: Path, t0: float) -> tuple[dict, float]:
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == slurm.REQUEUE_EXIT, f"exit {proc.returncode}, not {slurm.REQUEUE_EXIT}:\n{err[-2000:]}"
    report = _report(out)
    step = report["preempted"]["step"]
    assert 4 <= step < TOTAL and (directory / "latest").read_text().strip() == f"step-{step:08d}"
    assert checkpoint.read(directory)[0]["step"] == step
    return report, took


def _rank_pid(launcher: int, rank: int) -> int:
    """The pid of ``rank`` of the job ``launcher`` runs: a child of its forkserver, named minimega-rank<r>."""
    def children(pid):
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and (proc / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                    yield int(proc.name), (proc / "comm").read_text().strip()
            except (OSError, IndexError):
                continue
    for server, _ in children(launcher):
        for pid, name in children(server):
            if name == f"minimega-rank{rank}":
                return pid
    raise AssertionError(f"no minimega-rank{rank} under launcher {launcher}")


@pytest.mark.parametrize("notice", ["sigterm-to-the-launcher",
                                    pytest.param("sigusr1-to-rank-1-only", marks=pytest.mark.slow),
                                    pytest.param("rank-1-stopped", marks=pytest.mark.slow)])
def test_a_preemption_notice_to_the_local_launcher_stops_every_rank_with_a_checkpoint(tmp_path, notice):
    """SIGTERM to `minimega train --nproc 2` (what a scheduler sends a job it runs as one process): the ranks hear
    SIGUSR1, agree on a step, save there and the job exits 75. A notice that reaches one rank only stops both at
    the same step (they agree); a rank that cannot answer (stopped) is named by the watchdog."""
    timeout = ["--timeout", "8"] if notice == "rank-1-stopped" else []      # the watchdog's wait, idle time
    proc = subprocess.Popen(_cli("--nproc", "2", "--total-steps", str(TOTAL), "--save-dir", str(tmp_path), "--json",
                                 *TRAIN, *timeout), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        _wait_for_checkpoint(tmp_path, proc)
        t0 = time.monotonic()
        if notice == "sigusr1-to-rank-1-only":
            os.kill(_rank_pid(proc.pid, 1), signal.SIGUSR1)
        elif notice == "rank-1-stopped":
            os.kill(_rank_pid(proc.pid, 1), signal.SIGSTOP)
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=120)
            assert proc.returncode not in (0, slurm.REQUEUE_EXIT) and "watchdog: rank 1 of 2" in err, err[-2000:]
            return
        else:
            proc.send_signal(signal.SIGTERM)
        _preempted(proc, tmp_path, t0)
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------------------------------------
# On a real Slurm.

@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    import slurm_cluster
    t0 = time.monotonic()
    try:
        c = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    except slurm_cluster.Unavailable as why:
        pytest.skip(f"no Slurm cluster: {why}")
    print(f"\nslurm test cluster up in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    yield c
    c.stop()


def test_the_expander_agrees_with_scontrol(cluster):
    for text in HOSTLISTS:
        out = subprocess.run(["scontrol", "show", "hostnames", text], env=cluster.env, capture_output=True,
                             text=True, check=True).stdout.split()
        assert slurm.expand_hostlist(text) == out, text


def _srun(cluster, *args: str, name: str = "minimega", first_on_path: Path | None = None, **popen) -> subprocess.Popen:
    cmd = ["srun", "-n", "2", "-J", name, "--kill-on-bad-exit=0", *_cli(*args)]
    env = _env(cluster.env)
    if first_on_path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(first_on_path), env["PYTHONPATH"]])
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


@pytest.mark.slow
def test_srun_two_tasks_print_one_report_with_the_local_launchers_losses(cluster, uninterrupted, tmp_path):
    """`srun -n 2` (one task per rank) and `srun -n 1 torchrun --nproc-per-node 2` each print one report, with
    the losses of `minimega train --nproc 2` (the uninterrupted run the requeue tests compare with), bit for bit.

    The srun tasks end with their own status however Python's teardown would go: gloo's threads can abort a rank
    there (134 where the job script waits for 0 or 75, once seen in a preempted rank); a `sitecustomize` that aborts
    at exit stands in for that teardown."""
    (tmp_path / "sitecustomize.py").write_text("import atexit, os\natexit.register(os.abort)\n")
    common = ["--total-steps", str(TOTAL), "--json", *TRAIN]
    srun = _srun(cluster, "--save-dir", str(tmp_path / "srun"), *common, first_on_path=tmp_path)
    # one torchrun agent per node (here one node): torchrun's RANK and WORLD_SIZE win over Slurm's variables
    agent = subprocess.Popen(["srun", "-n", "1", "-J", "agent", sys.executable, "-m", "torch.distributed.run",
                              "--standalone", "--nproc-per-node", "2", "-m", "minimega", "train", "--save-dir",
                              str(tmp_path / "agent"), *common], env=_env(cluster.env), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        out, err = srun.communicate(timeout=280)
        assert srun.returncode == 0, err[-2000:]
        under_slurm = _report(out)
        out, err = agent.communicate(timeout=280)
        assert agent.returncode == 0, err[-2000:]
        under_torchrun = _report(out)
    finally:                          # a failed assertion must not leave a job waiting on a cluster that is gone
        for job in (srun, agent):
            job.kill()
            job.wait()
    _, alone = uninterrupted()
    assert under_slurm["nproc"] == under_torchrun["nproc"] == 2 and len(under_slurm["losses"]) == TOTAL
    assert under_slurm["losses"] == alone["losses"] and under_torchrun["losses"] == alone["losses"]
    assert under_slurm["final_loss"] == alone["final_loss"]


@pytest.mark.slow
def test_scancel_usr1_saves_and_a_requeued_srun_resumes_to_the_same_weights(cluster, uninterrupted, tmp_path):
    ckpt = tmp_path / "ckpt"
    common = ["--total-steps", str(TOTAL), "--json", *TRAIN]
    job = _srun(cluster, "--save-dir", str(ckpt), *common, name="preempt-me")
    try:
        _wait_for_checkpoint(ckpt, job)
        t0 = time.monotonic()
        subprocess.run(["scancel", "--signal=USR1", "-n", "preempt-me"], env=cluster.env, check=True)
        first, took = _preempted(job, ckpt, t0)
    finally:
        job.kill()
        job.wait()
    print(f"scancel --signal=USR1 to the end of the job: {took:.1f} s (stopped after step "
          f"{first['preempted']['step']} of {TOTAL})")
    assert took < 60, f"the preempted job took {took:.1f} s to end"
    step = first["preempted"]["step"]
    again = _srun(cluster, "--save-dir", str(ckpt), "--resume", str(ckpt), *common, name="requeued")
    out, err = again.communicate(timeout=280)
    assert again.returncode == 0, err[-2000:]
    second = _report(out)
    ref, whole = uninterrupted()
    assert second["first_step"] == step and first["losses"] + second["losses"] == whole["losses"]
    _same_weights(ckpt, ref)


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory):
    """The run every requeued one must end like: `--nproc 2` on the local launcher, never interrupted, started
    at once in the background and waited for where it is needed."""
    ref = tmp_path_factory.mktemp("uninterrupted")
    proc = subprocess.Popen(_cli("--nproc", "2", "--save-dir", str(ref), "--total-steps", str(TOTAL), "--json",
                                 *TRAIN), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = {}

    def wait():
        if not done:
            out, err = proc.communicate(timeout=400)
            assert proc.returncode == 0, err[-2000:]
            done["report"] = _report(out)
        return ref, done["report"]
    yield wait
    proc.kill()
    proc.wait()


def _same_weights(ckpt: Path, ref: Path) -> None:
    (manifest, resumed), (_, uninterrupted) = checkpoint.read(ckpt), checkpoint.read(ref)
    assert manifest["step"] == TOTAL
    for part in ("model", "optimizer"):
        flat_a, flat_b = _flat(resumed[part]), _flat(uninterrupted[part])
        assert flat_a.keys() == flat_b.keys()
        assert all(torch.equal(flat_a[k], flat_b[k]) for k in flat_a), f"{part} differs from the uninterrupted run"


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_export_slurm_writes_a_script_whose_srun_line_trains_the_same_config(tmp_path):
    from minimega.tools.cli import build_parser
    from minimega.config import TrainConfig
    from minimega.tools.export_slurm import SlurmJob, to_slurm
    from minimega.tools.train_args import build_train_config

    cfg = TrainConfig(tp=2, zero_stage=2, lr=3e-4, betas=(0.9, 0.95), overlap_comm=False, seed=7)
    job = SlurmJob(nodes=2, tasks_per_node=4, gpus_per_task=1, checkpoint_dir="/scratch/run 1", total_steps=500)
    text = to_slurm(cfg, job)
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-task=1",
                 "#SBATCH --signal=USR1@120", "#SBATCH --requeue", "export NCCL_SOCKET_IFNAME=^lo,docker0",
                 "CKPT='/scratch/run 1'", f"if [ $status -eq {slurm.REQUEUE_EXIT} ]; then"):
        assert line in text.splitlines() or any(l.startswith(line) for l in text.splitlines()), line
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)
    srun = next(l for l in text.splitlines() if l.startswith("srun "))
    import shlex
    argv = shlex.split(srun.replace('"$CKPT"', "CKPT").replace('"${RESUME[@]}"', ""))
    train = argv[argv.index("minimega") + 1:]
    args = build_parser(train).parse_args(train)
    assert args.total_steps == 500 and args.save_dir == "CKPT" and args.save_every == job.save_every
    assert build_train_config(args, dp=4) == cfg
    with pytest.raises(ValueError, match="multiple of tp"):
        to_slurm(TrainConfig(tp=3), job)
    from minimega.tools.cli import main
    assert main(["export-config", "--deepspeed", "--nodes", "2"]) != 0          # refused, not ignored


COURSE_SCRIPT = Path(__file__).resolve().parents[1] / "course" / "data" / "slurm-job.sbatch"
COURSE_ARGS = ["--slurm", "--preset", "small", "--nodes", "2", "--tasks-per-node", "4", "--tp", "2", "--zero-stage", "1",
               "--precision", "bf16", "--total-steps", "20000", "--save-every", "500", "--time", "12:00:00",
               "--checkpoint-dir", "/scratch/minimega/small-run", "--job-name", "small-run"]


def test_the_script_chapter_12_embeds_is_what_export_config_writes(tmp_path):
    from minimega.tools.cli import main
    assert main(["export-config", *COURSE_ARGS, "--out", str(tmp_path / "job.sbatch")]) == 0
    assert COURSE_SCRIPT.read_text() == (tmp_path / "job.sbatch").read_text(), (
        "course/data/slurm-job.sbatch is stale: rewrite it with `minimega export-config "
        + " ".join(COURSE_ARGS) + " --out course/data/slurm-job.sbatch`")


@pytest.mark.slow
def test_the_exported_sbatch_script_requeues_itself_on_usr1_and_ends_like_an_uninterrupted_run(cluster, uninterrupted,
                                                                                              tmp_path):
    from minimega.tools.cli import main
    ckpt, script, shim = tmp_path / "ckpt", tmp_path / "job.sbatch", tmp_path / "bin" / "minimega"
    assert main(["export-config", "--slurm", "--nodes", "1", "--tasks-per-node", "2", "--gpus-per-task", "0",
                 "--total-steps", str(TOTAL), "--save-every", "4", "--seq-len", "32", "--batch-size", "4",
                 "--time", "15", "--job-name", "requeue-me", "--checkpoint-dir", str(ckpt), "--out", str(script)]) == 0
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m minimega "$@"\n')
    shim.chmod(0o755)
    env = {**_env(cluster.env), "PATH": f"{shim.parent}{os.pathsep}{os.environ['PATH']}"}
    job_id = subprocess.run(["sbatch", "--parsable", str(script)], env=env, cwd=tmp_path, capture_output=True,
                            text=True, check=True).stdout.strip().split(";")[0]
    log = tmp_path / f"requeue-me-{job_id}.out"
    try:
        _wait_for_checkpoint(ckpt, _JobAlive(cluster, job_id))
        subprocess.run(["scancel", "--signal=USR1", job_id], env=cluster.env, check=True)
        deadline, seen = time.monotonic() + 400, []
        while (state := _job(cluster, job_id))["JobState"] != "COMPLETED":
            if not seen or seen[-1] != state["JobState"]:
                seen.append(state["JobState"])
            # a requeue goes RUNNING -> PENDING -> RUNNING; an end in any other state is a failure
            # a requeued job waits out its step credentials (cred_expire, 10 s on the test cluster) before it
            # starts again; forcing StartTime=now instead raced slurmd's cleanup of the first run under load
            assert state["JobState"] not in ("FAILED", "CANCELLED", "TIMEOUT"), (seen, _tails(cluster, log))
            assert time.monotonic() < deadline, (seen, _tails(cluster, log))
            time.sleep(0.5)
    finally:
        subprocess.run(["scancel", job_id], env=cluster.env)
        print(log.read_text() if log.exists() else "(no log)")          # the job's own words, on a failure
    print("job states seen:", " -> ".join(seen))
    assert _job(cluster, job_id)["Restarts"] == "1", log.read_text()
    text = log.read_text()
    assert "restart 0: from step 0" in text and f"restart 1: --resume {ckpt}" in text, text
    ref, _ = uninterrupted()
    _same_weights(ckpt, ref)


def _tails(cluster, log: Path) -> str:
    """The job's log and the daemons' last lines: what a failed requeue needs to be read."""
    own = log.read_text() if log.exists() else "(no log)"
    return "\n".join([own, "--- slurmctld:", cluster.log("slurmctld")[-1500:], "--- slurmd:",
                      cluster.log("slurmd")[-1500:]])


class _JobAlive:
    """`_wait_for_checkpoint`'s view of a batch job: poll() is None while it has not ended."""

    def __init__(self, cluster, job_id):
        self.cluster, self.job_id = cluster, job_id

    def poll(self):
        return None if _job(self.cluster, self.job_id)["JobState"] in ("PENDING", "RUNNING") else 1

    def communicate(self):
        return _job(self.cluster, self.job_id)


def _job(cluster, job_id: str) -> dict:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=cluster.env, capture_output=True, text=True,
                         check=True).stdout
    return dict(part.split("=", 1) for part in out.split() if "=" in part)
