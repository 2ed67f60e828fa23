"""Sphinx configuration of the documentation site (built by `bash docs/build`; see docs/README.md)."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # the packages (and examples/) from this checkout

project = "transformer-parity"
author = "the transformer-parity authors"
copyright = "the transformer-parity authors, MIT licence"

extensions = [
    "myst_nb",  # Markdown pages and the executed walkthroughs (MyST-NB runs them through a Jupyter kernel)
    "sphinx.ext.autodoc",  # the reference, from the docstrings
    "sphinx.ext.mathjax",  # math, rendered by the MathJax copy that npm installed (never a CDN)
]

# Generated inputs live in folders that git ignores (docs/.gitignore); the build writes them first.
exclude_patterns = ["_build", "_generated", "node_modules", "README.md", "data", "**.ipynb_checkpoints"]
root_doc = "index"
nitpicky = False  # annotations name NumPy and torch types we do not cross-link

# --- Markdown and notebooks ---------------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
myst_dmath_double_inline = True  # $$...$$ inside a paragraph or a list item, as Jupyter reads it
nb_execution_mode = "force"  # every build runs every walkthrough: their printed numbers are today's
nb_execution_timeout = 600
nb_execution_raise_on_error = True  # an assertion failing in a walkthrough fails the build
nb_execution_show_tb = True
nb_merge_streams = True

# --- The reference ------------------------------------------------------------------------------------------
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "signature"  # types stay in the signature; the docstrings say what each argument is
autodoc_preserve_defaults = True
default_role = "code"  # `name` in a docstring reads as code, as it does in the source

# --- Math: MathJax from npm, copied next to the pages --------------------------------------------------------
MATHJAX = DOCS / "node_modules" / "mathjax" / "es5"
MATHJAX_COPY = DOCS / "_build" / "mathjax_static"
mathjax_path = "mathjax/tex-chtml-full.js"  # relative to _static/
mathjax3_config = {
    "tex": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]]},
    "options": {"enableMenu": False},  # the menu would load more components on demand
}

# --- HTML ---------------------------------------------------------------------------------------------------
html_theme = "furo"  # no web fonts, no scripts from elsewhere: every asset ships in the theme's package
html_title = "transformer-parity"
html_favicon = "favicon.svg"  # the browser asks for one; without it every page logs a 404
html_static_path = ["_static", str(MATHJAX_COPY)]
html_css_files = ["custom.css"]
html_last_updated_fmt = None
html_show_sourcelink = False
html_theme_options = {"navigation_with_keys": True}


def copy_mathjax(app, config) -> None:
    """Copy the one MathJax bundle the pages load, and its fonts, into a static folder of the build."""
    if not (MATHJAX / "tex-chtml-full.js").is_file():
        raise RuntimeError(f"MathJax is not installed in {MATHJAX}: run `npm ci --prefix docs` (docs/build does)")
    target = MATHJAX_COPY / "mathjax"
    if target.exists():
        shutil.rmtree(target)
    (target / "output" / "chtml" / "fonts").mkdir(parents=True)
    shutil.copy2(MATHJAX / "tex-chtml-full.js", target)
    shutil.copytree(
        MATHJAX / "output" / "chtml" / "fonts" / "woff-v2", target / "output" / "chtml" / "fonts" / "woff-v2"
    )


# Docstrings are reStructuredText for autodoc. Many were written as plain text, where `*` (products,
# *args), `|x|` (absolute values) and `name_` (PyTorch's in-place names) are markup. Outside code spans,
# math roles and math blocks, those characters are escaped so that they print as written.
_PROTECTED = re.compile(r"(:math:`[^`]*`|``[^`]*``|`[^`]*`)")
_MARKUP = re.compile(r"(\*|\||(?<=\w)_(?=[\s.,;:)\]*/'\"]|$))")
# A line of Python (an import, an assignment, a call) or of a hand-written formula ("y = ...")
_CODE_LINE = re.compile(r"^(from \w|import \w|#|[\w.]+(\[[^\]]*\])?(, *[\w.]+)* *[-+*/]?= |[\w.]+\(.*\)\s*(#.*)?$)")
_LIST_ITEM = re.compile(r"^\s*(- |\* |\d+\. )")


def escape_plain_text(line: str) -> str:
    """Escape `*`, `|` and a trailing `_` in the parts of one docstring line that are not code or math."""
    parts = _PROTECTED.split(line)
    return "".join(part if i % 2 else _MARKUP.sub(r"\\\1", part) for i, part in enumerate(parts))


def indent_of(line: str) -> int:
    return len(line) - len(line.lstrip())


def keep_layout(lines: list[str]) -> None:
    """An indented block after a line ending in one colon (a code example, a hand-aligned formula or list of
    inputs) becomes a literal block, so it keeps its line breaks instead of being reflowed as a quotation;
    a list that starts right under a paragraph line gets the blank line reStructuredText needs."""
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        previous = lines[i - 1] if i else ""
        if _LIST_ITEM.match(line) and previous.strip() and not _LIST_ITEM.match(previous):
            if indent_of(previous) == indent_of(line):  # a list straight after a paragraph line: separate them
                lines.insert(i, "")
                continue
        if line.endswith(":") and not line.endswith("::") and not line.lstrip().startswith(".."):
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            block = lines[j].lstrip() if j < len(lines) else ""
            if block and indent_of(lines[j]) > indent_of(line) and not block.startswith(("..", "- ", "* ")):
                lines[i] = line + ":"
                if j == i + 1:
                    lines.insert(i + 1, "")
        i += 1


def keep_hanging_indents(lines: list[str]) -> None:
    """A top-level paragraph with a hanging indent (hand-aligned formulas whose last line wraps) is a
    reStructuredText error, and one made only of lines of code would be reflowed into prose; shown as a
    literal block, each keeps the layout its author gave it."""
    start = 0
    while start < len(lines):
        if not lines[start].strip():
            start += 1
            continue
        end = start
        while end < len(lines) and lines[end].strip():
            end += 1
        first = lines[start]
        plain = indent_of(first) == 0 and not _LIST_ITEM.match(first) and not first.startswith(("..", ":"))
        hanging = any(indent_of(line) > 0 for line in lines[start + 1 : end])
        code = all(_CODE_LINE.match(line) for line in lines[start:end])
        if plain and (hanging or code):
            lines[start:end] = ["::", ""] + ["    " + line for line in lines[start:end]]
            end += 2
        start = end


def escape_docstring(app, what, name, obj, options, lines: list[str]) -> None:
    """autodoc-process-docstring: keep hand-laid-out blocks as they are, and escape plain-text markup
    characters outside code, math roles and math blocks."""
    if what == "module" and lines:  # its first line is already the page's title (docs/generate.py)
        while lines and lines[0].strip():
            del lines[0]
    keep_layout(lines)
    keep_hanging_indents(lines)
    in_math, in_literal, block_indent = False, False, 0
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        indent = indent_of(line)
        if (in_math or in_literal) and stripped and indent <= block_indent:
            in_math = in_literal = False
        if in_math or in_literal:
            continue  # math and literal blocks are read as they are
        if stripped.startswith(".. math::"):
            in_math, block_indent = True, indent
            continue
        lines[i] = escape_plain_text(line)
        if stripped.endswith("::"):
            in_literal, block_indent = True, indent


def setup(app) -> None:
    app.connect("config-inited", copy_mathjax)
    app.connect("autodoc-process-docstring", escape_docstring)
