"""Write the lab notebooks from their cell lists (in ``labs/notebooks/``), optionally running them.

    python labs/make_notebooks.py                     # write every labs/NN-slug.ipynb, no outputs
    python labs/make_notebooks.py --execute 01-memory # write and run one, storing its outputs

Outputs are stored because nbval compares the cells marked ``# NBVAL_CHECK_OUTPUT`` with them. Run with
``MINIMEGA_LAB_SOLUTIONS=1`` so the check cells use the reference solutions, as the tests do.

A lab's source is ``labs/notebooks/<slug>.py``: cells separated by lines ``# %%`` (code) or
``# %% [markdown]`` (markdown, each line starting with ``# ``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat

LABS = Path(__file__).resolve().parent
SOURCES = LABS / "notebooks"


def parse(text: str) -> list:
    """Cells of a ``# %%`` source file."""
    cells, kind, lines = [], None, []

    def flush():
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in body.splitlines())
            cells.append(nbformat.v4.new_markdown_cell(body))
        elif kind == "code":
            cells.append(nbformat.v4.new_code_cell(body))

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            kind, lines = ("markdown" if "[markdown]" in line else "code"), []
        elif kind is not None:
            lines.append(line)
    flush()
    return cells


def build(slug: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = parse((SOURCES / f"{slug}.py").read_text(encoding="utf-8"))
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
    return nb


def _merge_streams(outputs: list) -> list:
    merged = []
    for out in outputs:
        if merged and out.output_type == "stream" and merged[-1].output_type == "stream" \
                and merged[-1].name == out.name:
            merged[-1].text += out.text
        else:
            merged.append(out)
    return merged


def execute(nb: nbformat.NotebookNode, timeout: float = 300) -> float:
    """Run every code cell in a fresh ``python3`` kernel started in ``labs/``; store outputs; return seconds."""
    from jupyter_client.manager import start_new_kernel

    env = dict(os.environ)
    # The kernel starts in labs/: make PYTHONPATH absolute, or a relative `src` would miss this checkout's package.
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(LABS), env=env)
    start = time.perf_counter()
    try:
        count = 0
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            outputs = []

            def hook(msg, outputs=outputs):
                kind = msg["msg_type"]
                if kind == "clear_output":
                    outputs.clear()
                elif kind in ("stream", "display_data", "execute_result", "error"):
                    outputs.append(nbformat.v4.output_from_msg(msg))

            began = time.perf_counter()
            reply = kc.execute_interactive(cell.source, output_hook=hook, timeout=timeout)
            count += 1
            print(f"  cell {count}: {time.perf_counter() - began:5.1f} s  {cell.source.splitlines()[-1][:60]}",
                  file=sys.stderr)
            cell.execution_count = count
            for out in outputs:
                if "execution_count" in out:
                    out.execution_count = count
            cell.outputs = _merge_streams(outputs)
            if reply["content"]["status"] != "ok":
                raise RuntimeError(f"cell {count} failed:\n{cell.source}\n\n" + "\n".join(reply["content"]["traceback"]))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("slugs", nargs="*", help="labs to build (default: all)")
    parser.add_argument("--execute", action="store_true", help="run each notebook and store its outputs")
    args = parser.parse_args(argv)
    slugs = args.slugs or sorted(p.stem for p in SOURCES.glob("*.py"))
    for slug in slugs:
        nb = build(slug)
        note = ""
        if args.execute:
            note = f" (ran in {execute(nb):.1f} s)"
        nbformat.write(nb, LABS / f"{slug}.ipynb")
        print(f"wrote labs/{slug}.ipynb{note}", file=sys.stderr)


if __name__ == "__main__":
    main()
