"""python -m parity_tests.corpus [STYLE ...]: the judge on every corpus model and injected mistake, as two markdown
tables (the corpus: level, lines of glue, verdict, seconds; the mistakes: expected and reported id and submodule)."""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
import time

from . import STYLES, clean, load, mistakes


def glue_lines(call) -> int:
    """Lines of the author's call beyond the factory (its body, without the docstring); 0 when there is none."""
    if call is None:
        return 0
    body = ast.parse(textwrap.dedent(inspect.getsource(call))).body[0].body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return sum(node.end_lineno - node.lineno + 1 for node in body)


def run(style: str, factory):
    """(result or None, what went wrong or '', seconds) of check.module on factory() as the corpus calls it."""
    from parity_tests import check

    corpus = load(style)
    start = time.perf_counter()
    try:
        result, error = check.module(factory(), corpus.LEVEL, call=corpus.CALL), ""
    except Exception as exc:  # the judge could not run it: reported as what it said
        result, error = None, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return result, error, time.perf_counter() - start


def main(argv: list[str]) -> int:
    styles = argv or list(STYLES)
    unknown = [s for s in styles if s not in STYLES]
    if unknown:
        print(f"unknown style(s) {unknown}; expected some of {', '.join(STYLES)}", file=sys.stderr)
        return 2
    print("| model | level | lines of glue | verdict | seconds |\n|---|---|---|---|---|")
    for style in styles:
        corpus = load(style)
        for factory in clean(style):
            result, error, seconds = run(style, factory)
            verdict = error or ("passes" if result.passed else f"fails at {result.first_divergence}")
            name = f"{style}.{factory.__name__}"
            print(f"| {name} | {corpus.LEVEL} | {glue_lines(corpus.CALL)} | {verdict} | {seconds:.1f} |")
    print("\n| mistake | expected id | expected submodule | reported id | reported submodule | seconds |")
    print("|---|---|---|---|---|---|")
    for style in styles:
        for m in mistakes(style):
            result, error, seconds = run(style, m.factory)
            if result is None:
                reported = (error, "")
            elif result.diagnoses:
                reported = (result.diagnoses[0].id, result.diagnoses[0].where)
            else:
                reported = ("passes" if result.passed else "(none)", result.first_divergence or "")
            print(f"| {m.name} | {m.id} | {m.where} | {reported[0]} | {reported[1]} | {seconds:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
