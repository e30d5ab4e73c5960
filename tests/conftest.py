"""Markers: `gpu` tests skip without CUDA; `browser` tests skip without Debian's chromium.

Browser tests share one built site (`site_server`, built once per session) and one chromium (`chromium`).
"""
import http.server
import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from minimega.run.launch import CPUS_ENV

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


def pytest_configure(config):
    """Under `make test`'s workers each gets its share of the cores, for its own torch ops and the jobs it launches
    (`launch.cpu_share`): two workers with every core each would spin four threads on two cores."""
    # `make test`'s workers get a file's tests together only if pytest-xdist marks each node id with its group
    # ("...::test@group"); pytest 9.2's structured node ids silently undo that (pytest-xdist#1386), and every
    # file's module fixtures then ran on both workers (the covering array's training twice: 390 s).
    if config.getoption("dist", "no") == "loadgroup" and _version(pytest.__version__) >= (9, 2):
        raise pytest.UsageError(f"pytest {pytest.__version__} with pytest-xdist's --dist loadgroup spreads a file's "
                                "tests over the workers (pytest-xdist#1386): install pytest<9.2 as pyproject.toml "
                                "pins it (make install-test)")
    if config.getoption("dist", "no") == "loadgroup":
        config.option.loadscopereorder = False       # xdist's reorder (most tests first) would undo `GROUP_SECONDS`
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = max(1, (os.cpu_count() or 1) // workers)
        os.environ.setdefault(CPUS_ENV, str(share))
        torch.set_num_threads(int(os.environ[CPUS_ENV]))


# `make test-fast` (the everyday loop, under 5 minutes) leaves out `slow` tests: besides those marked in their
# files, these (node id prefixes), each measured above ~8 s on two cores in a full `make test`: four-rank parity
# runs, launcher kill and restart runs that start fresh interpreters, DeepSpeed and torchrun peers, the covering
# array's training, checkpoint trips between layouts, the whole-bank scans, site builds and service start-ups.
# Most have a cheaper sibling in the fast set (two ranks, one layout); `make test` runs them all.
SLOW = ("tests/test_composition.py::test_case_matches_single_process", "tests/test_peers.py", "tests/test_torchrun.py",
        "tests/test_exam_harvest.py", "tests/test_quiz.py::test_practice_shares_no_item_or_fact_with_the_exam",
        "tests/test_launch.py::test_an_edited_source_or_a_dead_forkserver_starts_a_fresh_one",
        "tests/test_launch.py::test_environment_set_after_the_first_launch_reaches_the_ranks",
        "tests/test_launch.py::test_killing_the_launcher_ends_every_rank",
        "tests/test_launch.py::test_worker_in_a_guarded_script",
        "tests/test_launch.py::test_notebook_function_gets_a_clear_error",
        "tests/test_labs.py::test_a_failed_check_outside_a_notebook_is_not_chained_to_the_ranks_error",
        "tests/test_labs.py::test_a_failed_check_in_a_notebook_shows_its_explanation_first_and_once",
        "tests/test_classroom_cli.py::test_load_every_answer_stored_once_and_survives_kill",
        "tests/test_ulysses.py::test_ulysses_matches_single_process[world4]",
        "tests/test_context_parallel.py::test_context_parallel_matches_single_process[world4]",
        "tests/test_pipeline_parallel.py::test_pipeline_matches_single_process[world4]",
        "tests/test_moe.py::test_expert_parallel_matches_single_process[world4]",
        "tests/test_moe.py::test_clipping_counts_every_expert_once[world4]",
        "tests/test_grad_parity.py::test_gradient_matches_single_process[ddp-dp4]",
        "tests/test_grad_parity.py::test_gradient_matches_single_process[zero1-dp4]",
        *(f"tests/test_grad_parity.py::test_gradient_matches_single_process[{case}]"      # the fast set keeps
          for case in ("ddp-dp4-ga2-clip", "zero2-dp4-ga2", "zero3-dp4-persist", "zero1-dp4-offload",  # zero3-dp4-clip,
                       "zero1-dp2-tp2", "zero2-dp2-pp2-zb_h1", "ddp-tp2-pp2-zb_h1")),     # zero2-dp2-pp2, tp2-pp2, pp4-zb
        "tests/test_quiz.py::test_template_answers_match_the_papers_formulas",
        "tests/test_parallel_3d.py::test_matches_single_process[dp2-tp2-zero1]",
        "tests/test_parallel_3d.py::test_matches_single_process[tp2-pp2-1f1b]",
        "tests/test_tensor_parallel.py::test_initialize_leaves_the_callers_model_untouched",
        "tests/test_tensor_parallel.py::test_communication_and_saved_bytes_per_layer[dp1-tp4-V255]",
        "tests/test_tensor_parallel.py::test_regions_and_layers_match_chunked_dense_layers[dp1-tp4-V255]",
        "tests/test_grad_sync.py::test_matches_single_process_and_reduces_each_bucket_once_per_step[dp2-pp2-",
        "tests/test_zero_stages.py::test_stages_match_single_process_fsdp2_and_closed_forms[dp4]",
        "tests/test_measure.py::test_memory_peak_equals_the_formulas[4]",
        "tests/test_checkpoint_interop.py::test_export_dcp_loads_in_torch_plain_and_fsdp2",
        "tests/test_cli.py::test_a_stopped_rank_ends_the_job_naming_it_and_its_collective",
        "tests/test_elastic.py::test_restart_at_the_same_size_ends_on_the_same_bits",
        "tests/test_classroom_cli.py::test_cli_round_trip_revoke_and_rotate",
        "tests/test_checkpoint_safety.py::test_fresh_run_keeps_its_new_checkpoint_when_pruning",
        "tests/test_classroom_site.py::test_no_exam_answer_in_the_built_site",
        "tests/test_cli.py::test_progress_on_a_terminal_is_a_bar", "tests/test_cli.py::test_progress_in_a_log_file_is_plain",
        "tests/test_comm_overlap.py::test_overlap_hides_most_of_the_delay[ddp]",
        "tests/test_comm_overlap.py::test_overlap_hides_most_of_the_delay[zero3]",
        "tests/test_checkpoint_interop.py::test_import_dcp_from_fsdp2_loads_onto_any_layout",
        "tests/test_animations.py::test_zero_phases_equal_a_recorded_commlog[3]",
        "tests/test_checkpoint.py::test_reshard_across_layouts[tp2-pp2-dp2-pp2-zero1]",
        "tests/test_checkpoint.py::test_reshard_across_layouts[dp2-tp2-zero1-tp2-pp2]",
        "tests/test_checkpoint.py::test_every_tensor_survives_a_trip_through_another_layout[tp2-pp2-bf16-dp2-tp2-zero3]",
        "tests/test_checkpoint.py::test_every_tensor_survives_a_trip_through_another_layout[dp2-tp2-zero3-fp16-dp4-",
        "tests/test_checkpoint.py::test_every_tensor_survives_a_trip_through_another_layout[dp4-",
        "tests/test_classroom_dockerfile.py::test_cmd_refuses_to_start_without_a_",
        "tests/test_classroom_exam_api.py::test_openapi_fuzz_finds_no_server_error",
        *(f"tests/test_llama_blocks.py::test_layout_matches_single_process[{case}]"      # the fast set keeps world 2
          for case in ("tp2-cp2-ring", "tp2-cp2-ulysses", "dp2-tp2-zero2-sp", "tp2-selective", "cp2-ulysses")),
        "tests/test_moe_shared.py::test_cli_trains_shared_and_fine_grained_experts",
        "tests/test_moe_compose.py::test_moe_composes_with_cp_and_zero2[world4]",          # the fast set keeps world 2
        "tests/test_labs.py::test_ring_check_reports_a_hang_instead_of_waiting_forever",   # waits out a timeout
        "tests/test_tensor_parallel.py::test_parity_with_single_process[dp1-tp4-V255]",
        "tests/test_classroom_dockerfile.py::test_cmd_with_dev_set_explicitly_serves_links_on_the_page",
        "tests/test_checkpoint_memory.py::test_save_and_load_cost_a_shard_per_rank",
        "tests/test_a11y_browser.py::test_every_page_and_exam_state_has_no_serious_violation")   # axe on ~120 views


# Session fixtures that cost seconds to set up: the course site's build (~20 s) and a PostgreSQL server.
SHARED_SESSION = {"site_build": "site-build", "site_server": "site-build", "postgres_server": "postgres"}

# The groups that take longest, in worker-seconds of a full `make test` on two cores (a fresh clone's run,
# `--durations=0` summed per group). The workers take the longest groups first and the short ones last, so neither
# waits idle at the end of the run while the other finishes a minute-long group it took late (a lab's notebooks).
# A group not listed is reckoned at half a second per test.
GROUP_SECONDS = {"site-build": 440, "tests/test_slurm.py": 112, "tests/test_composition.py": 91,
                 "tests/test_checkpoint.py": 70, "tests/test_launch.py": 67, "tests/test_dry_run.py": 63,
                 "labs nbval": 50, "tests/test_cli.py": 30, "tests/test_peers.py": 26, "postgres": 25,
                 "tests/test_exam_banks.py": 23, "tests/test_torchrun.py": 22}


def _group_seconds(group: str, tests: int) -> float:
    if "test_labs_run_under_nbval" in group:
        return GROUP_SECONDS["labs nbval"]
    return GROUP_SECONDS.get(group, 0.5 * tests)


@pytest.hookimpl(tryfirst=True)               # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Skips what this machine cannot run, and groups the tests for `make test`'s two workers (pytest-xdist,
    ``--dist loadgroup``): a file's tests share its module fixtures, so a file runs on one worker; the labs
    (each notebook its own process tree) spread over both; the files on one `SHARED_SESSION` fixture share one."""
    xdist = config.pluginmanager.hasplugin("xdist")     # `-p no:xdist` runs in this process, ungrouped
    # The files on one costly session fixture share one worker, so it is set up once per run, not per worker.
    shared = {}
    for item in items:
        for fixture, name in SHARED_SESSION.items():
            if fixture in item.fixturenames:
                shared.setdefault(item.nodeid.split("::")[0], name)
    groups = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        groups[item.nodeid] = group = item.nodeid if path.endswith("test_labs.py") else shared.get(path, path)
        if xdist:
            item.add_marker(pytest.mark.xdist_group(group))
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
    if xdist:               # the longest groups first (`GROUP_SECONDS`); the workers' collection order is the queue's
        sizes = Counter(groups.values())                 # in the order the groups first appear
        rank = {g: (-_group_seconds(g, n), i) for i, (g, n) in enumerate(sizes.items())}
        items.sort(key=lambda item: rank[groups[item.nodeid]])
    no_gpu = pytest.mark.skip(reason="needs CUDA")
    no_browser = pytest.mark.skip(reason="needs /usr/bin/chromium (apt-get install -y chromium)")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "browser" in item.keywords and not os.path.exists(CHROMIUM):
            item.add_marker(no_browser)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def site_server(site_build):
    """The session's one build of the course site (`site_support.site_build`), served; its base URL."""
    return site_build.base


@pytest.fixture(scope="session")
def playwright():
    """Playwright's sync API, started once: a thread may hold only one at a time, so every browser test uses this."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        yield p


@pytest.fixture(scope="session")
def chromium(playwright):
    """One Debian chromium for the session, driven by Playwright."""
    b = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
    yield b
    b.close()


from postgres_support import postgres_server  # noqa: E402,F401  (one PostgreSQL server for the whole session)
from site_support import site_build  # noqa: E402,F401  (one build of the course site for the whole session)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Every skipped test and why, in one block at the end of the run: on a CPU machine only the GPU tests may skip,
    and any other skip is named as a gap (`make test` installs the system packages the rest need)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    gaps = [r for r in skipped if "gpu" not in r.keywords]
    terminalreporter.section(f"{len(skipped)} skipped ({len(gaps)} not GPU tests)")
    for r in skipped:
        reason = r.longrepr[2] if isinstance(r.longrepr, tuple) else str(r.longrepr)
        terminalreporter.write_line(f"{'gpu ' if 'gpu' in r.keywords else 'GAP '} {r.nodeid}: {reason}")

