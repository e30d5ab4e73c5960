"""What `import minimega` and `minimega.initialize` really load: the modules in `sys.modules` afterwards, not the
source's import edges (a name imported on first use shows only when it is used).

A training rank loads the core and nothing above it: no estimator (`minimega.analysis`, `minimega.estimate`), no
figure, no classroom; and of the core's optional features only those its config enables (fp8, the NVMe tier,
mixtures of experts, the trace, the health monitor). The load closure, the lines of every minimega module loaded,
stays within what one can read: at most 8,500 lines for a plain DDP engine.
"""
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
OPTIONAL = {"fp8": "minimega.train.fp8", "nvme": "minimega.zero.nvme", "moe": "minimega.parallel.moe.layer",
            "trace": "minimega.run.trace", "health": "minimega.train.health",
            "fp8 ZeRO-3": "minimega.zero.fp8_gather"}

# One fresh interpreter imports minimega and torch (seconds of CPU); each config is measured in a fork of it, so
# what one engine loaded never shows in another's modules.
_SCRIPT = """
import json, os, sys, traceback
import minimega as mm, torch, torch.distributed as dist
for config, port in zip(json.loads(sys.argv[1]), sys.argv[2:]):
    pid = os.fork()
    if pid:
        if os.waitpid(pid, 0)[1]:
            sys.exit(f"the fork for {config} failed")
        continue
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        dist.init_process_group("gloo", rank=0, world_size=1)
        mesh = mm.init_mesh(mm.ParallelDims(dp=1))
        engine = mm.initialize(mm.GPT(mm.GPTConfig.tiny()), mm.TrainConfig(**config), mesh)
        mods = {m: getattr(sys.modules[m], "__file__", None) for m in sys.modules if m.startswith("minimega")}
        lines = sum(sum(1 for _ in open(f)) for f in mods.values() if f and f.endswith(".py"))
        print(json.dumps({"modules": sorted(mods), "lines": lines}), flush=True)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)
"""
FP8 = {"zero_stage": 1, "precision": "fp8"}


def _loaded(configs: list[dict], ports: list[int]) -> list[dict]:
    out = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(configs), *map(str, ports)], capture_output=True,
                         text=True, timeout=240, env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    reports = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == len(configs), (out.stdout[-2000:], out.stderr[-2000:])
    return reports


@pytest.fixture(scope="module")
def loaded():
    return dict(zip(("plain", "fp8"), _loaded([{}, FP8], [29731, 29732])))


def test_initialize_loads_no_analysis_and_reads_in_8500_lines(loaded):
    plain = loaded["plain"]
    above = [m for m in plain["modules"] if m.split(".")[1:2] and m.split(".")[1] in
             ("analysis", "estimate", "figures", "classroom", "tools")]
    assert above == [], f"a training rank loaded {above}"
    assert plain["lines"] <= 8500, f"the engine's load closure is {plain['lines']} lines"


def test_optional_features_load_only_when_enabled(loaded):
    plain, fp8 = loaded["plain"], loaded["fp8"]
    assert [name for name, module in OPTIONAL.items() if module in plain["modules"]] == []
    assert OPTIONAL["fp8"] in fp8["modules"] and OPTIONAL["moe"] not in fp8["modules"]


def test_train_step_reads_in_30_lines():
    """The step is the step: shard, micro-steps, clip, step, zero; what watches it is an observer."""
    from minimega.train.engine import Engine
    lines = inspect.getsource(Engine.train_step).splitlines()
    assert len(lines) <= 30, f"Engine.train_step is {len(lines)} lines"
