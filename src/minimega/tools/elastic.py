"""Elastic restarts and fault injection for ``minimega train``: when a rank dies, start again from the latest
checkpoint, on fewer ranks if ``--min-nproc`` allows and the layout still validates (torchrun's elastic agent)."""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import Callable



FAULT_STEP_ENV = "MINIMEGA_FAULT_STEP"
"""Fault injection for tests and the lab: ``"<rank>:<step>"`` makes that rank SIGKILL itself once it has
finished that step, on the first attempt only (``MINIMEGA_RESTART_COUNT`` = 0), as a lost node would."""
FAULT_NAN_ENV = "MINIMEGA_FAULT_NAN_BATCH"
"""Fault injection for tests and the lab: ``"<batch>"`` makes every token embedding NaN while the batch of that
index is trained on (every rank, first attempt only), as a corrupt batch would: the loss and every gradient
turn NaN."""
FAULT_SLOW_ENV = "MINIMEGA_FAULT_SLOW"
"""Fault injection for tests and the lab: ``"<rank>:<factor>"`` makes that rank sleep (factor - 1) times each
step's duration after the step, as a slow node would (a straggler: its peers wait for it)."""
RESTART_ENV = "MINIMEGA_RESTART_COUNT"
"""Which attempt this is (0 first); set by ``minimega train`` for its ranks, like torchrun's
TORCHELASTIC_RESTART_COUNT."""


def maybe_fault(rank: int, step: int) -> None:
    spec = os.environ.get(FAULT_STEP_ENV)
    if not spec or os.environ.get(RESTART_ENV, "0") != "0":
        return
    try:
        fault_rank, fault_step = (int(v) for v in spec.split(":"))
    except ValueError:
        raise ValueError(f"{FAULT_STEP_ENV}={spec!r}: expected '<rank>:<step>', e.g. '1:7'") from None
    if (rank, step) == (fault_rank, fault_step):
        sys.stdout.flush(), sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def maybe_poison(modules, batch: int):
    """Under ``MINIMEGA_FAULT_NAN_BATCH=<batch>``: a context in which the token embeddings of ``modules`` output
    NaN (none outside it, and none for other batches)."""
    from contextlib import ExitStack
    stack = ExitStack()
    spec = os.environ.get(FAULT_NAN_ENV)
    if not spec or os.environ.get(RESTART_ENV, "0") != "0":
        return stack
    if not spec.isdigit():
        raise ValueError(f"{FAULT_NAN_ENV}={spec!r}: expected a batch index, e.g. '6'")
    if int(spec) == batch:
        for module in modules:
            for name, m in module.named_modules():
                if name.split(".")[-1] == "wte":
                    stack.callback(m.register_forward_hook(lambda mod, inp, out: out * float("nan")).remove)
    return stack


def maybe_slow(rank: int, step_seconds: float) -> None:
    spec = os.environ.get(FAULT_SLOW_ENV)
    if not spec:
        return
    try:
        slow_rank, factor = spec.split(":")
        slow_rank, factor = int(slow_rank), float(factor)
    except ValueError:
        raise ValueError(f"{FAULT_SLOW_ENV}={spec!r}: expected '<rank>:<factor>', e.g. '1:3'") from None
    if rank == slow_rank and factor > 1:
        time.sleep((factor - 1) * step_seconds)


def checkpoint_step(directory, model_config=None) -> int:
    """The step of the checkpoint in ``directory``, after every check a launcher can make before any rank
    starts (`checkpoint.checked`: the manifest, bounded, against ``model_config``; every shard a regular file
    whose header agrees): a hostile checkpoint is refused here in one line, not by a rank stuck in a read.
    The sha256 of the files is left to the ranks' load (split over them)."""
    from .. import checkpoint                     # torch: loaded by a run, never by `minimega --help`
    return checkpoint.checked(directory, verify_files=False, model_config=model_config)[1]["step"]


def shrink(nproc: int, lost: int, min_nproc: int, fits: Callable[[int], bool]) -> int | None:
    """The largest world size without the lost ranks that is >= min_nproc and that `fits` accepts (the
    engine's `validate` on that world: every divisibility, batch and pipeline check). None if there is none."""
    for n in range(nproc - lost, min_nproc - 1, -1):
        if fits(n):
            return n
    return None


# --8<-- [start:elastic]
def run_elastic(start: Callable[[int, dict], list], nproc: int, ckpt: dict, *, max_restarts: int, min_nproc: int,
                fits: Callable[[int], bool], model_config=None) -> list:
    """Launch; when a rank dies, relaunch from the latest complete checkpoint, as torchrun's elastic agent does.

    Every attempt is a fresh job (``start(nproc, ckpt)``): new processes, a new process group, the state read
    back from disk. A failed rank's slot is dropped only if ``min_nproc`` allows it (torchrun's
    ``--nnodes=MIN:MAX``: a lost node does not come back) and a smaller world `fits`; the checkpoint reshards
    onto it on load.
    """
    from .. import checkpoint
    from ..run.launch import LaunchTimeout, WorkerError
    attempt = 0
    ckpt["restarts"] = []
    saved = os.environ.get(RESTART_ENV)
    while True:
        os.environ[RESTART_ENV] = str(attempt)        # the ranks get the launcher's environment as it is now
        try:
            return start(nproc, ckpt)
        except WorkerError as err:
            if attempt >= max_restarts:
                raise
            attempt += 1
            latest = checkpoint.resolve_or_none(ckpt["dir"])
            resume_step = checkpoint_step(latest, model_config) if latest else 0
            if nproc > min_nproc:
                nproc = shrink(nproc, 1, min_nproc, fits) or nproc
            failed_at = err.step if err.step is not None else resume_step
            why = str(err).splitlines()[0]
            event = {"attempt": attempt, "rank": err.rank, "step": failed_at, "resume_step": resume_step,
                     "redone": max(0, failed_at - resume_step), "nproc": nproc,
                     "watchdog": isinstance(err, LaunchTimeout), "error": why}
            ckpt["restarts"].append(event)
            print(f"\nminimega train: restart {attempt}/{max_restarts}: rank {err.rank} failed at step "
                  f"{failed_at} ({why}); resuming on {nproc} rank(s) from "
                  + (f"the checkpoint at step {resume_step}" if latest else "step 0 (no checkpoint yet)")
                  + f": {event['redone']} step(s) redone", file=sys.stderr, flush=True)
            ckpt["resume"] = str(latest) if latest else None
        finally:
            if saved is None:
                os.environ.pop(RESTART_ENV, None)
            else:
                os.environ[RESTART_ENV] = saved
# --8<-- [end:elastic]
