"""measure.py's tensor-by-tensor counts agree with torch's own MemTracker (single process, stage 0)."""
import torch
from torch.distributed._tools.mem_tracker import MemTracker

import minimega as mm
from minimega import data, measure
from minimega.engine import make_optimizer


def test_model_state_bytes_equal_torch_memtracker():
    torch.manual_seed(0)
    model = mm.GPT(mm.GPTConfig.tiny())
    opt = make_optimizer(model.parameters(), mm.TrainConfig())
    x, y = data.global_batch(0, 4, 32)

    def step():
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    step()                                   # Adam's states exist from here on
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        step()
    peak = {str(k).split(".")[-1]: v for k, v in tracker.get_tracker_snapshot("peak")[torch.device("cpu")].items()}
    ours = measure.model_state_bytes(model, opt)
    psi = model.num_params()
    assert ours["params"] == peak["PARAM"] == 4 * psi
    assert ours["grads"] == peak["GRAD"] == 4 * psi
    assert ours["optimizer_states"] + ours["optimizer_step_counters"] == peak["OPT"]
    assert ours["optimizer_states"] == 8 * psi
