"""A run as a Slurm batch script: ``minimega export-config --slurm`` (`to_slurm`).

The script asks for the layout (nodes, tasks per node, one rank per task, GPUs per task), a time limit, the
preemption notice (``--signal=USR1@120``: SIGUSR1 to every task two minutes before the end) and
``--requeue``; sets the environment NCCL needs; and starts one ``minimega train`` per task with ``srun``. Each
task finds its rank, the world size and the rendezvous in Slurm's environment (`minimega.run.slurm`). On the
notice the ranks agree on a step, save a checkpoint there and exit 75; the script answers 75 with
``scontrol requeue``, and the requeued job (same id, same script) resumes from the checkpoint and ends at the
same ``--total-steps``.
"""
from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass

from ..config import TrainConfig
from ..run.slurm import REQUEUE_EXIT


@dataclass(frozen=True, kw_only=True)
class SlurmJob:
    """The scheduler's side of a run (the TrainConfig is the rest)."""
    nodes: int = 1
    tasks_per_node: int = 1
    """One task per rank; on GPUs one per GPU."""
    gpus_per_task: int = 1
    """0 on a CPU partition (no ``--gpus-per-task`` line)."""
    time: str = "01:00:00"
    signal_s: int = 120
    """Seconds before the limit at which SIGUSR1 comes (Slurm may send it up to 60 s earlier)."""
    checkpoint_dir: str = "checkpoints"
    save_every: int = 100
    total_steps: int = 1000
    job_name: str = "minimega"
    partition: str | None = None

    def check(self) -> None:
        for name in ("nodes", "tasks_per_node", "save_every", "total_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.gpus_per_task < 0 or self.signal_s < 1:
            raise ValueError("--gpus-per-task must be >= 0 and --signal-s >= 1")
        if not self.checkpoint_dir or "\n" in self.checkpoint_dir:
            raise ValueError("--checkpoint-dir: a directory path on a file system every node sees")


def train_flags(cfg: TrainConfig) -> list[str]:
    """``minimega train``'s flags for every field of ``cfg`` that is not its default (one flag per field)."""
    default = TrainConfig()
    out = []
    for f in dataclasses.fields(TrainConfig):
        value = getattr(cfg, f.name)
        if value == getattr(default, f.name):
            continue
        flag = f"--{f.name.replace('_', '-')}"
        if isinstance(value, bool):
            out.append(flag if value else f"--no-{f.name.replace('_', '-')}")
        elif isinstance(value, tuple):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


# --8<-- [start:to_slurm]
def to_slurm(cfg: TrainConfig, job: SlurmJob, preset: str = "tiny") -> str:
    """The sbatch script for ``cfg`` on ``job``'s layout (module docstring)."""
    job.check()
    ranks = job.nodes * job.tasks_per_node
    layout = cfg.tp * cfg.pp * cfg.cp
    if ranks % layout:
        raise ValueError(f"--nodes {job.nodes} x --tasks-per-node {job.tasks_per_node} = {ranks} ranks is not a "
                         f"multiple of tp * pp * cp = {layout}")
    train = ["minimega", "train", "--preset", preset, "--total-steps", str(job.total_steps),
             "--save-dir", '"$CKPT"', "--save-every", str(job.save_every), *map(shlex.quote, train_flags(cfg))]
    lines = [
        "#!/bin/bash",
        f"# {ranks} ranks (dp={ranks // layout} tp={cfg.tp} pp={cfg.pp} cp={cfg.cp}): one srun task per rank.",
        f"#SBATCH --job-name={job.job_name}",
        *([f"#SBATCH --partition={job.partition}"] if job.partition else []),
        f"#SBATCH --nodes={job.nodes}",
        f"#SBATCH --ntasks-per-node={job.tasks_per_node}",
        *([f"#SBATCH --gpus-per-task={job.gpus_per_task}"] if job.gpus_per_task else []),
        f"#SBATCH --time={job.time}",
        f"# SIGUSR1 to every task {job.signal_s} s before the limit; --requeue: back into the queue with the",
        "# same job id; append: the requeued job adds to the same log.",
        f"#SBATCH --signal=USR1@{job.signal_s}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        "#SBATCH --output=%x-%j.out",
        "",
        f"CKPT={shlex.quote(job.checkpoint_dir)}   # on a file system every node sees",
        "export NCCL_DEBUG=WARN                    # NCCL says why it fails",
        "export NCCL_SOCKET_IFNAME=^lo,docker0     # bootstrap over a real interface, not loopback",
        "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}",
        "# No MASTER_ADDR/MASTER_PORT: every task derives them from SLURM_JOB_NODELIST and SLURM_JOB_ID.",
        "",
        "RESUME=()",
        'if [ -e "$CKPT/latest" ]; then RESUME=(--resume "$CKPT"); fi   # a requeued job continues',
        'echo "restart ${SLURM_RESTART_COUNT:-0}: ${RESUME[*]:-from step 0}"',
        f"# Not --kill-on-bad-exit=1: the first rank to exit {REQUEUE_EXIT} would have Slurm kill the others mid-exit.",
        "srun --kill-on-bad-exit=0 " + " ".join(train) + ' "${RESUME[@]}"',
        "status=$?",
        f"if [ $status -eq {REQUEUE_EXIT} ]; then     # every rank saved and asked to be requeued",
        '    scontrol requeue "$SLURM_JOB_ID"',
        "    exit 0",
        "fi",
        "exit $status",
        ""]
    return "\n".join(lines)
# --8<-- [end:to_slurm]
