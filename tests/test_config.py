"""TrainConfig validation and the DeepSpeed JSON reader: clear errors before any rank starts."""
import json

import pytest

import minimega as mm


def test_from_deepspeed_reads_supported_keys(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({
        "train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.99]}},
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e5}, "bf16": {"enabled": True}}))
    cfg = mm.TrainConfig.from_deepspeed(path, dp=2, tp=1)
    assert (cfg.batch_size, cfg.gradient_accumulation_steps, cfg.zero_stage, cfg.precision, cfg.lr, cfg.betas) == \
        (16, 2, 2, "bf16", 3e-4, (0.9, 0.99))
    assert cfg.bucket_mb == pytest.approx(5e5 * 4 / 2**20)


@pytest.mark.parametrize("config, message", [
    ({"zero_optimization": {"stage": 2, "sub_group_size": 1}}, "unsupported key.*zero_optimization.sub_group_size"),
    ({"amp": {}}, r"unsupported key\(s\) amp"),
    ({"zero_optimization": {"stage": 4}}, "zero_stage must be 0, 1, 2 or 3, got 4"),
    ({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}}, "offload_optimizer needs zero_stage >= 1"),
    ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4}, r"train_batch_size=10 != .* = 4 \* 1 \* 2 = 8"),
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "fp16 and bf16 are both enabled"),
    ({"optimizer": {"type": "Lamb"}}, "optimizer.type='Lamb'"),
])
def test_from_deepspeed_rejects_bad_input_by_name(config, message):
    with pytest.raises(ValueError, match=message):
        mm.TrainConfig.from_deepspeed(config, dp=2)


def test_train_config_checks():
    with pytest.raises(ValueError, match="precision='fp8'"):
        mm.TrainConfig(precision="fp8")
    with pytest.raises(ValueError, match="sequence_parallel needs tp > 1"):
        mm.TrainConfig(sequence_parallel=True)
    with pytest.raises(ValueError, match=r"batch_size=6 is not divisible by dp \* gradient_accumulation_steps = 2 \* 2 = 4"):
        mm.TrainConfig(batch_size=6, gradient_accumulation_steps=2).rows_per_micro_step(2)
    with pytest.raises(ValueError, match="has no field"):
        mm.TrainConfig.from_deepspeed({}, tpp=2)
