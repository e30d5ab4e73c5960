"""TrainConfig validation and the DeepSpeed JSON reader: clear errors before any rank starts."""
import dataclasses
import json
import math
import typing

import pytest

import minimega as mm


def test_from_deepspeed_reads_supported_keys(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({
        "train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.99]}},
        "zero_optimization": {"stage": 2, "overlap_comm": False}, "bf16": {"enabled": True}}))
    cfg = mm.TrainConfig.from_deepspeed(path, dp=2, tp=1)
    assert (cfg.batch_size, cfg.gradient_accumulation_steps, cfg.zero_stage, cfg.precision, cfg.lr, cfg.betas,
            cfg.overlap_comm) == (16, 2, 2, "bf16", 3e-4, (0.9, 0.99), False)


def test_from_deepspeed_maps_buckets_prefetch_and_fp16():
    ddp = mm.TrainConfig.from_deepspeed({"zero_optimization": {"stage": 0, "reduce_bucket_size": 500_000}})
    assert ddp.bucket_mb == pytest.approx(500_000 * 4 / 2**20)
    z3 = mm.TrainConfig.from_deepspeed({"zero_optimization": {
        "stage": 3, "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 100}})
    assert (z3.prefetch, z3.param_persistence_threshold) == (False, 100)
    assert mm.TrainConfig.from_deepspeed({"zero_optimization": {"stage": 3}}).prefetch is True
    fp16 = mm.TrainConfig.from_deepspeed({"zero_optimization": {"stage": 1}, "fp16": {
        "enabled": True, "loss_scale": 0, "initial_scale_power": 12, "hysteresis": 3}})
    assert (fp16.precision, fp16.initial_scale_power, fp16.hysteresis) == ("fp16", 12, 3)
    assert mm.TrainConfig.from_deepspeed({"fp16": {"enabled": False}}).precision == "fp32"
    # bf16 with fp32 gradient sums (what export_config writes; minimega's main_grad) reads as bf16
    bf16 = mm.TrainConfig.from_deepspeed({"zero_optimization": {"stage": 2}, "bf16": {"enabled": True},
                                          "data_types": {"grad_accum_dtype": "fp32"}, "communication_data_type": "fp32"})
    assert (bf16.precision, bf16.zero_stage) == ("bf16", 2)


@pytest.mark.parametrize("config, message", [
    ({"zero_optimization": {"stage": 2, "sub_group_size": 1}}, "unsupported key.*zero_optimization.sub_group_size"),
    ({"amp": {}}, r"unsupported key\(s\) amp"),
    ({"zero_optimization": {"stage": 4}}, "zero_stage must be 0, 1, 2 or 3"),
    ({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}}, "offload_optimizer needs zero_stage >= 1"),
    ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4}, r"train_batch_size=10 != .* = 4 \* 1 \* 2 = 8"),
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "fp16 and bf16 are both enabled"),
    ({"optimizer": {"type": "Lamb"}}, "optimizer.type='Lamb'"),
    # No coercion: JSON strings are not booleans or numbers.
    ({"zero_optimization": {"stage": 1}, "fp16": {"enabled": "false"}}, "fp16.enabled='false' must be true or false"),
    ({"bf16": {"enabled": "auto"}}, "bf16.enabled='auto' must be true or false"),
    ({"bf16": {"enabled": 1}}, "bf16.enabled=1 must be true or false"),
    ({"zero_optimization": {"stage": "2"}}, "zero_optimization.stage='2' must be an integer"),
    ({"zero_optimization": {"stage": 2.0}}, "zero_optimization.stage=2.0 must be an integer"),
    ({"zero_optimization": {"stage": True}}, "zero_optimization.stage=True must be an integer"),
    ({"train_batch_size": "16"}, "train_batch_size='16' must be an integer"),
    ({"optimizer": {"params": {"lr": "3e-4"}}}, "optimizer.params.lr='3e-4' must be a finite number"),
    ({"optimizer": {"params": {"betas": [0.9]}}}, "betas=.* must be a list of two numbers"),
    ({"optimizer": {"params": {"betas": [0.9, 1.0]}}}, r"betas must be a tuple of two numbers in \[0, 1\)"),
    ({"zero_optimization": {"stage": 2, "overlap_comm": "true"}}, "overlap_comm='true' must be true or false"),
    ({"gradient_clipping": -1.0}, "gradient_clipping must be a finite number >= 0"),
    # Keys DeepSpeed has and minimega does not implement: refused by name, with the reason.
    ({"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e5}}, "reduce_bucket_size with stage=2 is not supported"),
    ({"zero_optimization": {"stage": 2, "allgather_bucket_size": 5e8}}, "allgather_bucket_size is not supported"),
    ({"zero_optimization": {"stage": 2, "contiguous_gradients": True}}, "contiguous_gradients is not supported"),
    ({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 5e7}}, "stage3_prefetch_bucket_size > 0"),
    ({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu", "pin_memory": True}}},
     "offload_optimizer.pin_memory is not supported"),
    ({"steps_per_print": 10}, "steps_per_print is not supported"),
    ({"wall_clock_breakdown": False}, "wall_clock_breakdown is not supported"),
    ({"fp16": {"enabled": False, "loss_scale": 128}}, "fp16.loss_scale has an effect only with fp16.enabled=true"),
    ({"zero_optimization": {"stage": 1, "stage3_param_persistence_threshold": 10}},
     "param_persistence_threshold=10 has an effect only with zero_stage=3"),
    ({"train_micro_batch_size_per_gpu": 4, "_dp": None}, "train_micro_batch_size_per_gpu needs the data-parallel"),
    ({"zero_optimization": []}, "'zero_optimization' must be a JSON object"),
    # minimega sums bf16 gradients in fp32 and fp32/fp16 ones in their own dtype: other sums are refused
    ({"zero_optimization": {"stage": 1}, "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "bf16"}},
     "grad_accum_dtype.*minimega sums gradients in fp32 under bf16 only"),
    ({"zero_optimization": {"stage": 1}, "bf16": {"enabled": True}, "communication_data_type": "bf16"},
     "communication_data_type.*in fp32 under bf16 only"),
    ({"zero_optimization": {"stage": 1}, "fp16": {"enabled": True}, "communication_data_type": "fp32"},
     "communication_data_type.*in fp32 under bf16 only"),
    ({"bf16": {"enabled": True}, "data_types": {"param_dtype": "fp32"}}, "unsupported key.*data_types.param_dtype"),
])
def test_from_deepspeed_rejects_bad_input_by_name(config, message):
    dp = config.pop("_dp", 2)
    with pytest.raises(ValueError, match=message):
        mm.TrainConfig.from_deepspeed(config, dp=dp)


def test_from_deepspeed_refuses_oversized_files(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(" " * (2**20 + 1) + "{}")
    with pytest.raises(ValueError, match="at most 1048576 bytes"):
        mm.TrainConfig.from_deepspeed(path)


@pytest.mark.parametrize("field, value, message", [
    ("lr", math.nan, "lr must be a finite number > 0, got nan"),
    ("lr", math.inf, "lr must be a finite number > 0, got inf"),
    ("lr", 0.0, "lr must be a finite number > 0"),
    ("eps", 0.0, "eps must be a finite number > 0"),
    ("eps", -1e-8, "eps must be a finite number > 0"),
    ("weight_decay", -0.1, "weight_decay must be a finite number >= 0"),
    ("gradient_clipping", -1.0, "gradient_clipping must be a finite number >= 0"),
    ("bucket_mb", 0, "bucket_mb must be a finite number > 0"),
    ("betas", (0.9, 1.0), r"betas must be a tuple of two numbers in \[0, 1\)"),
    ("betas", (-0.1, 0.9), r"betas must be a tuple of two numbers in \[0, 1\)"),
    ("betas", [0.9, 0.95], "betas must be a tuple"),
    ("betas", (0.9, math.nan), "betas must be a tuple"),
    ("tp", True, "tp must be a positive integer, got True"),
    ("batch_size", 8.0, "batch_size must be a positive integer, got 8.0"),
    ("gradient_accumulation_steps", 0, "gradient_accumulation_steps must be a positive integer, got 0"),
    ("zero_stage", True, "zero_stage must be 0, 1, 2 or 3"),
    ("zero_stage", 1.0, "zero_stage must be 0, 1, 2 or 3"),
    ("seed", -1, "seed must be an integer >= 0"),
    ("seq_len", 0, "seq_len must be a positive integer or None"),
    ("sequence_parallel", 1, "sequence_parallel must be True or False, got 1"),
    ("overlap_comm", "false", "overlap_comm must be True or False"),
    ("precision", "fp4", "precision='fp4'; choose one of"),
    ("initial_scale_power", 64, r"initial_scale_power must be an integer in \[0, 63\]"),
    # Accepted only where something reads them.
    ("micro_batches", 2, "micro_batches=2 has an effect only with pp > 1"),
    ("loss_scale", 128.0, "loss_scale=128.0 has an effect only with precision='fp16'"),
    ("prefetch", False, "prefetch=False has an effect only with zero_stage=3"),
    ("checkpoint_every", 2, "checkpoint_every=2 has an effect only with activation_checkpointing='full'"),
])
def test_train_config_refuses_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        mm.TrainConfig(**{field: value})


_WRONG_TYPE = {int: "1", float: "1.0", bool: 1, str: 1}


@pytest.mark.parametrize("f", dataclasses.fields(mm.TrainConfig), ids=lambda f: f.name)
def test_every_field_refuses_a_wrong_type_by_name(f):
    """Generated from the dataclass: a new field without a check fails here."""
    hint = typing.get_type_hints(mm.TrainConfig)[f.name]
    base = typing.get_args(hint)[0] if typing.get_args(hint) and hint is not tuple[float, float] else hint
    value = _WRONG_TYPE.get(base, "bad")
    with pytest.raises(ValueError, match=rf"TrainConfig\.{f.name}\b"):
        mm.TrainConfig(**{f.name: value})


def test_train_config_checks():
    with pytest.raises(ValueError, match="sequence_parallel needs tp > 1"):
        mm.TrainConfig(sequence_parallel=True)
    with pytest.raises(ValueError, match=r"batch_size=6 is not divisible by dp \* gradient_accumulation_steps = 2 \* 2 = 4"):
        mm.TrainConfig(batch_size=6, gradient_accumulation_steps=2).rows_per_micro_step(2)
    with pytest.raises(ValueError, match="has no field"):
        mm.TrainConfig.from_deepspeed({}, tpp=2)
    # Values in range pass, ints where floats are expected included.
    cfg = mm.TrainConfig(lr=1, eps=1e-6, betas=(0.0, 0.999), gradient_clipping=0, weight_decay=0.1, zero_stage=3,
                         prefetch=False, pp=1, seed=0)
    assert cfg.lr == 1 and cfg.prefetch is False


@pytest.mark.parametrize("field, value, message", [
    ("n_layer", True, "n_layer must be a positive integer, got True"),
    ("n_embd", 64.0, "n_embd must be a positive integer, got 64.0"),
    ("dropout", math.nan, r"dropout must be a number in \[0, 1\)"),
    ("dropout", "0.1", r"dropout must be a number in \[0, 1\)"),
    ("bias", 0, "bias must be True or False, got 0"),
])
def test_gpt_config_refuses_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        mm.GPTConfig.tiny(**{field: value})
