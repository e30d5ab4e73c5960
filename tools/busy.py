"""Run a command beside N busy loops: `python tools/busy.py N [--times K] -- CMD ...`.

Each loop is a process spinning on one core's worth of arithmetic, so on two cores four loops beside the
two test workers of `make test-load` make a load of about 6. The command runs K times in a row (default 1)
and the first failure stops; the loops are killed when it ends, however it ends (also on Ctrl-C). The load
average seen is printed after each run. Exit status: the command's.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import subprocess
import sys


def _spin() -> None:
    try:                                           # Linux: die with busy.py even if it is SIGKILLed
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="busy.py", usage="busy.py N [--times K] -- CMD ...",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("loops", type=int, help="busy processes to start (e.g. 4)")
    parser.add_argument("--times", type=int, default=1, help="run the command this many times in a row")
    args, cmd = parser.parse_args(argv[:cut]), argv[cut + 1:]
    if args.loops < 0 or args.times < 1 or not cmd:
        parser.error("give loops >= 0, --times >= 1 and a command after --")
    loops = [mp.get_context("fork").Process(target=_spin, daemon=True) for _ in range(args.loops)]
    running: list[subprocess.Popen] = []

    def stop(*_):                                                  # `kill`: end the command, then the loops
        for proc in running:
            proc.terminate()
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    try:
        for p in loops:
            p.start()
        for i in range(1, args.times + 1):
            running[:] = [subprocess.Popen(cmd)]
            rc = running[0].wait()
            load = " ".join(f"{x:.1f}" for x in os.getloadavg())
            print(f"busy.py: run {i} of {args.times} beside {args.loops} busy loops: exit {rc}, "
                  f"load average {load}", flush=True)
            if rc:
                return rc
        return 0
    finally:
        for p in loops:
            p.kill()
        for p in loops:
            p.join()


if __name__ == "__main__":
    sys.exit(main())
