"""export_config: each stack's own names, refusals by name, the round trip through from_deepspeed, BLOOM's run."""
import dataclasses
import importlib.util
import json
import tomllib

import pytest

from minimega import GPTConfig, TrainConfig
from minimega.tools import export_config as ex
from minimega.tools.cli import main

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
FIELDS = [f.name for f in dataclasses.fields(TrainConfig)]
MODEL = GPTConfig.tiny()
DP = 2


def _export(target, cfg, megatron=False):
    if target == "deepspeed":
        return ex.to_deepspeed(cfg, DP, megatron=megatron)
    if target == "megatron":
        return ex.to_megatron(cfg, DP, MODEL)
    return ex.torchtitan_sections(cfg, DP, MODEL)


# ------------------------------------------------------------------------------------------------
# The table and the exporters agree

PIPE = dict(pp=2, micro_batches=2)
# field -> (base, changed): TrainConfig kwargs; `changed` sets the field to something other than its default.
SAMPLES = {
    "tp": ({}, dict(tp=2, sequence_parallel=True)),
    "pp": ({}, PIPE),
    "zero_stage": ({}, dict(zero_stage=3)),
    "sequence_parallel": (dict(tp=2), dict(tp=2, sequence_parallel=True)),
    "activation_checkpointing": ({}, dict(activation_checkpointing="full")),
    "checkpoint_every": (dict(activation_checkpointing="full"), dict(activation_checkpointing="full", checkpoint_every=2)),
    "schedule": (PIPE, dict(PIPE, schedule="interleaved_1f1b", virtual_stages=2)),
    "micro_batches": (PIPE, dict(pp=2, micro_batches=4)),
    "virtual_stages": (dict(PIPE, schedule="interleaved_1f1b"), dict(PIPE, schedule="interleaved_1f1b", virtual_stages=2)),
    "batch_size": ({}, dict(batch_size=16)),
    "seq_len": ({}, dict(seq_len=32)),
    "gradient_accumulation_steps": ({}, dict(gradient_accumulation_steps=2)),
    "gradient_clipping": ({}, dict(gradient_clipping=1.0)),
    # without weight decay Adam is AdamW, and Megatron-LM writes both as --optimizer adam: SGD changes its export
    "optimizer": {"megatron": ({}, dict(optimizer="sgd")), "*": ({}, dict(optimizer="adam"))},
    "lr": ({}, dict(lr=3e-4)),
    "betas": ({}, dict(betas=(0.8, 0.9))),
    "eps": ({}, dict(eps=1e-6)),
    "weight_decay": ({}, dict(weight_decay=0.1)),
    "seed": ({}, dict(seed=7)),
    "precision": (dict(zero_stage=3), dict(zero_stage=3, precision="bf16")),
    "offload_optimizer": (dict(zero_stage=2), dict(zero_stage=2, offload_optimizer=True)),
    "nvme_path": (dict(zero_stage=2, offload_optimizer=True),
                  dict(zero_stage=2, offload_optimizer=True, nvme_path="/local_nvme")),
    "bucket_mb": ({}, dict(bucket_mb=50.0)),
    "param_persistence_threshold": (dict(zero_stage=3), dict(zero_stage=3, param_persistence_threshold=1000)),
    "prefetch": (dict(zero_stage=3), dict(zero_stage=3, prefetch=False)),
    "overlap_comm": ({}, dict(overlap_comm=False)),
    "reductions_in_flight": (dict(zero_stage=2), dict(zero_stage=2, reductions_in_flight=2)),
    "async_save": ({}, dict(async_save=True)),
    "memory_peak_steps": ({}, dict(memory_peak_steps=0)),
    "ep": ({}, dict(ep=2)),
    "cp": ({}, dict(cp=2)),
    "cp_attention": (dict(cp=2), dict(cp=2, cp_attention="ulysses")),
    "loss_scale": (dict(zero_stage=1, precision="fp16"), dict(zero_stage=1, precision="fp16", loss_scale=128.0)),
    "initial_scale_power": (dict(zero_stage=1, precision="fp16"), dict(zero_stage=1, precision="fp16", initial_scale_power=8)),
    "loss_scale_window": (dict(zero_stage=1, precision="fp16"), dict(zero_stage=1, precision="fp16", loss_scale_window=50)),
    "hysteresis": (dict(zero_stage=1, precision="fp16"), dict(zero_stage=1, precision="fp16", hysteresis=1)),
    "min_loss_scale": (dict(zero_stage=1, precision="fp16"), dict(zero_stage=1, precision="fp16", min_loss_scale=2.0)),
}


def test_every_field_has_one_row_and_a_sample():
    rows = [r[0] for r in ex.TABLE]
    assert len(rows) == len(set(rows))
    missing = sorted(set(FIELDS) - set(rows))
    assert not missing, f"TrainConfig fields with no row in export_config.TABLE: {missing}"
    assert set(SAMPLES) == set(rows)


CASES = [(field, target) for field in SAMPLES for target in ex.TARGETS]


@pytest.mark.parametrize("field,target", CASES, ids=[f"{f}-{t}" for f, t in CASES])
def test_table_matches_exporters(field, target):
    """A cell starting with "—" means: changing the field is refused, by name. Any other cell: it changes the export."""
    if field not in FIELDS:
        pytest.skip(f"TrainConfig has no field {field} in this version")
    sample = SAMPLES[field]
    base_kw, changed_kw = sample.get(target, sample["*"]) if isinstance(sample, dict) else sample
    cell = next(r for r in ex.TABLE if r[0] == field)[1 + ex.TARGETS.index(target)]
    base, changed = TrainConfig(**base_kw), TrainConfig(**changed_kw)
    megatron = False
    if target == "deepspeed" and not cell.startswith("—"):
        try:
            ex.to_deepspeed(base, DP)
        except ex.ExportError:
            megatron = True       # the base itself needs Megatron-DeepSpeed's command line (pp > 1)
    if cell.startswith("—"):
        with pytest.raises(ex.ExportError, match=f"{field}="):
            _export(target, changed)
        return
    out = _export(target, changed, megatron)
    try:
        before = _export(target, base, megatron)
    except ex.ExportError:
        return                   # e.g. torchtitan refuses tp without sequence_parallel: the change makes it exportable
    assert out != before, f"{field} changed but the {target} export did not"


def test_markdown_table_lists_every_row():
    md = ex.markdown_table()
    assert md.count("\n") == len(ex.TABLE) + 1
    for field, *_ in ex.TABLE:
        assert f"| `{field}` |" in md


# ------------------------------------------------------------------------------------------------
# DeepSpeed: the round trip and DeepSpeed's own config classes

ROUND_TRIP = [
    TrainConfig(),
    TrainConfig(zero_stage=1, precision="bf16", gradient_clipping=1.0, batch_size=16, gradient_accumulation_steps=4),
    TrainConfig(zero_stage=2, precision="fp16", initial_scale_power=12, loss_scale_window=100, hysteresis=1,
                min_loss_scale=4.0, lr=3e-4, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    TrainConfig(zero_stage=2, precision="fp16", loss_scale=256.0),
    TrainConfig(zero_stage=3, param_persistence_threshold=4096, offload_optimizer=True),
    TrainConfig(zero_stage=2, offload_optimizer=True, nvme_path="/local_nvme"),
    TrainConfig(zero_stage=1, optimizer="sgd", lr=0.1),
    TrainConfig(bucket_mb=50.0),
    TrainConfig(zero_stage=3, optimizer="adam"),
    TrainConfig(zero_stage=1, optimizer="adam", weight_decay=0.1),
]
# These need the from_deepspeed that reads stage3_prefetch_bucket_size and overlap_comm (TrainConfig.overlap_comm).
ROUND_TRIP_NEW = [dict(zero_stage=3, prefetch=False), dict(zero_stage=2, overlap_comm=False)]


@pytest.mark.parametrize("cfg", ROUND_TRIP, ids=range(len(ROUND_TRIP)))
def test_round_trip_through_from_deepspeed(cfg):
    ds = ex.to_deepspeed(cfg, DP)
    assert TrainConfig.from_deepspeed(json.loads(json.dumps(ds)), dp=DP) == cfg


@pytest.mark.parametrize("kw", ROUND_TRIP_NEW, ids=["no-prefetch", "no-overlap"])
def test_round_trip_overlap_and_prefetch(kw):
    if "overlap_comm" not in FIELDS:
        pytest.skip("this TrainConfig has no overlap_comm field (from_deepspeed does not read these keys yet)")
    cfg = TrainConfig(**kw)
    assert TrainConfig.from_deepspeed(ex.to_deepspeed(cfg, DP), dp=DP) == cfg


def test_adam_with_weight_decay_turns_deepspeed_adamw_mode_off():
    """DeepSpeed's "Adam" decouples weight decay unless adam_w_mode is false (runtime/config.py ADAM_W_MODE_DEFAULT)."""
    ds = ex.to_deepspeed(TrainConfig(optimizer="adam", weight_decay=0.1), DP)
    assert ds["optimizer"] == {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                          "weight_decay": 0.1, "adam_w_mode": False}}
    assert ex.to_deepspeed(TrainConfig(optimizer="adam"), DP)["optimizer"]["params"]["adam_w_mode"] is False
    assert "adam_w_mode" not in ex.to_deepspeed(TrainConfig(optimizer="adamw"), DP)["optimizer"]["params"]


@pytest.mark.parametrize("optimizer,mode,expected", [("Adam", None, "adamw"), ("Adam", True, "adamw"),
                                                      ("Adam", False, "adam"), ("AdamW", None, "adamw")])
def test_from_deepspeed_reads_adam_as_deepspeed_does(optimizer, mode, expected):
    """DeepSpeed's "Adam" is AdamW (decoupled weight decay) unless adam_w_mode is false."""
    params = {"lr": 1e-3, "weight_decay": 0.1} | ({} if mode is None else {"adam_w_mode": mode})
    cfg = TrainConfig.from_deepspeed({"optimizer": {"type": optimizer, "params": params}})
    assert cfg.optimizer == expected and cfg.weight_decay == 0.1


def test_from_deepspeed_refuses_adam_w_mode_where_it_means_nothing():
    for opt, mode in (("AdamW", False), ("SGD", True)):
        with pytest.raises(ValueError, match="adam_w_mode"):
            TrainConfig.from_deepspeed({"optimizer": {"type": opt, "params": {"adam_w_mode": mode}}})
    with pytest.raises(ValueError, match="adam_w_mode"):
        TrainConfig.from_deepspeed({"optimizer": {"type": "Adam", "params": {"adam_w_mode": "false"}}})


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed: ds_config keys not checked against its classes")
@pytest.mark.parametrize("cfg", ROUND_TRIP + [TrainConfig(optimizer="adam", weight_decay=0.1)],
                         ids=range(len(ROUND_TRIP) + 1))
def test_deepspeed_reads_what_was_written(cfg):
    assert ex.check_deepspeed(ex.to_deepspeed(cfg, DP), DP)


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed")
def test_check_deepspeed_catches_a_wrong_key():
    ds = ex.to_deepspeed(TrainConfig(zero_stage=3), DP)
    ds["zero_optimization"]["stage3_param_persistance_threshold"] = 0          # misspelt
    with pytest.raises(Exception, match="stage3_param_persistance_threshold"):
        ex.check_deepspeed(ds, DP)
    ds = ex.to_deepspeed(TrainConfig(), DP)
    ds["train_batch_size"] = 16
    with pytest.raises(ValueError, match="train_batch_size"):
        ex.check_deepspeed(ds, DP)


# ------------------------------------------------------------------------------------------------
# Megatron-LM and torchtitan: only names the sources define

MEGATRON_CONFIGS = [TrainConfig(), TrainConfig(tp=2, sequence_parallel=True, zero_stage=1, precision="bf16",
                                                 activation_checkpointing="selective", overlap_comm=True)
                    if "overlap_comm" in FIELDS else TrainConfig(tp=2, sequence_parallel=True, zero_stage=1),
                    TrainConfig(pp=2, micro_batches=4, schedule="interleaved_1f1b", virtual_stages=2, zero_stage=1,
                                precision="bf16", activation_checkpointing="full"),
                    TrainConfig(zero_stage=3, precision="fp16", offload_optimizer=True, bucket_mb=50.0),
                    TrainConfig(zero_stage=2, precision="fp16", loss_scale=64.0, optimizer="sgd")]


@pytest.mark.parametrize("cfg", MEGATRON_CONFIGS, ids=range(len(MEGATRON_CONFIGS)))
def test_megatron_writes_only_flags_megatron_defines(cfg):
    argv = ex.to_megatron(cfg, DP, MODEL)
    flags = [a for a in argv if a.startswith("--")]
    assert set(flags) <= set(ex.MEGATRON_FLAGS), set(flags) - set(ex.MEGATRON_FLAGS)
    assert len(flags) == len(set(flags))


def test_megatron_values():
    argv = ex.to_megatron(TrainConfig(pp=2, micro_batches=4, schedule="interleaved_1f1b", virtual_stages=2,
                                      batch_size=16, zero_stage=1, precision="bf16"), DP, MODEL)
    args = dict(zip(argv, argv[1:] + [""]))
    assert args["--micro-batch-size"] == "2" and args["--global-batch-size"] == "16"     # 16 = 2 * 4 micro * 2 dp
    assert args["--num-layers-per-virtual-pipeline-stage"] == "1"                          # 4 layers / (2 * 2)
    assert args["--clip-grad"] == "0.0"                                                    # Megatron's default is 1.0
    assert args["--adam-beta2"] == "0.95" and args["--weight-decay"] == "0.0" and args["--lr-decay-style"] == "constant"


@pytest.mark.parametrize("cfg", [TrainConfig(), TrainConfig(zero_stage=3, tp=2, sequence_parallel=True),
                                 TrainConfig(pp=2, micro_batches=2, schedule="gpipe",
                                             activation_checkpointing="full", gradient_clipping=1.0)], ids=range(3))
def test_torchtitan_toml_parses_to_its_own_keys(cfg):
    text = ex.to_torchtitan(cfg, DP, MODEL)
    parsed = tomllib.loads(text)
    for section, keys in parsed.items():
        assert set(keys) <= ex.TORCHTITAN_KEYS[section], (section, set(keys) - ex.TORCHTITAN_KEYS[section])
    assert parsed == ex.torchtitan_sections(cfg, DP, MODEL)


def test_megatron_loss_scale_flags():
    argv = ex.to_megatron(TrainConfig(zero_stage=1, precision="fp16", initial_scale_power=12, hysteresis=3), DP, MODEL)
    args = dict(zip(argv, argv[1:] + [""]))
    assert (args["--initial-loss-scale"], args["--hysteresis"], args["--loss-scale-window"]) == ("4096", "3", "1000")
    assert "--loss-scale" not in args                                                     # dynamic
    argv = ex.to_megatron(TrainConfig(zero_stage=1, precision="fp16", loss_scale=128.0), DP, MODEL)
    assert argv[argv.index("--loss-scale") + 1] == "128.0" and "--initial-loss-scale" not in argv


def test_torchtitan_values():
    t = ex.torchtitan_sections(TrainConfig(zero_stage=3, batch_size=16, gradient_accumulation_steps=2), DP, MODEL)
    assert t["training"]["local_batch_size"] == 4 and t["training"]["global_batch_size"] == 16   # 16 / (2 dp * 2 acc)
    assert t["training"]["max_norm"] == float("inf")                 # clipping off: torchtitan always clips
    assert t["parallelism"]["data_parallel_shard_degree"] == 2 and t["parallelism"]["fsdp_reshard_after_forward"] == "always"
    ddp = ex.torchtitan_sections(TrainConfig(), DP, MODEL)["parallelism"]
    assert ddp["data_parallel_replicate_degree"] == 2 and ddp["data_parallel_shard_degree"] == 1


# ------------------------------------------------------------------------------------------------
# BLOOM-176B: the published launch (bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm,
# at 9e64ede, 48 nodes: README.md L178-183 "TP=4 PP=12 DP=8"), the oracle for the preset.

BLOOM_ARGS = {"--tensor-model-parallel-size": "4", "--pipeline-model-parallel-size": "12", "--micro-batch-size": "2",
              "--global-batch-size": "2048", "--bf16": None, "--seq-length": "2048", "--num-layers": "70",
              "--hidden-size": "14336", "--num-attention-heads": "112", "--clip-grad": "1.0", "--adam-beta1": "0.9",
              "--adam-beta2": "0.95", "--adam-eps": "1e-8", "--weight-decay": "1e-1", "--lr": "6e-5",
              "--seed": "42", "--optimizer": "adam"}
BLOOM_DS_CONFIG = {"train_micro_batch_size_per_gpu": 2, "train_batch_size": 2048, "gradient_clipping": 1.0,
                   "zero_optimization": {"stage": 0}, "bf16": {"enabled": True},
                   "steps_per_print": 2000, "wall_clock_breakdown": False}


def _parse_argv(argv):
    out, i = {}, 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[argv[i]], i = argv[i + 1], i + 2
        else:
            out[argv[i]], i = None, i + 1
    return out


def _same(a, b):
    if a is None or b is None:
        return a is b
    try:
        return float(a) == float(b)
    except ValueError:
        return a == b


def test_bloom_megatron_arguments_match_the_published_run():
    p = ex.bloom_176b()
    ours = _parse_argv(ex.to_megatron(p.train, p.dp, p.model))
    for flag, value in BLOOM_ARGS.items():
        assert flag in ours and _same(ours[flag], value), (flag, ours.get(flag, "missing"), value)
    # BLOOM's `--checkpoint-activations` (every layer) is Megatron-LM's full, uniform, 1 layer per unit today
    assert (ours["--recompute-granularity"], ours["--recompute-method"], ours["--recompute-num-layers"]) == ("full", "uniform", "1")
    assert "--use-distributed-optimizer" in ours     # BLOOM: DeepSpeed's BF16_Optimizer, ZeRO-1 at "stage 0"
    assert p.dp * p.train.tp * p.train.pp == 384     # 48 nodes x 8 A100


def test_bloom_ds_config_matches_the_published_one():
    p = ex.bloom_176b()
    ours = ex.to_deepspeed(p.train, p.dp, megatron=True)
    for key in ("train_micro_batch_size_per_gpu", "train_batch_size", "gradient_clipping", "zero_optimization", "bf16"):
        assert ours[key] == BLOOM_DS_CONFIG[key], key
    # DeepSpeed derives it from the two batch sizes; written here so from_deepspeed can check it: 2048 / (2 * 8)
    assert ours["gradient_accumulation_steps"] == 128
    assert "optimizer" not in ours           # Megatron-DeepSpeed builds it from --optimizer, --lr, ...
    with pytest.raises(ex.ExportError, match="tp=4"):
        ex.to_deepspeed(p.train, p.dp)                 # plain ds_config.json has no tensor parallelism


def test_bloom_differences_are_stated():
    p = ex.bloom_176b()
    notes = " ".join(ex.notes(p.train, "megatron", p.model))
    assert "weight decay" in notes


# ------------------------------------------------------------------------------------------------
# The command line

def test_cli_writes_ds_config_and_refuses_by_name(tmp_path, capsys):
    out = tmp_path / "ds.json"
    assert main(["export-config", "--deepspeed", "--nproc", "2", "--zero-stage", "2", "--gradient-clipping", "1.0",
                 "--no-check", "--out", str(out)]) == 0
    ds = json.loads(out.read_text())
    assert ds["zero_optimization"]["stage"] == 2 and ds["train_micro_batch_size_per_gpu"] == 4
    assert TrainConfig.from_deepspeed(ds, dp=2) == TrainConfig(zero_stage=2, gradient_clipping=1.0)
    assert main(["export-config", "--torchtitan", "--zero-stage", "1"]) == 2
    assert "zero_stage=1 cannot be expressed" in capsys.readouterr().err


def test_cli_megatron_bloom(capsys):
    assert main(["export-config", "--megatron", "--preset", "bloom-176b"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("pretrain_gpt.py") and "--tensor-model-parallel-size 4 \\" in text


# ------------------------------------------------------------------------------------------------
# Chapter 14 prints what the code produces

def test_chapter_14_carries_the_table_and_bloom_exports(capsys):
    from pathlib import Path
    page = (Path(__file__).resolve().parents[1] / "course" / "14-real-stacks.md").read_text()
    assert ex.markdown_table() in page, "course/14-real-stacks.md: paste export_config.markdown_table() again"
    assert main(["export-config", "--megatron", "--preset", "bloom-176b"]) == 0
    # the page shows the arguments without the overlap flags, which TrainConfig.overlap_comm (on by default,
    # where it exists) adds; the page says so
    out = "\n".join(line for line in capsys.readouterr().out.splitlines() if "--overlap-" not in line)
    assert out in page
    assert "`--overlap-grad-reduce`" in page
    assert main(["export-config", "--deepspeed", "--megatron-deepspeed", "--preset", "bloom-176b", "--no-check"]) == 0
    assert capsys.readouterr().out.rstrip("\n") in page


def test_mt_nlg_layout_as_the_chapter_states():
    """TP 8 x PP 35, global batch 1920 at DP 8 (Smith et al. 2022 §2.4), micro-batch 1 (Korthikanti et al. Table 3)."""
    model = GPTConfig(vocab_size=51200, block_size=2048, n_layer=105, n_head=128, n_embd=20480)
    argv = ex.to_megatron(TrainConfig(tp=8, pp=35, batch_size=1920, micro_batches=240), 8, model)
    args = _parse_argv(argv)
    assert (args["--tensor-model-parallel-size"], args["--pipeline-model-parallel-size"]) == ("8", "35")
    assert (args["--micro-batch-size"], args["--global-batch-size"]) == ("1", "1920")
    assert 8 * 8 * 35 == 2240


def test_megatron_carries_llama_blocks():
    """GQA, SwiGLU and RoPE go on Megatron-LM's command line (flags it defines); a base it cannot hold is refused."""
    argv = ex.to_megatron(TrainConfig(tp=2), DP, GPTConfig.tiny_llama())
    flags = [a for a in argv if a.startswith("--")]
    assert set(flags) <= set(ex.MEGATRON_FLAGS), set(flags) - set(ex.MEGATRON_FLAGS)
    args = dict(zip(argv, argv[1:] + [""]))
    assert args["--num-query-groups"] == "2" and "--group-query-attention" in args and "--swiglu" in args
    assert args["--ffn-hidden-size"] == "176" and args["--position-embedding-type"] == "rope"
    assert args["--rotary-base"] == "500000" and "--rotary-interleaved" in args
    plain = ex.to_megatron(TrainConfig(), DP, GPTConfig.tiny())
    assert not {"--swiglu", "--group-query-attention", "--position-embedding-type"} & set(plain)
    with pytest.raises(ex.ExportError, match="rope_theta=10000.5 cannot be expressed"):
        ex.to_megatron(TrainConfig(), DP, GPTConfig.tiny_llama(rope_theta=10000.5))
