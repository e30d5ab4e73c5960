"""How `minimega` refuses bad input and how its help and progress read (no rank is started here)."""
import argparse
import io

import pytest

from minimega.tools.cli import build_parser, main
from minimega.pipeline.printer import grid_from_plan, legend
from minimega.pipeline.schedules import plan
from minimega.tools.progress import StepProgress, mode_for


def refusal(argv, capsys) -> str:
    """The stderr of a refused command line (argparse exits 2; the train checks return 2)."""
    code = main(argv)
    assert code == 2, f"{argv} was accepted"
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


BAD_VALUES = [
    (["--steps", "0"], "--steps", ">= 1"),
    (["--steps", "-3"], "--steps", ">= 1"),
    (["--steps", "ten"], "--steps", "integer"),
    (["--nproc", "0"], "--nproc", ">= 1"),
    (["--dp", "0"], "--dp", ">= 1"),
    (["--save-every", "-1"], "--save-every", ">= 0"),
    (["--timeout", "0"], "--timeout", "> 0"),
    (["--timeout", "inf"], "--timeout", "finite"),
    (["--max-restarts", "-1"], "--max-restarts", ">= 0"),
    (["--min-nproc", "0"], "--min-nproc", ">= 1"),
    (["--experts", "0"], "--experts", ">= 1"),
    (["--experts", "4", "--capacity-factor", "-1"], "--capacity-factor", "> 0"),
    (["--experts", "4", "--moe-z-loss", "-1"], "--moe-z-loss", ">= 0"),
    (["--experts", "4", "--moe-bias-rate", "nan"], "--moe-bias-rate", ">= 0"),
    (["--moe-dispatch", "dropless"], "--moe-dispatch", "--experts N"),
    (["--experts", "4", "--shared-experts", "-1"], "--shared-experts", ">= 0"),
    (["--experts", "4", "--expert-hidden", "0"], "--expert-hidden", ">= 1"),
    (["--shared-experts", "1"], "--shared-experts", "--experts N"),
    (["--tp", "0"], "--tp", "positive integer"),              # refused by TrainConfig, named by its flag
    (["--zero-stage", "7"], "--zero-stage", "0, 1, 2 or 3"),
    (["--lr", "-1"], "--lr", "> 0"),
    (["--micro-batches", "4"], "--micro-batches", "pp > 1"),
    (["--nproc", "2", "--min-nproc", "3"], "--min-nproc", "[1, --nproc=2]"),
]


@pytest.mark.parametrize("argv,flag,change", BAD_VALUES, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_bad_value_is_one_line_naming_the_flag_and_what_to_give(argv, flag, change, capsys):
    err = refusal(["train", *argv], capsys)
    assert err.count("\n") == 1 and err.startswith("minimega train: error: "), err   # no usage, no job banner
    assert flag in err and change in err, err
    assert "Config." not in err and "usage:" not in err


PLAN = ["plan", "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "8"]


@pytest.mark.parametrize("argv,flag,change", [
    (["plan", "--model", "gpt2-124m", "--nodes", "0", "--global-batch", "8"], "--nodes", ">= 1"),
    (["plan", "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "0"], "--global-batch", ">= 1"),
    (PLAN + ["--top", "-1"], "--top", ">= 1"),
    (PLAN + ["--memory-fraction", "1.5"], "--memory-fraction", "(0, 1]"),
    (PLAN + ["--price", "-2"], "--price", ">= 0"),
    (PLAN + ["--layers", "0"], "--layers", ">= 1"),
    (PLAN + ["--experts", "-1"], "--experts", ">= 0"),
    (["estimate", "--params", "7.5e9", "--dp", "0"], "--dp", ">= 1"),
    (["estimate", "--params", "-1"], "--params", "> 0"),
], ids=lambda v: " ".join(v[-2:]) if isinstance(v, list) else None)
def test_plan_and_estimate_refuse_bad_values_by_flag(argv, flag, change, capsys):
    err = refusal(argv, capsys)
    assert err.count("\n") == 1 and err.startswith(f"minimega {argv[0]}: error: {flag}: "), err
    assert change in err, err


@pytest.mark.parametrize("argv,usage", [
    (["train", "--stpes", "3"], "usage: minimega train "),
    (["checkpoint", "consolidate", "ck", "out.safetensors", "--force"], "usage: minimega checkpoint consolidate "),
    (["estimate", "--params", "1e9", "--stage", "2", "--gpus", "8"], "usage: minimega estimate "),
])
def test_an_unknown_flag_shows_the_sub_commands_usage(argv, usage, capsys):
    err = refusal(argv, capsys)
    assert err.startswith(usage), err
    assert f"error: unrecognized arguments: {argv[-2] if argv[-1].isdigit() else argv[-1]}" in err


def every_parser(parser, path=("minimega",)):
    yield " ".join(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_parser(sub, (*path, name))


def test_no_help_text_shows_restructuredtext_backticks():
    helps = dict((path, p.format_help()) for path, p in every_parser(build_parser()))
    assert len(helps) > 15 and "minimega plan" in helps and "minimega cert verify" in helps
    for path, text in helps.items():
        assert "``" not in text, f"{path} --help: {[ln for ln in text.splitlines() if '``' in ln]}"
    assert "Example: `peak_tflops=312" in helps["minimega plan"]       # the docstring's quoting, made plain


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_in_a_log_is_short_plain_lines():
    log = io.StringIO()
    assert mode_for(log) == "lines"
    progress = StepProgress(25, mode_for(log), log)
    for done in range(1, 26):
        progress.update(done, 5.0 - done / 10, 1234.5)
    progress.close()
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0] == "step 2/25  loss 4.8000  1,234 tok/s" and lines[-1].startswith("step 25/25  loss 2.5000")
    assert len(lines) == 13 and max(map(len, lines)) < 80          # every 2nd step (25 // 10) and the last


def test_progress_on_a_terminal_is_a_tqdm_bar():
    tty = Terminal()
    assert mode_for(tty) == "bar"
    progress = StepProgress(25, mode_for(tty), tty)
    for done in range(1, 26):
        progress.update(done, 5.0 - done / 10, 1234.5)
    progress.close()
    text = tty.getvalue()
    assert "\r" in text and "100%|" in text and "25/25 [" in text and ", loss 2.5000 | 1,234 tok/s]" in text


def test_the_schedule_legend_explains_every_cell_kind():
    text = legend(grid_from_plan(plan("1f1b", 2, 4)))
    assert "F<m>  forward of micro-batch m" in text and "B<m>  backward" in text and "idle" in text
    assert "(p-1)/(m+p-1)" in text and "chunk" not in text
    assert "F<m>  forward of micro-batch m on model chunk :<c>" in legend(grid_from_plan(plan("interleaved_1f1b", 2, 2, 2)))
    zb = legend(grid_from_plan(plan("zb_h1", 2, 4)))
    assert "B<m>  backward of micro-batch m (its input gradient only)" in zb and "W<m>  weight gradient" in zb
    assert "ZB-H1 (p-1)/(3m+p-1)" in zb and "W<m>" not in text
