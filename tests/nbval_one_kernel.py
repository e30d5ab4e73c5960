"""An nbval plugin (``-p nbval_one_kernel``): every notebook of one pytest run shares one Jupyter kernel, so the
kernel's start and its launcher's forkserver (each importing torch, seconds of CPU) are paid once per run, not once
per notebook. Between notebooks the kernel forgets the last one: its names (``%reset -f``), working folder,
environment variables, ``sys.path``, torch's default dtype, thread count and random state go back to what they were
when the kernel started. Each notebook's cells still run, and its checked outputs are still compared, by nbval."""
from nbval.plugin import IPyNbFile

_KERNEL = None
_RESET_TIMEOUT = 120

# Run once in a fresh kernel: what each later notebook starts from.
_SNAPSHOT = """
def _nbval_snapshot():
    import os, sys, torch
    return dict(os.environ), list(sys.path), torch.get_default_dtype(), torch.get_num_threads(), \\
        torch.random.get_rng_state()
import sys as _sys
_sys.modules['_nbval_start'] = type(_sys)('_nbval_start')     # a module: %reset -f keeps it
_sys.modules['_nbval_start'].state = _nbval_snapshot()
del _nbval_snapshot, _sys
"""

# Run before each later notebook.
_RESET = """
def _nbval_restore(cwd):
    import os, sys, torch
    env, path, dtype, threads, rng = sys.modules['_nbval_start'].state
    os.environ.clear(); os.environ.update(env)
    sys.path[:] = path
    torch.set_default_dtype(dtype); torch.set_num_threads(threads); torch.random.set_rng_state(rng)
    os.chdir(cwd)
_nbval_restore({cwd!r}); del _nbval_restore
get_ipython().run_line_magic('reset', '-f')
"""


def _run(kernel, code):
    msg_id = kernel.execute_cell_input(code, allow_stdin=False)
    while (reply := kernel.get_message(stream="shell", timeout=_RESET_TIMEOUT))["parent_header"].get("msg_id") \
            != msg_id:
        pass
    kernel.await_idle(msg_id, timeout=_RESET_TIMEOUT)        # and drain its output, so no notebook sees it
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"resetting the shared kernel failed: {reply['content'].get('evalue')}")


_first_setup = IPyNbFile.setup


def _setup(self):
    global _KERNEL
    if _KERNEL is None or not _KERNEL.is_alive():
        _first_setup(self)
        _KERNEL = self.kernel
        _run(_KERNEL, _SNAPSHOT)
        return
    self.kernel = _KERNEL
    self.setup_sanitize_files()
    _run(_KERNEL, _RESET.format(cwd=str(self.fspath.dirname)))


def _teardown(self):
    pass                        # the kernel outlives the notebook; pytest_unconfigure stops it


IPyNbFile.setup, IPyNbFile.teardown = _setup, _teardown


def pytest_unconfigure(config):
    global _KERNEL
    if _KERNEL is not None and _KERNEL.is_alive():
        _KERNEL.stop()
    _KERNEL = None
