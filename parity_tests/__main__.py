"""python -m parity_tests / transformer-parity: the parity report (see parity_tests/report.py), and three subcommands.

    transformer-parity [report options]                     the parity report, as always
    transformer-parity check MODULE:ATTR REFERENCE [--n-heads N] [--pad-id ID] [--rope-theta BASE]
                             [--config-field NAME=VALUE ...] [--mapping FILE.json] [--call M:F] [--example M:F]
                             [--batch-first | --sequence-first] [--mask KIND] [--dtype D ...] [--seed N]
                             [--timeout SECONDS] [--json PATH]
    transformer-parity exercises DIR [--only NAMES]         write a backward-pass workbook
    transformer-parity exercises --gradescope OUT.zip --seed N [--only NAMES] [--timeout S] [--visibility V]
                             [--stdout-visibility V]        the Gradescope autograder that grades it
    transformer-parity grade DIR | --class ROOT [--csv FILE] [--seed N] [--timeout S] [--json PATH]
                                                            grade workbooks (exit 1 when any exercise fails)
    transformer-parity generate MODEL PROMPT [--max-new-tokens N] [--chat] [--system TEXT] [--torch]
                             [--device DEV] [--dtype float32|float64] [--greedy | --sample] [--seed N]
                             [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--repetition-penalty R]
                             [--num-beams N] [--min-new-tokens N] [--length-penalty L] [--eos-token-id ID...]
                             [--bad-words-ids ID...] [--stop TEXT] ...
                                                            text from a checkpoint folder or Hub id, streamed

`check` judges a user's torch module against the NumPy reference (parity_tests.check.module): MODULE is a dotted
module name or a path to a .py file, ATTR a module instance in it or a zero-argument factory (a class, a function).
The user's code is loaded and run in a child process (parity_tests.sandbox) with a time limit (--timeout): exit
status 0 when it passes, 1 when it does not, 2 for bad arguments or user code that could not run (an exception or
sys.exit at import, in the factory or in forward, a crash, a hang), with a message saying what went wrong.

`generate` loads MODEL (a checkpoint folder, or a Hub id such as Qwen/Qwen2.5-0.5B-Instruct: that needs the `hub`
extra) with numpy_transformer.hf (torch_transformer.hf with --torch), and prints the text it writes after PROMPT
as it comes, decoded under the checkpoint's generation rules; --chat sends PROMPT as a user message through the
checkpoint's chat template (--system adds a system message); the decoding flags override the checkpoint's settings
(--greedy turns its sampling off, --sample on, --seed makes a sampled run repeatable). Exit 2 when the model or the
prompt cannot be used.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SUBCOMMANDS = ("check", "exercises", "grade", "generate")


def check_main(argv) -> int:
    from parity_tests import sandbox
    from parity_tests.check.calling import MASK_KINDS
    from parity_tests.check.levels import REFERENCES

    parser = argparse.ArgumentParser(
        prog="transformer-parity check",
        description="Judge your own torch module against the NumPy reference, and name the mistake when it has a name. "
        "Your code runs in a child process with a time limit: exit 0 passes, 1 fails, 2 bad arguments or code "
        "that could not run.",
    )
    parser.add_argument("target", help="MODULE:ATTR, a module instance or a zero-argument factory")
    parser.add_argument("reference", choices=REFERENCES)
    parser.add_argument("--n-heads", type=int, default=None)
    parser.add_argument("--pad-id", type=int, default=None)
    parser.add_argument("--rope-theta", type=float, default=None, help="the rotary base (RoPE), as rope_theta=")
    parser.add_argument(
        "--config-field",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any other config field check.module takes as a keyword (repeatable): positional=rope, "
        "layer_norm_eps=1e-6, norm_first=true, n_kv_heads=2, pad_id=none",
    )
    parser.add_argument(
        "--mapping",
        default=None,
        help="a JSON file: {user name: [reference name, layout note]}, or with a third element (the link: parts, "
        "transposed, rope_pairs) as --json writes it",
    )
    parser.add_argument("--call", default=None, help="MODULE:FUNC, call(module, src, tgt) or call(module, ids)")
    parser.add_argument(
        "--example", default=None, help="MODULE:FUNC returning (args, kwargs): one real call of the part, as example="
    )
    first = parser.add_mutually_exclusive_group()
    first.add_argument("--batch-first", dest="batch_first", action="store_const", const=True, default=None)
    first.add_argument("--sequence-first", dest="batch_first", action="store_const", const=False)
    parser.add_argument(
        "--mask", default=None, choices=(*MASK_KINDS, "none"), help="the mask convention, instead of detecting it"
    )
    parser.add_argument(
        "--dtype", action="append", choices=("float64", "float32"), help="compare in this dtype only (repeatable)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the seed of the reference's weights and inputs")
    parser.add_argument(
        "--timeout",
        type=float,
        default=sandbox.DEFAULT_TIMEOUT,
        help=f"seconds the check may take before your code is stopped as hung (default {sandbox.DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument("--json", default=None, help="write the result as JSON to this path ('-': stdout)")
    args = parser.parse_args(argv)
    for what, spec in (("target", args.target), ("--call", args.call), ("--example", args.example)):
        if spec is not None and ":" not in spec:
            print(f"transformer-parity check: {what}: expected MODULE:ATTR (as mypkg.models:MyModel or "
                  f"path/to/file.py:model), got {spec!r}", file=sys.stderr)  # fmt: skip
            return 2
    if not (0 < args.timeout < float("inf")):
        print(f"transformer-parity check: --timeout: expected a positive number of seconds, got {args.timeout:g}",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        mapping = json.loads(Path(args.mapping).read_text()) if args.mapping else None
    except (ValueError, OSError) as exc:
        print(f"transformer-parity check: --mapping {args.mapping}: {exc}", file=sys.stderr)
        return 2
    try:
        fields = config_fields(args)
    except ValueError as exc:
        print(f"transformer-parity check: {exc}", file=sys.stderr)
        return 2
    options = {"batch_first": args.batch_first, "mask": args.mask, "dtypes": tuple(args.dtype or ()), "seed": args.seed}
    options["example"] = args.example  # MODULE:FUNC, called in the child process
    options = {k: v for k, v in options.items() if v not in (None, ())}
    outcome = sandbox.call(
        "parity_tests.check.cli:judge", args.target, args.reference, fields, mapping, args.call, options,
        timeout=args.timeout,
    )  # fmt: skip
    if not outcome.ok or outcome.value["status"] != "judged":
        reason = outcome.reason if not outcome.ok else outcome.value["reason"]
        print(f"transformer-parity check: {args.target} could not be judged: {reason}", file=sys.stderr)
        if outcome.output.strip():
            print("its last output:\n" + outcome.output.rstrip(), file=sys.stderr)
        return 2
    verdict = outcome.value
    if args.json == "-":
        json.dump(verdict["result"], sys.stdout, indent=2, default=str)
        print()
    else:
        print(verdict["report"])
        if args.json:
            Path(args.json).write_text(json.dumps(verdict["result"], indent=2, default=str))
    return 0 if verdict["passed"] else 1


def config_fields(args) -> dict:
    """check.module's config keywords from --n-heads, --pad-id, --rope-theta and each --config-field NAME=VALUE,
    read before anything runs: a name that is not a config field, or a field given twice with two values, raises
    ValueError. VALUE is read as Python writes it (1e6, 2, True, None, (1, 2)), true/false/none in lower case too,
    and otherwise as a string (rope, rms)."""
    from transformer_spec.config import TransformerConfig

    known = set(TransformerConfig.__dataclass_fields__)
    fields = {k: v for k, v in (("n_heads", args.n_heads), ("pad_id", args.pad_id), ("rope_theta", args.rope_theta))}
    fields = {k: v for k, v in fields.items() if v is not None}
    for item in args.config_field:
        name, equals, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not equals or not name:
            raise ValueError(f"--config-field: expected NAME=VALUE (as rope_theta=1e6), got {item!r}")
        if name not in known:
            raise ValueError(
                f"--config-field: {name!r} is not a config field; expected one of {', '.join(sorted(known))}"
            )
        value = _literal(text.strip())
        if name in fields and fields[name] != value:
            raise ValueError(f"--config-field: {name} given twice, as {fields[name]!r} and {value!r}")
        fields[name] = value
    return fields


def _literal(text: str):
    """A --config-field value: a Python literal, true/false/none in any case, else the text itself."""
    import ast

    words = {"true": True, "false": False, "none": None, "null": None}
    if text.lower() in words:
        return words[text.lower()]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def exercises_main(argv) -> int:
    from parity_tests.exercises import write_workbook

    parser = exercises_parser()
    args = parser.parse_args(argv)
    if (args.directory is None) == (args.gradescope is None):
        parser.error("give either DIRECTORY (the workbook) or --gradescope OUT.zip (the autograder)")
    if args.gradescope and args.seed is None:
        parser.error("--gradescope needs --seed N: the course's own seed (0 draws the notebooks' public cases)")
    only = [n.strip() for n in args.only.split(",")] if args.only else None
    try:
        if args.gradescope:
            return write_gradescope(args, only)
        written = write_workbook(args.directory, only)
    except ValueError as exc:
        print(f"transformer-parity exercises: {exc}", file=sys.stderr)
        return 2
    root = Path(args.directory)
    print(f"wrote {len(written)} files to {root}: " + ", ".join(str(p.relative_to(root)) for p in written))
    print(f"grade them with: transformer-parity grade {args.directory}")
    return 0


def exercises_parser() -> argparse.ArgumentParser:
    """transformer-parity exercises' arguments."""
    from parity_tests.exercises import DEFAULT_TIMEOUT, EXERCISES
    from parity_tests.exercises.gradescope import VISIBILITIES

    parser = argparse.ArgumentParser(
        prog="transformer-parity exercises",
        description="Write a workbook of backward passes to derive (one file per exercise, each with its "
        "notebook), or the Gradescope autograder that grades it (--gradescope).",
    )
    parser.add_argument("directory", nargs="?")
    parser.add_argument("--only", default=None, help=f"comma-separated names among: {', '.join(EXERCISES)}")
    bundle = parser.add_argument_group("the Gradescope autograder")
    bundle.add_argument("--gradescope", metavar="OUT.zip", default=None, help="write the autograder's zip here")
    bundle.add_argument("--seed", type=int, default=None, help="the course's seed, which draws the graded cases")
    bundle.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per exercise")
    bundle.add_argument("--visibility", choices=VISIBILITIES, default="visible", help="of the tests and the result")
    bundle.add_argument(
        "--stdout-visibility", choices=VISIBILITIES, default="hidden", help="of the grader's log (default hidden)"
    )
    return parser


def write_gradescope(args: argparse.Namespace, only) -> int:
    from parity_tests.exercises.gradescope import write_bundle

    path = write_bundle(
        args.gradescope,
        seed=args.seed,
        only=only,
        timeout=args.timeout,
        visibility=args.visibility,
        stdout_visibility=args.stdout_visibility,
    )
    print(f"wrote {path}: upload it as the assignment's autograder (Gradescope: Configure Autograder, zip file)")
    return 0


def grade_main(argv) -> int:
    from parity_tests.exercises import class_csv, grade, grade_class

    parser = grade_parser()
    args = parser.parse_args(argv)
    check_grade_arguments(parser, args)
    only = [n.strip() for n in args.only.split(",")] if args.only else None
    try:
        if args.class_root:
            cards = grade_class(args.class_root, seed=args.seed, timeout=args.timeout, only=only, jobs=args.jobs)
        else:
            cards = {None: grade(args.directory, seed=args.seed, timeout=args.timeout, only=only, jobs=args.jobs)}
    except ValueError as exc:
        print(f"transformer-parity grade: {exc}", file=sys.stderr)
        return 2
    detail = cards[None] if args.directory else cards
    if args.json == "-":
        json.dump(detail, sys.stdout, indent=2, default=str)
        print()
    else:
        print_scorecards(cards, args.seed)
        if args.json:
            Path(args.json).write_text(json.dumps(detail, indent=2, default=str))
    if args.csv:
        Path(args.csv).write_text(class_csv(cards))
        if args.json != "-":
            print(f"\nwrote {args.csv}")
    return 0 if all(card["passed"] for card in cards.values()) else 1


def grade_parser() -> argparse.ArgumentParser:
    """transformer-parity grade's arguments."""
    from parity_tests.exercises import DEFAULT_TIMEOUT, PUBLIC_SEED

    parser = argparse.ArgumentParser(
        prog="transformer-parity grade",
        description="Grade a workbook's backward passes against the NumPy reference, each exercise in a child "
        "process with a time limit; exit 1 when any fails, 2 for bad arguments.",
    )
    parser.add_argument("directory", nargs="?", help="one student's workbook")
    parser.add_argument("--class", dest="class_root", default=None, help="grade every sub-folder of this folder")
    parser.add_argument("--csv", default=None, help="with --class: write a row per student, a column per exercise")
    parser.add_argument(
        "--seed", type=int, default=PUBLIC_SEED, help=f"draws the cases (default {PUBLIC_SEED}: the notebooks' own)"
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per exercise")
    parser.add_argument("--only", default=None, help="comma-separated exercises (default: every one handed in)")
    parser.add_argument("--jobs", type=int, default=1, help="exercises graded at a time (default 1)")
    parser.add_argument("--json", default=None, help="write the scorecard(s) as JSON to this path ('-': stdout)")
    return parser


def check_grade_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """One workbook or a class, --csv only for a class, a positive timeout: parser.error (exit 2) otherwise."""
    if (args.directory is None) == (args.class_root is None):
        parser.error("give either DIRECTORY or --class ROOT")
    if args.csv and not args.class_root:
        parser.error("--csv needs --class ROOT")
    if not args.timeout > 0:
        parser.error(f"--timeout: expected a positive number of seconds, got {args.timeout}")


def print_scorecards(cards: dict, seed: int) -> None:
    """Each exercise's verdict, points and summary; a class's per student, a workbook's with its total."""
    from parity_tests.exercises.grading import BARS, printable

    print(f"cases drawn from seed {seed}; {BARS}")
    for student, card in cards.items():
        if student is not None:
            print(f"\n{student}: {card['points']} of {card['max_points']} points")
        for name, entry in card["exercises"].items():
            points = f"{entry['points']}/{entry['max_points']}"
            print(f"{'PASS' if entry['passed'] else 'FAIL'}  {name:<30} {points:>5}  {printable(entry['summary'])}")
        if student is None:
            print(
                f"{card['passed_count']} of {len(card['exercises'])} passed, "
                f"{card['points']} of {card['max_points']} points"
            )


def generate_parser() -> argparse.ArgumentParser:
    """transformer-parity generate's arguments."""
    parser = argparse.ArgumentParser(
        prog="transformer-parity generate",
        description="Load a checkpoint (a folder, or a Hub id with the hub extra) and print the text it writes after "
        "the prompt, token by token, decoded under the checkpoint's generation rules.",
    )
    parser.add_argument("model", help="a checkpoint folder, or a Hugging Face Hub id (org/name)")
    parser.add_argument("prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="the most tokens to generate (default 64)")
    parser.add_argument("--chat", action="store_true", help="send the prompt as a user message (the chat template)")
    parser.add_argument("--system", default=None, help="with --chat: a system message before the prompt")
    parser.add_argument("--torch", action="store_true", help="decode with torch_transformer instead of NumPy")
    parser.add_argument("--device", default="cpu", help="with --torch: the device (default cpu)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    settings = parser.add_argument_group(
        "decoding settings", "each over the checkpoint's generation_config.json (left out: the checkpoint's)"
    )
    choice = settings.add_mutually_exclusive_group()
    choice.add_argument("--greedy", action="store_true", help="greedy search even where the checkpoint samples")
    choice.add_argument("--sample", action="store_true", help="sample even where the checkpoint decodes greedily")
    settings.add_argument("--seed", type=int, default=None, help="seed of the sampling (default: unseeded)")
    for flag, kind in (
        ("--temperature", float),
        ("--top-k", int),
        ("--top-p", float),
        ("--min-p", float),
        ("--repetition-penalty", float),
        ("--no-repeat-ngram-size", int),
        ("--num-beams", int),
        ("--min-new-tokens", int),
        ("--length-penalty", float),
    ):
        settings.add_argument(flag, type=kind, default=None)
    settings.add_argument(
        "--eos-token-id", type=int, nargs="+", default=None, metavar="ID", help="the end token(s), as eos_token_id="
    )
    settings.add_argument(
        "--bad-words-ids", type=int, nargs="+", action="append", default=None, metavar="ID",
        help="a token sequence never to complete (repeat the flag for several), as bad_words_ids=",
    )  # fmt: skip
    settings.add_argument(
        "--stop", action="append", default=None, metavar="TEXT",
        help="stop once the text ends with TEXT (repeat the flag for several; in bash $'\\n' is a newline), as "
        "stop_strings=",
    )  # fmt: skip
    return parser


def decoding_settings(args) -> dict:
    """The decoding settings the command line gives (only those given: the rest stay the checkpoint's)."""
    names = (
        "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "no_repeat_ngram_size", "num_beams",
        "min_new_tokens", "length_penalty", "eos_token_id", "bad_words_ids",
    )  # fmt: skip
    settings = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if args.greedy or args.sample:
        settings["do_sample"] = args.sample
    if args.stop is not None:
        settings["stop_strings"] = args.stop
    if args.seed is not None:
        settings["rng"] = args.seed
    return settings


def generate_main(argv) -> int:
    parser = generate_parser()
    args = parser.parse_args(argv)
    if args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens: expected a positive number, got {args.max_new_tokens}")
    if args.system is not None and not args.chat:
        parser.error("--system needs --chat")
    prompt = args.prompt
    if args.chat:
        prompt = [{"role": "system", "content": args.system}] * (args.system is not None)
        prompt += [{"role": "user", "content": args.prompt}]
    try:
        if args.torch:
            import torch

            from torch_transformer import hf
            from torch_transformer.text import generate_text, load_tokenizer

            model = hf.load(args.model, dtype=getattr(torch, args.dtype), device=args.device)
        else:
            from numpy_transformer import hf
            from numpy_transformer.text import generate_text, load_tokenizer

            model = hf.load(args.model, dtype=args.dtype)
        tokenizer = load_tokenizer(args.model)
        stream = lambda s: print(s, end="", flush=True)  # noqa: E731
        generate_text(model, tokenizer, prompt, args.max_new_tokens, stream=stream, **decoding_settings(args))
    except (ValueError, TypeError) as exc:
        print(f"transformer-parity generate: {exc}", file=sys.stderr)
        return 2
    print()
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        commands = {"check": check_main, "exercises": exercises_main, "grade": grade_main, "generate": generate_main}
        return commands[argv[0]](argv[1:])
    from parity_tests.report import main as report_main

    return report_main(argv)


if __name__ == "__main__":
    sys.exit(main())
