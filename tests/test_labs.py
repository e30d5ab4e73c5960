"""The labs: every notebook runs under nbval with the reference solutions, and every exercise check
catches wrong answers with a message that names the mistake."""
import inspect
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "labs"
# Collected before any test runs, so the launcher's forkserver (started by the first launch) can import
# the labs' modules and this folder's wrong answers in every rank.
sys.path.insert(0, str(LABS))

import checks                     # noqa: E402  (labs/checks.py)
import lab_wrong_answers as wrong  # noqa: E402
import make_notebooks             # noqa: E402

NOTEBOOKS = sorted(LABS.glob("[0-9][0-9]-*.ipynb"))
EXERCISES = {"memory": (["model_state_bytes"], checks.check_model_state_bytes),
             "ring_all_reduce": (["ring_all_reduce"], checks.check_ring_all_reduce),
             "tp_regions": (["CopyToTP", "ReduceFromTP"], checks.check_tp_regions),
             "checkpoint": (["Checkpoint"], checks.check_checkpoint),
             "zero_reduce_scatter": (["reduce_scatter_grads"], checks.check_zero_reduce_scatter),
             "one_f_one_b": (["one_f_one_b_order"], checks.check_one_f_one_b),
             "verify_checkpoint": (["verify_checkpoint"], checks.check_verify_checkpoint),
             "loss_scaler": (["LossScaler"], checks.check_loss_scaler),
             "offload": (["bytes_by_location"], checks.check_offload),
             "fsdp_shard": (["fsdp_local_shard"], checks.check_fsdp_shard),
             "rank_grid": (["group_ranks"], checks.check_rank_grid),
             "alpha_beta": (["collective_seconds"], checks.check_collective_seconds),
             "moe_slots": (["assign_slots"], checks.check_moe_slots),
             "cp_chunks": (["rank_positions"], checks.check_cp_chunks)}


def _load(package, name):
    old = os.environ.get(checks.SOLUTIONS_ENV)
    os.environ[checks.SOLUTIONS_ENV] = "1" if package == "solutions" else "0"
    try:
        return checks.exercise(name)
    finally:
        os.environ.pop(checks.SOLUTIONS_ENV) if old is None else os.environ.__setitem__(checks.SOLUTIONS_ENV, old)


# ------------------------------------------------------------------------------------------------
# The notebooks.

def test_every_lab_has_a_source_and_is_built_from_it():
    sources = sorted(p.stem for p in (LABS / "notebooks").glob("*.py"))
    assert [p.stem for p in NOTEBOOKS] == sources
    for path in NOTEBOOKS:
        stored = make_notebooks.nbformat.read(path, as_version=4)
        built = make_notebooks.build(path.stem)
        assert [(c.cell_type, c.source) for c in stored.cells] == [(c.cell_type, c.source) for c in built.cells], \
            f"{path.name} is out of date: run `python labs/make_notebooks.py --execute {path.stem}`"
        assert stored.metadata["kernelspec"]["name"] == "python3"
        checked = [c for c in stored.cells if c.cell_type == "code" and "# NBVAL_CHECK_OUTPUT" in c.source]
        assert checked and all(c.outputs for c in checked), f"{path.name}: checked cells need stored outputs"


def _halves(notebooks, seconds):
    """The notebooks in two lists of about equal measured run time (longest first onto the lighter one)."""
    halves = ([], [])
    for path in sorted(notebooks, key=lambda p: -seconds.get(p.stem, 60.0)):
        min(halves, key=lambda h: sum(seconds.get(p.stem, 60.0) for p in h)).append(path)
    return [sorted(h) for h in halves]


HALVES = _halves(NOTEBOOKS, json.loads((LABS / "run-times.json").read_text())["seconds"])


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("notebooks", HALVES, ids=lambda h: "+".join(p.stem[:2] for p in h))
def test_labs_run_under_nbval_with_the_solutions(notebooks):
    # One pytest per half of the labs (one per `make test` worker), and in it one Jupyter kernel for all its
    # notebooks (tests/nbval_one_kernel.py): the kernel and its launcher's forkserver import torch once, not once
    # per notebook. Only nbval and pytest-timeout are loaded: the suite's other plugins (hypothesis,
    # schemathesis, xdist...) cost each pytest 2.4 s of CPU to import and serve no notebook.
    env = {**os.environ, checks.SOLUTIONS_ENV: "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(LABS), str(ROOT / "tests"),
                                          os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "nbval.plugin", "-p", "pytest_timeout",
                           "-p", "nbval_one_kernel", "--nbval-lax", "--nbval-current-env", "-q",
                           "-p", "no:cacheprovider", *map(str, notebooks)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1150)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, f"a notebook failed under nbval:\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    ran = re.search(r"(\d+) passed", proc.stdout)
    cells = sum(1 for p in notebooks for c in make_notebooks.nbformat.read(p, as_version=4).cells
                if c.cell_type == "code")
    assert ran and int(ran.group(1)) == cells, f"nbval ran {ran and ran.group(1)} of {cells} cells:\n{proc.stdout[-3000:]}"
    print(f"{len(notebooks)} notebooks: {wall:.1f} s under nbval")


# ------------------------------------------------------------------------------------------------
# The exercises.

def _api(obj):
    """A function's parameter names, or a class's static methods with theirs (annotations aside)."""
    if inspect.isclass(obj):
        return {n: list(inspect.signature(m).parameters) for n, m in vars(obj).items() if isinstance(m, staticmethod)}
    return list(inspect.signature(obj).parameters)


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_stub_and_solution_share_an_api_and_the_stub_says_it_is_an_exercise(name):
    names, check = EXERCISES[name]
    stub, solution = _load("exercises", name), _load("solutions", name)
    for attr in names:
        assert _api(getattr(stub, attr)) == _api(getattr(solution, attr)), f"{name}.{attr}"
    with pytest.raises(checks.ExerciseError, match="not done yet"):
        check(*(getattr(stub, attr) for attr in names))


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_reference_solution_passes_its_check(name, capsys):
    names, check = EXERCISES[name]
    solution = _load("solutions", name)
    check(*(getattr(solution, attr) for attr in names))
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize("answer, says", [
    (wrong.memory_forgets_step, "keeps a `step` counter per parameter *tensor*"),
    (wrong.memory_counts_elements, "is the element count, not bytes"),
    (wrong.memory_one_moment, "you counted one moment"),
    (wrong.memory_sgd_has_momentum, "SGD without momentum keeps no state"),
    (wrong.memory_mixed_precision_k, "no separate master copy"),
    (wrong.memory_no_grads, "every trainable parameter holds a .grad"),
    (wrong.memory_total_only, "return a dict with exactly the keys"),
], ids=lambda v: v.__name__ if callable(v) else "")
def test_memory_check_names_the_mistake(answer, says):
    with pytest.raises(checks.ExerciseError, match="model_state_bytes") as info:
        checks.check_model_state_bytes(answer)
    assert says in str(info.value)


@pytest.mark.parametrize("answer, says", [
    (wrong.ring_no_padding, "pad the flat tensor with zeros to a multiple of group.size"),
    (wrong.ring_returns_mean, "the result is the mean, not the sum"),
    (wrong.ring_skips_all_gather, "only this rank's own chunk"),
    (wrong.ring_uses_all_reduce, "calls comm.all_reduce"),
    (wrong.ring_local_only, "nothing was summed across ranks"),
    (wrong.ring_keeps_padding, "drop the padding and reshape"),
], ids=lambda v: v.__name__ if callable(v) else "")
def test_ring_check_names_the_mistake(answer, says):
    with pytest.raises(checks.ExerciseError, match="ring_all_reduce") as info:
        checks.check_ring_all_reduce(answer)
    assert says in str(info.value)


@pytest.mark.parametrize("f, g, says", [
    (wrong.FBackwardIdentity, wrong.GoodG, "f's backward must all-reduce (sum) it"),
    (wrong.GoodF, wrong.GForwardIdentity, "g's forward must all-reduce (sum) it"),
    (wrong.GoodF, wrong.GForwardMean, "g's forward must sum, not average"),
    (wrong.GoodF, wrong.GBackwardAllReduce, "g's backward must be the identity"),
], ids=["f-backward-identity", "g-forward-identity", "g-forward-mean", "g-backward-all-reduce"])
def test_tp_regions_check_names_the_mistake(f, g, says):
    with pytest.raises(checks.ExerciseError, match="tp_regions") as info:
        checks.check_tp_regions(f, g)
    assert says in str(info.value)


@pytest.mark.parametrize("answer, says", [
    (wrong.CheckpointForgetsRng, "drew new dropout masks"),
    (wrong.CheckpointReturnsOneGradient, "(None, x's gradient), None for fn"),
    (wrong.CheckpointRecomputesWithoutGrad, "recompute fn under torch.enable_grad()"),
    (wrong.CheckpointSavesOutput, "save x alone"),
], ids=lambda v: v.__name__ if inspect.isclass(v) else "")
def test_checkpoint_check_names_the_mistake(answer, says):
    with pytest.raises(checks.ExerciseError, match="checkpoint") as info:
        checks.check_checkpoint(answer)
    assert says in str(info.value)


def test_ring_check_reports_a_hang_instead_of_waiting_forever():
    with pytest.raises(checks.ExerciseError, match="every rank must call the same collectives"):
        checks.check_ring_all_reduce(wrong.ring_only_rank0_communicates, timeout=10)


@pytest.mark.parametrize("answer, says", [
    (wrong.rs_no_padding, "pad it with zeros to padded = ceil(numel / n) · n"),
    (wrong.rs_mean, "the shard is the mean over ranks, not the sum"),
    (wrong.rs_all_reduce_then_slice, "calls comm.all_reduce"),
    (wrong.rs_pads_each_gradient, "the gradients were padded one by one"),
    (wrong.rs_reversed_order, "flattened in reverse order"),
    (wrong.rs_local_slice, "nothing was summed across ranks"),
    (wrong.rs_returns_full_buffer, "the whole flat buffer"),
], ids=lambda v: v.__name__ if callable(v) else "")
def test_zero_reduce_scatter_check_names_the_mistake(answer, says):
    with pytest.raises(checks.ExerciseError, match="reduce_scatter_grads") as info:
        checks.check_zero_reduce_scatter(answer)
    assert says in str(info.value)


@pytest.mark.parametrize("answer, says", [
    (wrong.order_gpipe, "yours is GPipe's order"),
    (wrong.order_warmup_off_by_one, "one warm-up forward too many"),
    (wrong.order_warmup_reversed, "yours is reversed"),
    (wrong.order_backward_first, "the steady state starts with a forward"),
    (wrong.order_warmup_not_capped, "cap the warm-up at m forwards"),
    (wrong.order_forgets_cool_down, "the backwards still owed"),
], ids=lambda v: v.__name__ if callable(v) else "")
def test_one_f_one_b_check_names_the_mistake(answer, says):
    with pytest.raises(checks.ExerciseError, match="one_f_one_b_order") as info:
        checks.check_one_f_one_b(answer)
    assert says in str(info.value)


@pytest.mark.parametrize("answer, says", [
    (wrong.verify_existence_only, "only its sha256 shows the flipped byte"),
    (wrong.verify_by_size, "only its sha256 shows the flipped byte"),
    (wrong.verify_md5, "hash each file's bytes with sha256"),
    (wrong.verify_ignores_latest, "read its `latest` file"),
    (wrong.verify_crashes_on_missing, "report it instead of opening it"),
    (wrong.verify_returns_paths, "return the file names as the manifest lists them"),
], ids=lambda v: v.__name__ if callable(v) else "")
def test_verify_checkpoint_check_names_the_mistake(answer, says):
    with pytest.raises(checks.ExerciseError, match="verify_checkpoint") as info:
        checks.check_verify_checkpoint(answer)
    assert says in str(info.value)


@pytest.mark.parametrize("answer, says", [
    (wrong.ScalerNoHysteresis, "uses up one unit of hysteresis"),
    (wrong.ScalerWindowFromStart, "counted from the last overflow"),
    (wrong.ScalerNoFloor, "never drop below min_scale"),
    (wrong.ScalerNeverGrows, "the scale grows by factor"),
    (wrong.ScalerForgetsSkipped, "count every overflowing step in `skipped`"),
], ids=lambda v: v.__name__ if inspect.isclass(v) else "")
def test_loss_scaler_check_names_the_mistake(answer, says):
    with pytest.raises(checks.ExerciseError, match="loss_scaler") as info:
        checks.check_loss_scaler(answer)
    assert says in str(info.value)


@pytest.mark.parametrize("answer, says", [
    (wrong.location_keeps_grad_shard, "from stage 2 on none stays on the device"),
    (wrong.location_host_grads_16bit, "the host sums the gradient shards in fp32"),
    (wrong.location_stage1_grads_moved, "stage 1 does not shard gradients"),
    (wrong.location_bf16_grads_16bit, "summed and reduced in an fp32 buffer"),
    (wrong.location_fp32_master_on_device, "the parameter shard *is* the master copy"),
    (wrong.location_fp32_offload_no_copy, "always makes a separate fp32 master copy on the host"),
    (wrong.location_optimizer_not_sharded, "each rank keeps Ψ/dp of them"),
    (wrong.location_grads_always_whole, "sharded from stage 2"),
], ids=lambda v: v.__name__ if callable(v) else "")
def test_offload_check_names_the_mistake(answer, says):
    with pytest.raises(checks.ExerciseError, match="bytes_by_location") as info:
        checks.check_offload(answer)
    assert says in str(info.value)


@pytest.mark.parametrize("answer, says", [
    (wrong.fsdp_flat_shard, "FSDP2 does not flatten"),
    (wrong.fsdp_tensor_split, "FSDP2 cuts like torch.chunk"),
    (wrong.fsdp_padded_rows, "to_local() holds only the real rows"),
    (wrong.fsdp_last_dim, "FSDP2 shards dim 0 (rows)"),
    (wrong.fsdp_crashes_past_the_end, "ranks past the last chunk hold zero rows"),
], ids=lambda v: v.__name__ if callable(v) else "")
def test_fsdp_shard_check_names_the_mistake(answer, says):
    with pytest.raises(checks.ExerciseError, match="fsdp_local_shard") as info:
        checks.check_fsdp_shard(answer)
    assert says in str(info.value)


@pytest.mark.parametrize("answer, says", [
    (wrong.grid_dp_innermost, "your groups are those of the grid view(pp, tp, dp)"),
    (wrong.grid_pp_innermost, "your groups are those of the grid view(tp, dp, pp)"),
    (wrong.grid_one_group, "groups of"),
    (wrong.grid_unsorted, "in increasing order"),
], ids=lambda v: v.__name__ if callable(v) else "")
def test_rank_grid_check_names_the_mistake(answer, says):
    with pytest.raises(checks.ExerciseError, match="group_ranks") as info:
        checks.check_rank_grid(answer)
    assert says in str(info.value)


@pytest.mark.parametrize("answer, says", [
    (wrong.alpha_beta_whole_buffer, "(n-1)/n of the buffer per pass"),
    (wrong.alpha_beta_one_alpha, "every ring step pays α"),
    (wrong.alpha_beta_all_reduce_one_pass, "a reduce-scatter then an all-gather"),
    (wrong.alpha_beta_single_rank_pays, "one rank has nobody to send to"),
    (wrong.alpha_beta_send_recv_as_ring, "a send/recv is one message"),
], ids=lambda v: v.__name__ if callable(v) else "")
def test_alpha_beta_check_names_the_mistake(answer, says):
    with pytest.raises(checks.ExerciseError, match="collective_seconds") as info:
        checks.check_collective_seconds(answer)
    assert says in str(info.value)


@pytest.mark.parametrize("answer, says", [
    (wrong.slots_token_major, "every token's first choice"),
    (wrong.slots_one_too_many, "slots run 0 .. capacity-1"),
], ids=lambda v: v.__name__ if callable(v) else "")
def test_moe_slots_check_names_the_mistake(answer, says):
    with pytest.raises(checks.ExerciseError, match="assign_slots") as info:
        checks.check_moe_slots(answer)
    assert says in str(info.value)


# ------------------------------------------------------------------------------------------------
# What a learner sees when a check fails: the explanation first, once.

def _in_a_kernel(cells: list[str]) -> list[str]:
    """Run `cells` one by one in a Jupyter kernel, as a notebook does; the text each cell shows (ANSI stripped)."""

    from jupyter_client.manager import start_new_kernel

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(LABS), env=env, startup_timeout=120)
    shown = []
    try:
        for code in cells:
            parts = []
            def keep(msg, parts=parts):
                kind, content = msg["msg_type"], msg["content"]
                if kind == "error":
                    parts.append("\n".join(content["traceback"]) + "\n")
                elif kind == "stream":
                    parts.append(content["text"])
            kc.execute_interactive(code, timeout=240, output_hook=keep)
            shown.append(re.sub(r"\x1b\[[0-9;]*m", "", "".join(parts)))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return shown


def test_a_failed_check_in_a_notebook_shows_its_explanation_first_and_once():
    setup, same_mistake_everywhere, raises_in_a_rank = _in_a_kernel([
        f"import sys; sys.path[:0] = [{str(LABS)!r}, {str(ROOT / 'tests')!r}]\n"
        "import checks, lab_wrong_answers as wrong",
        "checks.check_zero_reduce_scatter(wrong.rs_mean)",           # wrong on 3 ranks x 3 units
        "checks.check_zero_reduce_scatter(wrong.rs_no_padding)",     # raises inside the ranks
    ])
    assert setup == ""
    text = same_mistake_everywhere
    assert text.startswith("ExerciseError: reduce_scatter_grads: 1 problem\n  - the shard is the mean over ranks"), text
    assert text.count("the shard is the mean over ranks") == 1
    assert "(seen at ranks 0, 1, 2; unit [(4, 6), (6,)]" in text and "Traceback" not in text
    text = raises_in_a_rank
    assert text.startswith("ExerciseError: reduce_scatter_grads: 1 problem\n  - rank "), text
    assert text.count("pad it with zeros") == 1 and "During handling" not in text and "WorkerError" not in text
    explanation, _, reference = text.partition("Where your code raised (for reference):")
    assert "pad it with zeros" in explanation and "in rs_no_padding" in reference     # the learner's frame, after


def test_a_failed_check_outside_a_notebook_is_not_chained_to_the_ranks_error():
    script = (f"import sys; sys.path[:0] = [{str(LABS)!r}, {str(ROOT / 'tests')!r}]\n"
              "import checks, lab_wrong_answers as wrong\n"
              "checks.check_zero_reduce_scatter(wrong.rs_no_padding)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], cwd=LABS, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 1
    assert "During handling of the above exception" not in done.stderr and "WorkerError" not in done.stderr
    assert done.stderr.count("pad it with zeros") == 1, done.stderr


def test_the_same_mistake_at_many_places_is_said_once():
    problems = [f"unit {u}, rank {r}: the shard is the mean" for u in ("A", "B") for r in (0, 1, 2)]
    problems += ["unit A, rank 1: returned 3 elements", "not done yet: still raises NotImplementedError"]
    assert checks._merge(problems) == ["the shard is the mean\n      (seen at ranks 0, 1, 2; unit A; unit B)",
                                       "unit A, rank 1: returned 3 elements",
                                       "not done yet: still raises NotImplementedError"]
    with pytest.raises(checks.ExerciseError) as info:
        checks._fail("x", [f"p {i}: mistake {i}" for i in range(12)])
    assert str(info.value).splitlines()[-1] == "  ... and 4 more; fix these first"

@pytest.mark.parametrize("answer, says", [
    (wrong.cp_contiguous, "a contiguous slice leaves the last rank the most causal work"),
    (wrong.cp_shifted_pair, "the mirror is 2·cp-1-r"),
    (wrong.cp_mirror_first, "the early chunk comes first"),
], ids=lambda v: v.__name__ if callable(v) else "")
def test_cp_chunks_check_names_the_mistake(answer, says):
    with pytest.raises(checks.ExerciseError, match="rank_positions") as info:
        checks.check_cp_chunks(answer)
    assert says in str(info.value)
