"""Running under Slurm: ranks from the scheduler's environment, and its preemption notice.

``srun -n 4 minimega train`` starts four tasks; each is one rank. Slurm tells each task who it is
(srun(1), "OUTPUT ENVIRONMENT VARIABLES"); `rank_environment` turns that into what torch.distributed's
``env://`` rendezvous reads, as torchrun would have set it:

    SLURM_PROCID        -> RANK           SLURM_NTASKS -> WORLD_SIZE
    SLURM_LOCALID       -> LOCAL_RANK     tasks on this node (SLURM_STEP_TASKS_PER_NODE) -> LOCAL_WORLD_SIZE
    first host of SLURM_JOB_NODELIST -> MASTER_ADDR    15000 + SLURM_JOB_ID mod 20000 -> MASTER_PORT

Every task computes the same address and port with no message exchanged: the first host runs the
rendezvous store (rank 0 lands there, as Slurm numbers tasks node by node), the port follows the job id,
so two jobs sharing a node do not meet. ``MASTER_PORT`` set by the user wins.

Before a time limit or a preemption Slurm sends a signal (``#SBATCH --signal=USR1@120``: SIGUSR1 two
minutes ahead; SIGTERM at the limit itself, SIGKILL ``KillWait`` seconds later). `Preemption` turns it into a
flag; ranks agree on it once per step (`comm.any_rank`, one all-reduce of one number), so they all stop
after the same step, save, and exit with `REQUEUE_EXIT`, which the job script answers with
``scontrol requeue``.
"""
from __future__ import annotations

import os
import re
import signal
import threading

REQUEUE_EXIT = 75
"""The exit status of a job that stopped for a preemption notice after saving a checkpoint: "requeue me".
75 is ``EX_TEMPFAIL`` in sysexits.h: a temporary failure, to be tried again."""
PORT_BASE, PORT_SPAN = 15000, 20000

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets: ``a1,b[2-3]`` -> ``["a1", "b[2-3]"]``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "[") - (ch == "]")
        if depth not in (0, 1):
            raise ValueError(f"host list {text!r}: nested or unbalanced brackets")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"host list {text!r}: a '[' is never closed")
    parts.append(text[start:])
    return parts


def _numbers(spec: str, whole: str) -> list[str]:
    """``01-03,07`` -> ``["01", "02", "03", "07"]``: each range keeps its lower bound's zero padding."""
    out = []
    for part in spec.split(","):
        m = _RANGE.match(part)
        if not m:
            raise ValueError(f"host list {whole!r}: {part!r} is not a number or a range like 01-04")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"host list {whole!r}: range {part!r} runs backwards")
        if int(hi) - int(lo) >= 100_000:
            raise ValueError(f"host list {whole!r}: range {part!r} names over 100000 hosts")
        width = len(lo) if lo.startswith("0") else 0
        out += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
    return out


def _expand_one(name: str, whole: str) -> list[str]:
    """One host pattern, each bracket group a choice (``r[1-2]n[1-2]`` is four hosts, as Slurm's)."""
    open_at = name.find("[")
    if open_at < 0:
        if "]" in name:
            raise ValueError(f"host list {whole!r}: a ']' without its '['")
        return [name]
    close_at = name.index("]", open_at)
    head, spec, tail = name[:open_at], name[open_at + 1:close_at], name[close_at + 1:]
    return [head + n + rest for n in _numbers(spec, whole) for rest in _expand_one(tail, whole)]


# --8<-- [start:hostnames]
def expand_hostlist(text: str) -> list[str]:
    """A Slurm host list, expanded as ``scontrol show hostnames`` does, in order.

    ``gpu[01-04,07]`` -> gpu01 gpu02 gpu03 gpu04 gpu07; ``a1,b[2-3]`` -> a1 b2 b3; ``n[8-10]`` -> n8 n9 n10.
    """
    text = text.strip()
    if not text:
        raise ValueError("host list is empty: is SLURM_JOB_NODELIST set?")
    return [host for item in _split_top(text) if item for host in _expand_one(item, text)]
# --8<-- [end:hostnames]


def tasks_per_node(text: str) -> list[int]:
    """``SLURM_STEP_TASKS_PER_NODE`` expanded: ``2(x3),1`` -> [2, 2, 2, 1] (one count per node, in order)."""
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ValueError(f"tasks per node {text!r}: expected counts like '2(x3),1'")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def master_port(job_id: str) -> int:
    """The rendezvous port every task of job ``job_id`` computes alike: 15000 + job id mod 20000."""
    if not job_id.isdigit():
        raise ValueError(f"SLURM_JOB_ID={job_id!r}: expected a number")
    return PORT_BASE + int(job_id) % PORT_SPAN


def _int(env, name: str) -> int:
    value = env.get(name, "")
    if not value.isdigit():
        raise ValueError(f"${name}={value!r}: srun sets it to a number in every task; is this an srun task?")
    return int(value)


def in_srun_task(env=None) -> bool:
    """Whether this process is a task that ``srun`` started (not the batch shell, not a torchrun worker).

    A job step's tasks carry ``SLURM_STEP_ID`` and ``SLURM_PROCID``; the batch script's shell has no step
    of its own and an ``salloc`` shell none at all; under ``srun torchrun`` the agent's workers carry
    ``RANK`` from torchrun, which wins.
    """
    env = os.environ if env is None else env
    return "SLURM_STEP_ID" in env and "SLURM_PROCID" in env and "RANK" not in env


# --8<-- [start:rank_environment]
def rank_environment(env=None) -> dict[str, str]:
    """torch.distributed's ``env://`` variables for this srun task, from Slurm's (module docstring)."""
    env = os.environ if env is None else env
    rank, world, local = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS"), _int(env, "SLURM_LOCALID")
    if not rank < world or local > rank:
        raise ValueError(f"SLURM_PROCID={rank}, SLURM_LOCALID={local}, SLURM_NTASKS={world}: not one task's view")
    hosts = expand_hostlist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", ""))
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    node = int(env.get("SLURM_NODEID", "0") or 0)
    counts = tasks_per_node(per_node) if per_node else [world]
    local_world = counts[node] if node < len(counts) else counts[-1]
    port = env.get("MASTER_PORT") or str(master_port(env.get("SLURM_JOB_ID", "")))
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(local_world), "MASTER_ADDR": env.get("MASTER_ADDR") or hosts[0],
            "MASTER_PORT": port}
# --8<-- [end:rank_environment]


# --8<-- [start:preemption]
class Preemption:
    """A preemption notice as a flag: the handler only records it; the training loop acts between steps.

    A signal may reach the ranks during different steps, so no rank acts on its own flag: after each step
    all ranks add theirs up (`agreed`, one all-reduce of one number) and stop together once any was set.
    """

    def __init__(self, signals=(signal.SIGUSR1,)):
        self.signum: int | None = None
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("Preemption(): signal handlers can only be installed from the main thread")
        self._old = {s: signal.signal(s, self._notice) for s in signals}

    def _notice(self, signum, frame) -> None:
        self.signum = self.signum or signum

    def agreed(self, group) -> bool:
        """True on every rank once any rank of ``group`` has had the notice (a collective: all ranks call it)."""
        from .. import comm
        return comm.any_rank(self.signum is not None, group)

    def close(self) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
# --8<-- [end:preemption]
