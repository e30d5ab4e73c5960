"""minimega.run.launch: results in rank order, failures named by rank, no hangs, no orphans, clear refusals."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import minimega as mm
from minimega.run import processes


def _rank_info(tag):
    return (tag, dist.get_rank(), dist.get_world_size(), torch.get_num_threads())


def _raise_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError("boom on rank 1")
    t = torch.ones(1)
    dist.all_reduce(t)                      # rank 0 waits here for a peer that never comes
    return t.item()


def _die_on_rank_1(pid_dir, how):
    Path(pid_dir, f"pid-{dist.get_rank()}").write_text(str(os.getpid()))
    if dist.get_rank() == 1:
        time.sleep(0.3)
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))          # blocks: rank 1 never joins
    time.sleep(60)


def _world():
    return mm.comm.Group(dist.group.WORLD, list(range(dist.get_world_size())), "world")


def _deadlock():
    """Rank 0 waits in an all-reduce that rank 1, stuck elsewhere, never joins."""
    if dist.get_rank() == 1:
        time.sleep(120)
    mm.comm.all_reduce(torch.ones(1), _world())


def _stop_rank_1(pid_dir):
    """Both ranks all-reduce in a loop; rank 1 SIGSTOPs itself after its third."""
    Path(pid_dir, f"pid-{dist.get_rank()}").write_text(str(os.getpid()))
    for i in range(10_000):
        mm.comm.all_reduce(torch.ones(1), _world())
        if dist.get_rank() == 1 and i == 2:
            os.kill(os.getpid(), signal.SIGSTOP)


def _mismatch():
    t = torch.ones(4)
    if dist.get_rank() == 0:
        mm.comm.all_reduce(t, _world())
    else:
        mm.comm.broadcast(t, 1, _world())
    mm.comm.all_reduce(t, _world())


def _environment(names):
    return {n: os.environ.get(n) for n in names} | {"ppid": os.getppid()}


def test_results_in_rank_order():
    out = mm.launch(_rank_info, 3, "hello", timeout=60)
    assert [o[:3] for o in out] == [("hello", r, 3) for r in range(3)]
    assert all(o[3] >= 1 for o in out)


def test_world_size_one_runs_in_a_group_of_one():
    assert mm.launch(_rank_info, 1, "x", timeout=60)[0][:3] == ("x", 0, 1)


def test_exception_names_rank_and_carries_traceback():
    with pytest.raises(mm.WorkerError) as err:
        mm.launch(_raise_on_rank_1, 2, timeout=60)
    assert err.value.rank == 1
    msg = str(err.value)
    assert msg.startswith("rank 1 of 2 failed with ValueError: boom on rank 1")
    assert "_raise_on_rank_1" in msg and "Traceback" in msg      # the worker's own traceback


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:                                     # a zombie awaiting its reaper also counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("how, expect", [("exit", "exited with code 3"), ("signal", "killed by signal SIGKILL")])
def test_dead_rank_fails_fast_without_orphans(tmp_path, how, expect):
    job_s = _job_seconds()
    start = time.monotonic()
    with pytest.raises(mm.WorkerError) as err:
        mm.launch(_die_on_rank_1, 2, str(tmp_path), how, timeout=60)
    took = time.monotonic() - start
    print(f"dead rank ({how}) ended the job in {took:.2f} s; a trivial job takes {job_s:.2f} s")
    assert took < 0.3 + 5 * job_s, (took, job_s)            # rank 1 lives 0.3 s; the watchdog's 60 s is far off
    assert err.value.rank == 1 and expect in str(err.value)
    pids = [int(p.read_text()) for p in tmp_path.glob("pid-*")]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids), "a rank outlived the failed job"


def _warm():
    """Start the forkserver before a test times a job (its first start imports torch: seconds)."""
    mm.launch(_rank_info, 1, "warm", timeout=60)


def _job_seconds() -> float:
    """The run's own baseline, taken just before a timed job: seconds a trivial two-rank job takes now, start
    to result, with the forkserver warm. Bounds in these units hold on a loaded machine (where every start,
    poll and exit is slower alike) and still catch a watchdog or failure path that is late by whole seconds."""
    _warm()
    start = time.monotonic()
    mm.launch(_rank_info, 2, "baseline", timeout=60)
    return time.monotonic() - start


def test_watchdog_names_the_rank_that_never_joined():
    job_s = _job_seconds()
    start = time.monotonic()
    with pytest.raises(mm.LaunchTimeout) as err:
        mm.launch(_deadlock, 2, timeout=3)
    took = time.monotonic() - start
    print(f"watchdog (timeout 3 s) ended the job in {took:.2f} s; a trivial job takes {job_s:.2f} s")
    assert took < 3 + 4 * job_s, (took, job_s)
    msg = str(err.value)
    assert err.value.rank == 1 and msg.startswith("watchdog: rank 1 of 2 never joined"), msg
    assert "rank 0 waited" in msg and "all_reduce#1 (group world)" in msg, msg


def test_watchdog_names_a_stopped_rank_and_its_last_collective(tmp_path):
    job_s = _job_seconds()
    start = time.monotonic()
    with pytest.raises(mm.LaunchTimeout) as err:
        mm.launch(_stop_rank_1, 2, str(tmp_path), timeout=3)
    took = time.monotonic() - start
    print(f"watchdog (timeout 3 s) ended the job in {took:.2f} s; a trivial job takes {job_s:.2f} s")
    assert took < 3 + 4 * job_s, (took, job_s)
    msg = str(err.value)
    assert err.value.rank == 1 and msg.startswith("watchdog: rank 1 of 2 stopped responding"), msg
    assert "process state: stopped" in msg and "all_reduce#3 (group world)" in msg, msg
    pids = [int(p.read_text()) for p in tmp_path.glob("pid-*")]
    assert len(pids) == 2 and all(_gone(p) for p in pids), "a stopped rank outlived the job"


def test_watchdog_names_mismatched_collectives():
    job_s = _job_seconds()
    start = time.monotonic()
    with pytest.raises(mm.WorkerError) as err:
        mm.launch(_mismatch, 2, timeout=3)
    took = time.monotonic() - start
    print(f"mismatched collectives (timeout 3 s) ended the job in {took:.2f} s; a trivial job takes {job_s:.2f} s")
    assert took < 3 + 4 * job_s, (took, job_s)
    msg = str(err.value)
    assert "entered a different collective" in msg and "broadcast#1" in msg and "all_reduce#1" in msg, msg


def test_bad_input_is_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="world_size must be an integer >= 1, got 0"):
        mm.launch(_rank_info, 0)
    with pytest.raises(TypeError, match="lambdas and nested functions cannot be pickled"):
        mm.launch(lambda: 1, 2)

    def local():
        return 1
    with pytest.raises(TypeError, match="Define the worker at module level"):
        mm.launch(local, 2)
    with pytest.raises(TypeError, match="cannot pickle the arguments"):
        mm.launch(_rank_info, 2, threading.Lock())
    with pytest.raises(ValueError, match="backend='nccl' needs one GPU per rank"):
        if torch.cuda.device_count() >= 64:
            pytest.skip("this machine has 64 GPUs")
        mm.launch(_rank_info, 64, "x", backend="nccl")


def test_notebook_function_gets_a_clear_error():
    code = ("import minimega as mm\n"
            "def work():\n    return 1\n"
            "try:\n    mm.launch(work, 2)\nexcept TypeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "notebook cell or an interactive session" in out.stdout, out.stderr


def test_worker_in_a_guarded_script(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import torch.distributed as dist\nimport minimega as mm\n"
        "def work(x):\n    return x * 10 + dist.get_rank()\n"
        "if __name__ == '__main__':\n    print(mm.launch(work, 2, 4, timeout=60))\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "[40, 41]" in out.stdout, out.stderr[-2000:]


# ------------------------------------------------------------------------------------------------
# The job dies with its launcher; the forkserver follows its caller.

def _report_pid_and_work(pid_dir):
    Path(pid_dir, f"pid-{dist.get_rank()}").write_text(str(os.getpid()))
    while True:                              # computing and communicating, as a training job does
        mm.comm.all_reduce(torch.randn(1000), _world())
        time.sleep(0.01)


def test_killing_the_launcher_ends_every_rank(tmp_path):
    """SIGKILL or SIGTERM of the launching script: no rank is alive 5 s later (Ctrl-C: KeyboardInterrupt
    unwinds through launch(), which stops the ranks)."""
    script = tmp_path / "job.py"
    script.write_text("import sys, minimega as mm\nfrom test_launch import _report_pid_and_work\n"
                      "if __name__ == '__main__':\n    mm.launch(_report_pid_and_work, 2, sys.argv[1], timeout=60)\n")
    # the launchers' work directories go here: short, as a forkserver's AF_UNIX socket path is at most 107 bytes
    # (pytest-xdist's tmp_path, /tmp/pytest-of-root/pytest-N/popen-gwK/test_killing_the_launcher_ends0/, is too long)
    scratch = Path(tempfile.mkdtemp(prefix="mm-kill-", dir="/tmp"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path]),
           "TMPDIR": str(scratch)}
    jobs = {}
    for sig in (signal.SIGKILL, signal.SIGTERM):
        pid_dir = tmp_path / sig.name
        pid_dir.mkdir()
        jobs[sig] = (pid_dir, subprocess.Popen([sys.executable, str(script), str(pid_dir)], env=env,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    deadline = time.monotonic() + 120
    while not all(len(list(d.glob("pid-*"))) == 2 for d, _ in jobs.values()) and time.monotonic() < deadline:
        assert all(p.poll() is None for _, p in jobs.values()), [p.stderr.read() for _, p in jobs.values()]
        time.sleep(0.1)
    ranks = {sig: [int(f.read_text()) for f in d.glob("pid-*")] for sig, (d, _) in jobs.items()}
    if not all(len(r) == 2 for r in ranks.values()):
        for _, launcher in jobs.values():        # a launcher still starting must not outlive the test
            launcher.terminate()
            launcher.wait(30)
        pytest.fail(f"the ranks never started within 120 s: {ranks}")
    for sig, (_, launcher) in jobs.items():
        launcher.send_signal(sig)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(_gone(p) for pids in ranks.values() for p in pids):
        time.sleep(0.1)
    alive = {sig.name: [p for p in pids if not _gone(p)] for sig, pids in ranks.items()}
    for _, launcher in jobs.values():
        launcher.wait(30)
        launcher.stderr.close()
    for pids in alive.values():                  # clean up before asserting
        for p in pids:
            os.kill(p, signal.SIGKILL)
    assert not any(alive.values()), f"ranks alive 5 s after their launcher got the signal: {alive}"
    left = [p.name for p in scratch.iterdir() if p.name.startswith("minimega-")]
    shutil.rmtree(scratch, ignore_errors=True)
    assert not left, f"work directories left behind by the dead launchers: {left}"


def _forkserver_pid():
    from multiprocessing import forkserver
    return forkserver._forkserver._forkserver_pid


def test_environment_set_after_the_first_launch_reaches_the_ranks(monkeypatch):
    processes.stop_forkserver()                          # a forkserver started with OLD set ...
    monkeypatch.setenv("MINIMEGA_TEST_OLD", "1")
    names = ["MINIMEGA_TEST_OLD", "MINIMEGA_TEST_NEW"]
    assert mm.launch(_environment, 1, names, timeout=60)[0]["MINIMEGA_TEST_OLD"] == "1"
    monkeypatch.delenv("MINIMEGA_TEST_OLD")                   # ... then the caller's environment changes
    monkeypatch.setenv("MINIMEGA_TEST_NEW", "after the first launch")
    out = mm.launch(_environment, 2, names, timeout=60)
    assert [{n: o[n] for n in names} for o in out] == [{"MINIMEGA_TEST_OLD": None,
                                                       "MINIMEGA_TEST_NEW": "after the first launch"}] * 2


def _zb_step_faults(steps=6):
    """Minor page faults of each ZB-H1 step (pp 2), this rank: memory the kernel had to hand out again."""
    import resource
    from minimega import data
    mesh = mm.init_mesh(mm.ParallelDims(pp=2))
    torch.manual_seed(0)
    model = mm.GPT(mm.GPTConfig(vocab_size=256, block_size=128, n_layer=4, n_head=4, n_embd=256))
    engine = mm.initialize(model, mm.TrainConfig(pp=2, micro_batches=4, schedule="zb_h1", batch_size=8,
                                                 memory_peak_steps=0), mesh)
    faults = []
    for batch in data.batches(mesh, steps, 8, 128):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        engine.train_step(batch)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return faults


def test_a_rank_reuses_the_memory_its_last_step_freed(monkeypatch):
    """`processes.keep_freed_memory`: once warm, a ZB-H1 step (gradients kept from B to W) allocates from what
    the last step freed; under glibc's own policy (kept for comparison) freed blocks go back to the kernel and
    come back as fresh page faults."""
    def warm_faults():                              # the last three steps, both ranks
        return sum(sum(f[3:]) for f in mm.launch(_zb_step_faults, 2, timeout=120))
    kept = warm_faults()
    monkeypatch.setenv("MINIMEGA_MALLOC", "glibc")
    glibc = warm_faults()
    assert kept * 4 < glibc, (kept, glibc)          # measured: ~300-900 against ~13,500-16,000


def test_an_allocator_policy_it_does_not_know_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("MINIMEGA_MALLOC", "jemalloc")
    with pytest.raises(ValueError, match="MINIMEGA_MALLOC='jemalloc': the one value is 'glibc'"):
        mm.launch(_rank_info, 2, "x", timeout=60)             # in the caller, before any rank starts


def test_an_edited_source_or_a_dead_forkserver_starts_a_fresh_one(monkeypatch):
    """Two fresh forkservers (each imports torch: seconds of CPU), no more: one for a dead forkserver, one for an
    edit; a forkserver that dies while ranks start is retried (with its restart stubbed: the edit proves it)."""
    first = mm.launch(_environment, 1, [], timeout=60)[0]["ppid"]
    assert first == _forkserver_pid()
    os.kill(first, signal.SIGKILL)                            # a forkserver killed between two jobs
    time.sleep(0.2)
    second = mm.launch(_environment, 1, [], timeout=60)[0]["ppid"]
    assert second != first and second == _forkserver_pid()
    # An edit to minimega: a newer stamp (seen by this process only: touching the real file would restart the
    # forkserver of every other test process too, twice), then the same code again: the edit's forkserver stays.
    newest = processes.source_stamp()
    assert newest == max(p.stat().st_mtime for p in Path(mm.__file__).parent.rglob("*.py"))
    monkeypatch.setattr(processes, "_SOURCE_STAMP", newest)          # what the next test's launch will see again
    monkeypatch.setattr(processes, "source_stamp", lambda: newest + 10)
    third = mm.launch(_environment, 1, [], timeout=60)[0]["ppid"]
    assert third not in (first, second) and third == _forkserver_pid()
    from multiprocessing import forkserver                    # one dying while ranks start: retried once
    launch_module = sys.modules["minimega.run.launch"]
    real, calls, restarts = forkserver.read_signed, [], []
    monkeypatch.setattr(launch_module, "stop_forkserver", lambda: restarts.append(1))

    def dies_once(fd):
        calls.append(fd)
        if len(calls) == 1:
            raise EOFError
        return real(fd)
    monkeypatch.setattr(forkserver, "read_signed", dies_once)
    assert len(mm.launch(_environment, 2, [], timeout=60)) == 2 and len(calls) > 1 and restarts == [1]
    monkeypatch.setattr(forkserver, "read_signed", lambda fd: (_ for _ in ()).throw(EOFError()))
    with pytest.raises(RuntimeError, match=r"^launch\(\): could not start the ranks: the forkserver died while "
                                           r"starting them, twice \(EOFError"):
        mm.launch(_environment, 2, [], timeout=60)             # dying every time: one line, no EOFError
    assert restarts == [1, 1]


def test_a_peer_that_closed_the_connection_is_not_taken_for_the_first_failure():
    """Under load rank 0's "connection closed by peer" can reach the launcher before rank 1's own timeout, which
    caused it; the verdict must still come from rank 1's (the mismatched collectives), not from rank 0's echo."""
    from minimega.run.launch import _raise_failure
    now = time.monotonic()
    snaps = [{"rank": r, "heartbeat": now, "count": 1, "waiting": now - 3.5, "step": -1, "op": op, "group": "world",
              "alive": False, "pid": 0, "exitcode": 1, "state": ""}
             for r, op in ((0, "all_reduce"), (1, "broadcast"))]
    failures = [{"rank": 0, "hard": False, "time": now - 0.2, "type": "RuntimeError", "traceback": "",
                 "message": "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:39069."},
                {"rank": 1, "hard": False, "time": now - 0.1, "type": "RuntimeError", "traceback": "",
                 "message": "[gloo/transport/tcp/pair.cc:598] Timed out waiting 3000ms for recv operation to complete"}]
    with pytest.raises(mm.WorkerError) as err:
        _raise_failure(failures, 2, snaps, 3.0, now - 5)
    msg = str(err.value)
    assert "entered a different collective" in msg and "broadcast#1" in msg and "all_reduce#1" in msg, msg
