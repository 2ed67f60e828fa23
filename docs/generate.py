"""Write the docs' generated inputs before Sphinx runs (called by `bash docs/build`).

- docs/tutorials/NN_*.ipynb: every walkthrough examples/NN*.py (jupytext "percent" scripts), in name order
  (the learning path), converted to a notebook that MyST-NB then executes. Hidden cells are added: one at
  the top that selects the quick mode and an empty folder for the figures, and runs from the checkout's root
  with `__file__` set as a script would, and one after each code cell that shows the figures that cell
  saved (the walkthroughs write PNG files; the page shows them where they were made).
- docs/_generated/parity.md: the parity table, from `transformer-parity --json` run now.
- docs/_generated/speed.md, flash_attention.md, training.md (and the tiled-attention plot and the training
  loss curves): from the JSON files checked in under docs/data/ (see docs/record.py), each with the date and
  machine it was measured on.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import jupytext
import nbformat

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
GENERATED = DOCS / "_generated"
TUTORIALS = DOCS / "tutorials"
FIGURES = DOCS / "_build" / "walkthrough_figures"  # where the executed walkthroughs write their PNGs
DATA = DOCS / "data"

SETUP = """\
# Added by docs/generate.py: the quick mode, an empty folder for the figures, the checkout on the path.
import os, shutil, sys, warnings
os.environ["WALKTHROUGH_QUICK"] = "1"
os.environ["WALKTHROUGH_OUT"] = {out!r}
shutil.rmtree({out!r}, ignore_errors=True)
os.makedirs({out!r})
sys.path.insert(0, {root!r})
os.chdir({root!r})  # as `python examples/NN_name.py` runs from the checkout's root
__file__ = {script!r}  # so that the walkthrough finds its own folder (examples/data/...) as a script does
warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm, in a kernel without ipywidgets


def _docs_show_new_figures(_seen=set()):
    from pathlib import Path
    from IPython.display import Image, display

    for path in sorted(Path({out!r}).glob("*.png"), key=lambda p: p.stat().st_mtime):
        if path not in _seen:
            _seen.add(path)
            display(Image(filename=str(path)))
"""


# --- Tutorials -----------------------------------------------------------------------------------------------


def walkthroughs() -> list[Path]:
    """The walkthroughs, in the order of the learning path (their names sort that way: 01, 01b, 02, ...)."""
    return sorted(ROOT.glob("examples/[0-9][0-9]*.py"))


LINK = re.compile(r"\]\((?!https?:|#|/)([^)\s]+)\)")


def relink(markdown: str) -> str:
    """Links of a walkthrough are relative to examples/; from docs/tutorials/ the docs pages are one level up."""

    def fix(match: re.Match) -> str:
        target = (ROOT / "examples" / match.group(1)).resolve()
        if target.is_relative_to(DOCS):
            return "](" + os.path.relpath(target, TUTORIALS) + ")"
        return match.group(0)

    return LINK.sub(fix, markdown)


def tutorial_notebook(script: Path) -> nbformat.NotebookNode:
    """The walkthrough as a notebook, with the hidden set-up cell and a figure cell after each code cell."""
    nb = jupytext.read(script)
    out = FIGURES / script.stem
    hidden = {"tags": ["remove-cell"]}
    setup = SETUP.format(out=str(out), root=str(ROOT), script=str(script))
    cells = [nbformat.v4.new_code_cell(setup, metadata=hidden)]
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = relink(cell.source)
        cells.append(cell)
        if cell.cell_type == "code":
            show = nbformat.v4.new_code_cell("_docs_show_new_figures()", metadata={"tags": ["remove-input"]})
            cells.append(show)
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def write_tutorials() -> list[str]:
    """Write one notebook per walkthrough into docs/tutorials/, removing those of walkthroughs now gone."""
    TUTORIALS.mkdir(exist_ok=True)
    names = []
    for script in walkthroughs():
        nbformat.write(tutorial_notebook(script), TUTORIALS / f"{script.stem}.ipynb")
        names.append(script.stem)
    for old in TUTORIALS.glob("*.ipynb"):
        if old.stem not in names:
            old.unlink()
    return names


# --- Workbook -------------------------------------------------------------------------------------------------

WORKBOOK = DOCS / "workbook"
EXERCISE = re.compile(r"^(\d+)\. (.*)")  # "1. **Title.** text", the numbered list of a walkthrough's exercises
ANSWER = re.compile(r"^### Exercise (\d+): (.*)$")


def exercises(script: Path) -> dict[int, str]:
    """The numbered items of a walkthrough's "## Exercises" cell: number -> the item's text."""
    items: dict[int, str] = {}
    for cell in jupytext.read(script).cells:
        lines = cell.source.splitlines()
        if cell.cell_type != "markdown" or "## Exercises" not in (line.strip() for line in lines):
            continue
        number = None
        for line in lines[[line.strip() for line in lines].index("## Exercises") + 1 :]:
            match = EXERCISE.match(line)
            if match:
                number = int(match.group(1))
                items[number] = match.group(2)
            elif number is not None and line.startswith("   "):
                items[number] += "\n" + line.strip()
            elif number is not None and line.strip():
                number = None  # the list has ended
    return items


def answers(path: Path) -> dict[int, tuple[str, str]]:
    """An answers file's worked answers: number -> (title, the answer as Markdown, its code in fenced blocks)."""
    found: dict[int, list] = {}
    current = None
    for cell in jupytext.read(path).cells:
        first = cell.source.splitlines()[0] if cell.source else ""
        match = ANSWER.match(first) if cell.cell_type == "markdown" else None
        if match:
            current = int(match.group(1))
            body = "\n".join(cell.source.splitlines()[1:]).strip()
            found[current] = [match.group(2), [relink(body)] if body else []]
        elif current is not None:
            if cell.cell_type == "markdown":
                found[current][1].append(relink(cell.source))
            else:
                found[current][1].append("```python\n" + cell.source.strip() + "\n```")
    return {n: (title, "\n\n".join(parts)) for n, (title, parts) in found.items()}


def write_workbook() -> int:
    """One page per exercise under docs/workbook/: the exercise as its walkthrough states it, then the worked
    answer (from examples/answers/, where the test suite runs and checks it), folded until the reader opens it."""
    WORKBOOK.mkdir(exist_ok=True)
    for old in WORKBOOK.glob("*.md"):
        old.unlink()
    pages = []
    for script in walkthroughs():
        number = script.stem.split("_", 1)[0]
        answer_file = ROOT / "examples" / "answers" / f"{number}_answers.py"
        items = exercises(script)
        if not items or not answer_file.is_file():
            continue
        worked = answers(answer_file)
        # what the walkthrough's exercises are checked with: the judge for a torch model, else finite differences
        judged = "check.module" in script.read_text().partition("\n# ## Exercises\n")[2]
        checker = "the judge, `parity_tests.check.module`" if judged else "`numpy_transformer.gradcheck.check_pair`"
        title = re.sub(r"^[\w.]+\. ", "", jupytext.read(script).cells[0].source.splitlines()[0].lstrip("# ").strip())
        for n, text in sorted(items.items()):
            name = f"{number}_exercise_{n}"
            heading = worked[n][0] if n in worked else f"exercise {n}"
            heading = heading[:1].upper() + heading[1:]
            answer = worked[n][1] if n in worked else "The answers file has no worked answer for this exercise."
            page = (
                f"# {number}.{n} {heading}\n\n"
                f"Exercise {n} of walkthrough {number}, [{title}](../tutorials/{script.stem}.ipynb):\n\n"
                f"{text}\n\n"
                f"Try it first; check your answer with {checker}.\n\n"
                "<details>\n<summary>The worked answer (click to open)</summary>\n\n"
                f"{answer}\n\n"
                f"The whole file, which the test suite runs and checks: `examples/answers/{answer_file.name}`.\n\n"
                "</details>\n"
            )
            (WORKBOOK / f"{name}.md").write_text(page)
            pages.append((name, number, n, heading))
    listing = "\n".join(f"- [{number}.{n} {heading}]({name}.md)" for name, number, n, heading in pages)
    toc = "\n".join(name for name, *_ in pages)
    (WORKBOOK / "index.md").write_text(
        "# Workbook\n\nEvery exercise of the walkthroughs, one page each, with its worked answer folded "
        "underneath: try it, then open the answer.\n\n"
        f"{listing}\n\n```{{toctree}}\n:hidden:\n\n{toc}\n```\n"
    )
    return len(pages)


# --- Reference ------------------------------------------------------------------------------------------------

PACKAGES = {
    "numpy_transformer": "The NumPy reference: every forward and backward by hand.",
    "torch_transformer": "The PyTorch twin: the same models, names and state dicts, autograd for the backward.",
    "parity_tests": "The comparisons: the parity report and the helpers the tests share (not the tests themselves).",
}


def modules(package: str) -> list[str]:
    """The package and its public modules (no tests, no private modules, nothing in a folder that is not a package:
    the grader's attack submissions), found on disk, so a new one is listed."""
    folder = ROOT / package
    names = [package]
    for path in sorted(folder.rglob("*.py")):
        if not (path.parent / "__init__.py").exists():
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts == (package,) or any(p.startswith(("_", "test_", "conftest")) for p in parts):
            continue
        names.append(".".join(parts))
    return names


def module_file(module: str) -> Path:
    """The source file of a module or package of this checkout."""
    path = ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def first_line(module: str) -> str:
    """The first paragraph of a module's docstring, for its page's title (read from the source, not imported)."""
    doc = (ast.get_docstring(ast.parse(module_file(module).read_text())) or "").strip()
    return " ".join(doc.split("\n\n")[0].split()).rstrip(".")  # its first paragraph, on one line


def write_reference() -> int:
    """One page per module under docs/reference/api/, and an index per package: autodoc fills them in."""
    api = DOCS / "reference" / "api"
    api.mkdir(exist_ok=True)
    for old in api.glob("*.md"):
        old.unlink()
    count = 0
    for package, blurb in PACKAGES.items():
        names = modules(package)
        for name in names[1:]:
            title = f"`{name.removeprefix(package + '.')}`" + (f": {first_line(name)}" if first_line(name) else "")
            # a subpackage's members are documented in its own modules' pages, once
            options = "\n   :no-members:" if module_file(name).name == "__init__.py" else ""
            (api / f"{name}.md").write_text(f"# {title}\n\n```{{eval-rst}}\n.. automodule:: {name}{options}\n```\n")
            count += 1
        listing = "\n".join(f"{name}" for name in names[1:])
        (api / f"index_{package}.md").write_text(
            f"# `{package}`" + (f": {first_line(package)}" if first_line(package) else "") + f"\n\n{blurb}\n\n"
            f"```{{eval-rst}}\n.. automodule:: {package}\n   :no-members:\n```\n\n"
            f"```{{toctree}}\n:maxdepth: 1\n\n{listing}\n```\n"
        )
    return count


# --- Tables --------------------------------------------------------------------------------------------------


def fmt(x, spec: str = ".1e") -> str:
    """A number for a table cell; an em dash where there is none."""
    return "—" if x is None else format(x, spec)


def table(header: list[str], rows: list[list[str]], nowrap: bool = False) -> str:
    """A Markdown table; `nowrap` keeps every cell on one line (a table of figures), scrolled if too wide."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    text = "\n".join(lines) + "\n"
    return f":::{{container}} nowrap\n{text}:::\n" if nowrap else text


def parity_group(component: str) -> str:
    """Which comparison a parity row belongs to."""
    if component.startswith("nn."):
        return "torch.nn built-in layers"
    if component.startswith(("HF ", "all-MiniLM")):
        return "Hugging Face transformers"
    if component.split(" ")[0] in {"Transformer", "TransformerLM", "EncoderModel"}:
        return "whole models vs torch_transformer"
    return "components vs torch_transformer"


def parity_markdown(report: dict) -> str:
    """The parity report as Markdown: the worst error of each group and dtype, then every row."""
    records = report["records"]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((parity_group(r["component"]), r["dtype"]), []).append(r)
    summary = []
    for (group, dtype), rs in groups.items():
        worst = [
            max((r[k] for r in rs if r[k] is not None), default=None) for k in ("output_rel_error", "grad_rel_error")
        ]
        fd = max((r["fd_rel_error"] for r in rs if r["fd_rel_error"] is not None), default=None)
        passed = sum(r["passed"] for r in rs)
        summary.append([group, dtype, len(rs), fmt(worst[0]), fmt(worst[1]), fmt(fd), f"{passed} of {len(rs)}"])
    rows = []
    for r in records:
        rows.append(
            [
                r["component"],
                r["dtype"],
                r["device"],
                fmt(r["output_rel_error"]),
                fmt(r["grad_rel_error"]),
                r["n_gradients"],
                fmt(r["fd_rel_error"]),
                fmt(r["bar"], ".0e" if r["bar"] in (1e-10, 1e-5) else ".1e"),
                "pass" if r["passed"] else "**FAIL**",
            ]
        )
    head = (
        f"Generated by this build: `transformer-parity --json` ran in {report['seconds']:.0f} s with "
        f"Python {report['python']}, NumPy {report['numpy']} and torch {report['torch']}; "
        f"{sum(r['passed'] for r in records)} of {len(records)} rows pass.\n\n"
    )
    return (
        head + "**Worst relative error per comparison** (outputs, gradients; the finite-difference error of the "
        "NumPy backward where it is checked):\n\n"
        + table(["comparison", "dtype", "rows", "outputs", "gradients", "finite differences", "passed"], summary, True)
        + "\n**Every row:**\n\n"
        + table(
            ["component", "dtype", "device", "outputs", "gradients", "# grads", "fin. diff.", "bar", ""], rows, True
        )
    )


def recorded_line(record: dict) -> str:
    """Where and when a checked-in measurement was taken, and by which command."""
    info, m = record["recorded"], record["recorded"]["machine"]
    core = f", `OPENBLAS_CORETYPE={m['openblas_coretype']}`" if m.get("openblas_coretype") else ""
    if info.get("load_average"):
        core += ", load average {:.1f} before and {:.1f} after (other processes on the same cores)".format(
            *info["load_average"]
        )
    return (
        f"*Measured {info['date'][:10]} on {m['cpu']}, {m['cores']} cores{core}; Python {m['python']}, "
        f"NumPy {m['numpy']}, torch {m['torch']}.* Command: `{' '.join(info['command'])}`\n\n"
    )


def speed_markdown(record: dict) -> str:
    """bench.py's JSON as tables: training step, forward, ceilings, memory, MiniLM, decoding, compile, DDP."""
    d = record["data"]
    c = d["config"]
    impls = ["numpy", "numpy_parallel", "torch"]
    ms = lambda s: fmt(None if s is None else s * 1e3, ",.1f") + " ms"  # noqa: E731
    out = recorded_line(record)
    out += (
        f"Model: d_model {c['d_model']}, {c['n_heads']} heads, d_ff {c['d_ff']}, "
        f"{c['n_encoder_layers']} + {c['n_decoder_layers']} layers, vocabularies {c['src_vocab_size']} / "
        f"{c['tgt_vocab_size']}; batches of {d['batch']} × ({d['src_len']} + {d['tgt_len']}) tokens, float32; "
        f"allocator: {d['machine'].get('allocator', '—')}.\n\n"
    )
    rows = [
        ["training step (forward, loss, backward, Adam)"]
        + [ms(d["train_step_seconds"][i]) for i in impls]
        + [
            fmt(d["train_step_ratio_numpy_over_torch"], ".2f"),
            fmt(d["train_step_ratio_numpy_parallel_over_torch"], ".2f"),
        ],
        ["forward pass, evaluation mode"]
        + [ms(d["forward_seconds"][i]) for i in impls]
        + [fmt(d["forward_ratio_numpy_over_torch"], ".2f"), fmt(d["forward_ratio_numpy_parallel_over_torch"], ".2f")],
        ["matrix-product ceiling (the step's own products)"]
        + [fmt(d["matmul_ceiling_gflops"][i], ",.1f") + " GFLOP/s" for i in impls]
        + ["", ""],
        [f"achieved in the step ({d['train_step_gflop']:.3g} GFLOP of products), fraction of that ceiling"]
        + [
            f"{fmt(d['train_step_gflops'][i], ',.1f')} GFLOP/s, {d['train_step_fraction_of_ceiling'][i]:.0%}"
            for i in impls
        ]
        + ["", ""],
        ["peak memory of training (fresh process)"]
        + [fmt(d["peak_memory_mib"][i], ",.0f") + " MiB" for i in impls]
        + [
            fmt(d["peak_memory_mib"]["numpy"] / d["peak_memory_mib"]["torch"], ".2f"),
            fmt(d["peak_memory_mib"]["numpy_parallel"] / d["peak_memory_mib"]["torch"], ".2f"),
        ],
    ]
    mini = d.get("minilm_forward_seconds")
    if mini:
        rows.append(
            [f"all-MiniLM-L6-v2 forward, {mini['batch']} × {mini['tokens']} tokens, vs `transformers`' `BertModel`"]
            + [ms(mini[i]) for i in impls]
            + [fmt(mini["ratio_numpy_over_torch"], ".2f"), fmt(mini["ratio_numpy_parallel_over_torch"], ".2f")]
        )
    header = [
        "",
        "NumPy, plain path",
        "NumPy, fast path",
        "torch_transformer (CPU eager)",
        "plain / torch",
        "fast / torch",
    ]
    out += table(header, rows)
    dec = d.get("decode_seconds_per_token")
    if dec:
        out += "\n**Greedy decoding, per token** (KV cache / recomputing every prefix):\n\n"
        out += table(
            ["", "cached", "recomputed"],
            [
                [side, ms(dec[f"{side} cached"]), ms(dec[f"{side} recomputed"])]
                for side in ("numpy", "torch")
                if f"{side} cached" in dec
            ],
        )
    breakdown = d.get("numpy_step_breakdown_seconds")
    if breakdown:
        total = breakdown["total"]
        out += "\n**Where the plain NumPy step spends its time** (one profiled step):\n\n"
        out += table(
            ["kind of work", "time", "share"],
            [[k, ms(v), f"{v / total:.0%}"] for k, v in breakdown.items() if k != "total"],
        )
    comp = d.get("compiled_train_step_seconds")
    if comp:
        for device, t in comp.items():
            if device == "backend":
                continue
            out += (
                f"\n**torch.compile** ({comp['backend']}, {device}): eager step {ms(t['eager'])}, compiled "
                f"{ms(t['compiled'])} ({t['speedup']:.2f}× speed-up; the first compiled step "
                f"{t['compile_seconds']:.1f} s).\n"
            )
    ddp = d.get("ddp_train_step_seconds")
    if ddp:
        out += (
            f"\n**DDP** ({ddp['processes']} processes, gloo, one thread each, half the batch each): "
            f"{ms(ddp['ddp'])} per step, against one process on one thread {ms(ddp['one_process_1_thread'])} "
            f"and on {ddp['all_threads']} threads {ms(ddp['one_process_all_threads'])}; an all-reduce of the "
            f"{ddp['gradient_mib']:.1f} MiB of gradients {ms(ddp['allreduce_seconds'])}.\n"
        )
    return out


def flash_markdown(record: dict) -> str:
    """benchmarks/flash_attention.py's JSON as a table: peak memory and time per length, kernel and mask."""
    d = record["data"]
    s = d["shape"]
    out = recorded_line(record)
    out += (
        f"B = {s['B']}, H = {s['H']}, Dh = {s['Dh']}, {s['dtype']}, one forward + backward. The plain pair is "
        f"skipped where it would need more than {d['plain_limit_gb'] * 1024:.0f} MiB.\n\n"
    )
    cells: dict[tuple[int, bool], dict[str, str]] = {}
    for r in d["rows"]:
        if r["skipped"]:
            text = r["skipped"]
        else:
            peak = "—" if r["peak_mib"] is None else f"{r['peak_mib']:,.1f} MiB"
            text = f"{peak} / {r['seconds'] * 1e3:,.1f} ms"
        cells.setdefault((r["T"], r["causal"]), {})[r["kernel"]] = text
    rows = [
        [f"{T:,}", "causal" if causal else "full"] + [k.get(name, "—") for name in ("plain", "tiled", "torch")]
        for (T, causal), k in sorted(cells.items())
    ]
    header = ["T", "mask", "plain pair: peak / time", "tiled pair: peak / time", "torch SDPA: peak / time"]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import flash_attention  # the benchmark's own plot, drawn from the recorded rows

    flash_attention.plot(d["rows"], GENERATED / "flash_attention.png")
    figure = "![Peak memory and time against the sequence length, from the rows above](/_generated/flash_attention.png)"
    return out + table(header, rows, nowrap=True) + "\n" + figure + "\n"


def llm_decode_markdown(record: dict) -> str:
    """bench.py --llm-decode's JSON as a table: tokens/s of greedy decoding against generate(), and the fraction of
    the memory-bandwidth ceiling, per batch size."""
    d = record["data"]
    m = d["model"]
    out = recorded_line(record)
    out += (
        f"A Qwen2-shaped model of {d['parameters'] / 1e6:.0f}M parameters (hidden {m['hidden']}, {m['layers']} "
        f"layers, {m['heads']} query and {m['kv_heads']} key/value heads, vocabulary {m['vocab']:,}, tied), float32, "
        f"random weights; prompt {m['prompt']} tokens, {m['tokens']} generated, greedy, the KV cache on both sides. "
        "Ceiling: the weights and the cache read once a step, at the rate of matrix-vector products over the "
        "model's own weight matrices (each once), timed between the decoding runs (the median, as theirs).\n\n"
    )
    rows = []
    for key, r in d.items():
        if key.startswith("batch "):
            tps, frac = r["tokens_per_second"], r["fraction_of_bandwidth_ceiling"]
            speed = [f"{tps['numpy']:.1f}", f"{tps['generate']:.1f}", f"{r['speedup_over_generate']:.2f}x"]
            ceiling = f"{r['matvec_gb_per_second']:.1f}"
            rows.append(
                [key.removeprefix("batch "), *speed, ceiling, f"{frac['numpy']:.0%}", f"{frac['generate']:.0%}"]
            )
    header = ["batch", "numpy tokens/s", "generate() tokens/s", "numpy / generate()", "ceiling GB/s",
              "numpy, of ceiling", "generate(), of ceiling"]  # fmt: skip
    return out + table(header, rows, nowrap=True)


def ops_markdown(record: dict) -> str:
    """bench.py --ops's JSON as a table: each op, forward and backward, NumPy's time (the plain call, and the fast
    path's where it runs the op, in a recording that has it) against torch's and the ratios, with the CPU, NumPy's
    BLAS kernel and torch's BLAS."""
    d = record["data"]
    m = d["machine"]
    has_fast = any("fast" in r for r in d["ops"])
    out = recorded_line(record)
    out += (
        f"CPU {m['cpu']}; NumPy's BLAS kernel {m['numpy_blas_kernel']}, torch's BLAS {m['torch_blas']}; threads: "
        f"NumPy's BLAS {m['numpy_threads'][0]}, torch {m['torch_threads']}; load average "
        f"{d['load_average'][0]:.1f} before and {d['load_average'][1]:.1f} after. Float32, the medians of "
        "interleaved runs."
    )
    if has_fast:
        out += (
            f" Fast: the fast path's call, the same function on the rows of a part per core ({d['fast_path_parts']} "
            "parts, one BLAS thread each; GELU its float32 kernel); - where the fast path does not run the op."
        )
    out += "\n\n"

    def ms(seconds):
        return "-" if seconds is None else f"{seconds * 1e3:,.2f}"

    def ratio(value):
        return "-" if value is None else f"{value:.2f}"

    header = ["op", "pass", "shape", "NumPy ms", "torch ms", "NumPy / torch"]
    rows = [
        [r["op"], r["pass"], r["shape"], ms(r["numpy"]), ms(r["torch"]), ratio(r["ratio_numpy_over_torch"])]
        for r in d["ops"]
    ]
    if has_fast:
        header = ["op", "pass", "shape", "NumPy ms", "fast ms", "torch ms", "NumPy / torch", "fast / torch"]
        rows = [
            [r["op"], r["pass"], r["shape"], ms(r["numpy"]), ms(r["fast"]), ms(r["torch"]),
             ratio(r["ratio_numpy_over_torch"]), ratio(r["ratio_fast_over_torch"])]
            for r in d["ops"]
        ]  # fmt: skip
    return out + table(header, rows, nowrap=True)


def targets_markdown(record: dict) -> str:
    """bench.py --targets's JSON as a table: each whole-model figure, its target and whether it is met, with the
    times behind the ratios and the load average at each stage."""
    d = record["data"]
    m, minilm, step = d["machine"], d["minilm_forward"], d["train_step"]
    blas = m["numpy_blas"][0] if m["numpy_blas"] else {}
    loads = "; ".join(f"{stage} {v[0]:.1f}" for stage, v in d["load_average"].items())
    out = recorded_line(record)
    out += (
        f"NumPy's BLAS: {blas.get('internal_api')} ({blas.get('architecture')} kernel), {blas.get('num_threads')} "
        f"threads; torch {m['torch_threads']} threads. Load average (1 min): {loads}. All-MiniLM-L6-v2 forward, "
        f"{minilm['batch']} × {minilm['tokens']} tokens: NumPy {minilm['numpy'] * 1e3:,.0f} ms, fast "
        f"{minilm['numpy_parallel'] * 1e3:,.0f} ms, `BertModel` {minilm['torch'] * 1e3:,.0f} ms. Training step: "
        f"NumPy {step['numpy'] * 1e3:,.0f} ms, fast {step['numpy_parallel'] * 1e3:,.0f} ms, torch "
        f"{step['torch'] * 1e3:,.0f} ms.\n\n"
    )
    rows = [
        [r["figure"], "-" if r["value"] is None else f"{r['value']:.2f}", r["target"] or "-",
         "-" if r["met"] is None else ("yes" if r["met"] else "**no**")]
        for r in d["targets"]
    ]  # fmt: skip
    return out + table(["figure", "measured", "target", "met"], rows, nowrap=True)


def training_markdown(records: dict[str, dict]) -> str:
    """train_numbers.py's metrics.json files as one table, and a loss curve per run."""
    sys.path.insert(0, str(ROOT))
    from examples import plotting  # the same plot the training script draws

    rows, out = [], ""
    for name, record in records.items():
        d = record["data"]
        rows.append(
            [
                f"{d['model']}, {d['backend']}",
                f"{d['steps']:,}",
                f"{d['train_seconds'] / 60:.1f} min",
                f"{d['tokens_per_second']:,.0f}",
                f"{d['test_exact_match']:.4f}",
                f"{d['test_token_accuracy']:.4f}",
                f"{d['n_test']:,}",
            ]
        )
        h = d["history"]
        figure = GENERATED / f"loss_{name}.png"
        plotting.plot_loss_curve(
            h["step"], h["loss"], figure, h["val_step"], h["val_exact_match"], title=f"{d['model']}, {d['backend']}"
        )
        out += f"\n{recorded_line(record)}![Loss curve of the run {name}](/_generated/{figure.name})\n"
    header = [
        "model, backend",
        "steps",
        "training time",
        "tokens/s",
        "test exact match",
        "token accuracy",
        "test numbers",
    ]
    return table(header, rows) + out


# --- Main ----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parity-json", type=Path, help="use this report instead of running transformer-parity")
    args = parser.parse_args(argv)
    GENERATED.mkdir(exist_ok=True)
    names = write_tutorials()
    print(f"tutorials: {len(names)} walkthroughs ({', '.join(names)})")
    print(f"reference: {write_reference()} modules")
    print(f"workbook: {write_workbook()} exercises")

    if args.parity_json is None:
        args.parity_json = DOCS / "_build" / "parity.json"
        args.parity_json.parent.mkdir(exist_ok=True)
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "parity_tests", "--json", str(args.parity_json)],
            check=True,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        print(f"parity report: {time.perf_counter() - start:.0f} s")
    (GENERATED / "parity.md").write_text(parity_markdown(json.loads(args.parity_json.read_text())))

    # bench.json (the C library's allocator), then any bench_*.json (other settings, such as --keep-freed-memory)
    speed = [speed_markdown(json.loads(p.read_text())) for p in sorted(DATA.glob("bench*.json"))]
    (GENERATED / "speed.md").write_text("\n".join(speed))
    (GENERATED / "flash_attention.md").write_text(
        flash_markdown(json.loads((DATA / "flash_attention.json").read_text()))
    )
    llm = DATA / "llm_decode.json"
    llm_table = llm_decode_markdown(json.loads(llm.read_text())) if llm.is_file() else "*Not recorded yet.*\n"
    (GENERATED / "llm_decode.md").write_text(llm_table)
    # ops.json (every core), then any ops_*.json (other thread counts, such as ops_1_thread.json)
    ops = [ops_markdown(json.loads(p.read_text())) for p in sorted(DATA.glob("ops*.json"))]
    (GENERATED / "ops.md").write_text("\n".join(ops) if ops else "*Not recorded yet.*\n")
    targets = DATA / "targets.json"
    (GENERATED / "targets.md").write_text(
        targets_markdown(json.loads(targets.read_text())) if targets.is_file() else "*Not recorded yet.*\n"
    )
    training = {
        p.stem.removeprefix("training_"): json.loads(p.read_text()) for p in sorted(DATA.glob("training_*.json"))
    }
    (GENERATED / "training.md").write_text(training_markdown(training))
    print(f"tables: parity, speed, tiled attention, training ({len(training)} runs)")


if __name__ == "__main__":
    main()
