"""Running a job: starting the ranks, watching them, and measuring what they do.

    launch.py     `launch(fn, world_size, ...)`: ranks forked from a forkserver; errors name the rank
    processes.py  the forkserver, and processes that die with their parent
    watchdog.py   heartbeats: a stopped rank and its last collective are named, the job brought down
    trace.py      a Chrome/Perfetto trace of a run
    measure.py    `PeakTracker` (peak bytes by category) and bytes on the wire
"""
