"""The NCCL path: the same code with another backend and device. Every test here needs CUDA (marked ``gpu``,
run by `bench/gpu.sh`); the CUDA-event timing itself is checked on CPU in `test_cuda_timeline.py`."""
import pytest
import torch

import minimega as mm
from parity import max_rel_error, parity_config, reference_run
from test_data_parallel import MODEL, STEPS, _ours


@pytest.mark.gpu
def test_auto_backend_picks_nccl_with_one_gpu_per_rank():
    world = min(2, torch.cuda.device_count())
    from minimega.run.launch import resolve_backend
    assert resolve_backend("auto", world) == "nccl"


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_ddp_on_nccl_matches_single_process():
    config = parity_config(bucket_mb=0.05)
    ref, _ = reference_run(MODEL, config, STEPS, seq_len=32)
    ours, *_ = mm.launch(_ours, 2, config, timeout=300)[0]
    assert max_rel_error(ours, ref) <= 1e-4        # TF32/cuBLAS kernels differ from the CPU reference


@pytest.mark.gpu
def test_model_forward_on_gpu_matches_cpu():
    torch.manual_seed(0)
    model = mm.GPT(MODEL)
    x = torch.randint(0, 256, (2, 32))
    cpu = model(x, x)[1].item()
    gpu = model.cuda()(x.cuda(), x.cuda())[1].item()
    assert abs(gpu - cpu) < 1e-4
