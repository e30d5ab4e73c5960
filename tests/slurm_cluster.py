"""A one-host Slurm cluster for the tests: munged with a generated key, slurmctld and slurmd with a generated
slurm.conf, every state, spool, log and socket path in one temporary directory, on free ports.

`start(root)` returns a `Cluster` whose ``env`` points ``srun``, ``scancel`` and ``scontrol`` at it
(``SLURM_CONF``); `Cluster.stop()` kills the three daemons (by their pids) and waits for them. Where the
daemons are missing, or will not start (no root, no munge), `start` raises `Unavailable` with the reason.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "scontrol", "scancel")


class Unavailable(RuntimeError):
    """Slurm cannot be brought up here; the message says why."""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _which(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin")
    if path is None:
        raise Unavailable(f"{name} is not installed (apt-get install slurm-wlm munge)")
    return path


@dataclass
class Cluster:
    root: Path
    env: dict
    node: str
    procs: list = field(default_factory=list)

    def steps(self) -> list[Path]:
        """The sockets of the job steps slurmd still runs (one ``<node>_<job>.<step>`` per slurmstepd)."""
        spool = self.root / "spool"
        return [p for p in spool.glob(f"{self.node}_*") if p.is_socket()] if spool.exists() else []

    def stepd_pids(self) -> list[int]:
        """The slurmstepd processes serving this cluster's steps: the holders of their sockets (/proc/net/unix)."""
        paths = {str(p) for p in self.steps()}
        inodes = set()
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 8 and parts[7] in paths:
                inodes.add(f"socket:[{parts[6]}]")
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                    pids.append(int(proc.name))
            except OSError:
                continue
        return pids

    def stop(self) -> None:
        deadline = time.monotonic() + 10
        while self.steps() and time.monotonic() < deadline:     # let finished steps report before slurmd goes
            time.sleep(0.1)
        for pid in self.stepd_pids():                           # a step still running: end it, by its pid
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in reversed(self.procs):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def _conf(root: Path, node: str, ctld_port: int, slurmd_port: int, munge_socket: Path) -> str:
    return "\n".join([
        "ClusterName=minimega", f"SlurmctldHost={node}", f"SlurmctldPort={ctld_port}", f"SlurmdPort={slurmd_port}",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={munge_socket},cred_expire=10",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SwitchType=switch/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "SchedulerType=sched/builtin",
        "SchedulerParameters=sched_interval=1",   # a requeued job starts as soon as its begin time passes
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none", "SlurmUser=root", "SlurmdUser=root", "ReturnToService=2",
        f"StateSaveLocation={root / 'ctld'}", f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}", f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}", f"SlurmdLogFile={root / 'slurmd.log'}",
        "SlurmctldDebug=info", "SlurmdDebug=info", "KillWait=5", "InactiveLimit=0", "MinJobAge=60",
        "SlurmctldTimeout=30", "SlurmdTimeout=30", "MessageTimeout=20",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES", ""])


def start(root: Path, timeout: float = 30.0) -> Cluster:
    """Bring the cluster up under ``root``; raise `Unavailable` (saying why) if it cannot be."""
    if os.geteuid() != 0:
        raise Unavailable("the test cluster runs its daemons as root (SlurmdUser=root); not root here")
    exe = {name: _which(name) for name in DAEMONS}
    root.mkdir(parents=True, exist_ok=True)
    for d in ("ctld", "spool", "munge"):
        (root / d).mkdir(exist_ok=True)
    os.chmod(root / "munge", 0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    munge_socket = root / "munge" / "munge.socket"
    node = socket.gethostname().split(".")[0]
    ctld_port, slurmd_port = _free_ports(2)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, node, ctld_port, slurmd_port, munge_socket))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for name in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) and k != "SLURM_CONF"]:
        del env[name]                                   # a test run inside a Slurm job talks to this cluster only
    cluster = Cluster(root, env, node)
    try:
        cluster.procs.append(subprocess.Popen(
            [exe["munged"], "-F", "--force", f"--socket={munge_socket}", f"--key-file={key}",
             f"--pid-file={root / 'munge' / 'munged.pid'}", f"--log-file={root / 'munged.log'}",
             f"--seed-file={root / 'munge' / 'munged.seed'}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait(lambda: munge_socket.exists(), timeout, "munged did not open its socket", cluster, "munged")
        for daemon in ("slurmctld", "slurmd"):
            cluster.procs.append(subprocess.Popen([exe[daemon], "-D"], env=env, stdout=subprocess.DEVNULL,
                                                  stderr=subprocess.DEVNULL))
        _wait(lambda: _node_idle(exe["scontrol"], env, node), timeout, "the node never became idle", cluster,
              "slurmctld", "slurmd")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _node_idle(scontrol: str, env: dict, node: str) -> bool:
    out = subprocess.run([scontrol, "show", "node", node], env=env, capture_output=True, text=True)
    return out.returncode == 0 and "State=IDLE" in out.stdout


def _wait(ready, timeout: float, what: str, cluster: Cluster, *logs: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        dead = [p for p in cluster.procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            tails = "; ".join(f"{n}: {cluster.log(n)[-400:]!r}" for n in logs)
            raise Unavailable(f"{what} ({'a daemon exited' if dead else f'{timeout:g} s'}; {tails})")
        time.sleep(0.1)
