"""The parity report: every component and the whole models, NumPy reference vs torch_transformer, and
the NumPy models against Hugging Face transformers' own classes (tiny random BERT, GPT-2, Llama; tiny
trained Marian and BART; the real all-MiniLM-L6-v2).

    transformer-parity                       # or: python -m parity_tests
    transformer-parity --dtype float64 --norm pre --activation gelu --json report.json

For each component, dtype and device it prints max |diff| and the relative error of the outputs
and of the gradients (the conventions' measure), the finite-difference error of the NumPy backward
(float64), and whether all of them are within the conventions' bars. Exit status 1 if anything fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import math
import platform
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from numpy_transformer import TransformerConfig
from parity_tests import components as C
from parity_tests.builtin import BUILTIN_CASES

DTYPES = {"float64": np.float64, "float32": np.float32}


def build_config(args) -> TransformerConfig:
    return TransformerConfig(
        src_vocab_size=args.vocab,
        tgt_vocab_size=args.vocab + 7,
        d_model=args.d_model,
        n_heads=args.heads,
        d_ff=args.d_ff,
        n_encoder_layers=args.layers,
        n_decoder_layers=args.layers,
        activation=args.activation,
        norm_first=args.norm == "pre",
        positional=args.positional,
        tie_embeddings=args.tie,
        max_len=32,
        dropout=args.dropout,
    )


ENCODER_ROW = "EncoderModel"
LLAMA_ROW = "TransformerLM (Llama-style)"


def encoder_config(config: TransformerConfig) -> TransformerConfig:
    """The EncoderModel rows' config: the report's, with BERT's token types and embedding norm."""
    return dataclasses.replace(config, type_vocab_size=2, embedding_norm=True)


def llama_config(config: TransformerConfig) -> TransformerConfig:
    """The Llama-style rows' config: the report's sizes, with pre-norm RMSNorm, rotary positions, the SiLU-gated
    feed-forward (SwiGLU), grouped-query attention (half as many K/V heads as query heads, or one: multi-query),
    no biases, no output bias and no padding token. A head size made even if it is not (rotary pairs)."""
    heads = config.n_heads
    head_dim = config.d_head + config.d_head % 2
    return dataclasses.replace(
        config,
        d_model=heads * head_dim,
        norm_first=True,
        norm="rms",
        positional="rope",
        activation="silu",
        gated_ffn=True,
        n_kv_heads=heads // 2 if heads % 2 == 0 else 1,
        bias=False,
        output_bias=False,
        pad_id=None,
        tie_embeddings=False,
    )


def row_config(config: TransformerConfig, name: str) -> TransformerConfig:
    """The config of the whole-model row `name`."""
    if name.startswith(ENCODER_ROW):
        return encoder_config(config)
    if name.startswith(LLAMA_ROW):
        return llama_config(config)
    return config


def model_rows(config, seed: int):
    """(component name, family, train): the whole models, in evaluation and in training mode."""
    rows = [("Transformer", "Transformer", False), ("TransformerLM", "TransformerLM", False)]
    rows += [(ENCODER_ROW, "EncoderModel", False), (LLAMA_ROW, "TransformerLM", False)]
    if config.has_dropout:
        rows += [
            ("Transformer (train, shared dropout)", "Transformer", True),
            ("TransformerLM (train, shared dropout)", "TransformerLM", True),
            (f"{ENCODER_ROW} (train, shared dropout)", "EncoderModel", True),
            (f"{LLAMA_ROW} (train, shared dropout)", "TransformerLM", True),
        ]
    return rows


def compare_family(config, family: str, dtype, device: str, seed: int, train: bool):
    """One whole-model row: a batch of 3 with padding and fully masked rows (no padding without a pad_id)."""
    if family == "EncoderModel":
        return C.compare_encoder_models(
            config, dtype, device, seed=seed, train=train, scenario="fully_masked", batch=3, length=10
        )
    return C.compare_models(
        config,
        dtype,
        device,
        seed=seed,
        lm=family == "TransformerLM",
        train=train,
        scenario="fully_masked",
        batch=3,
        src_len=10,
        tgt_len=9,
    )


def hf_rows(dtype, seed: int):
    """(component name, Result) of the NumPy models against transformers' classes, on the CPU: the float64
    Llama, Mistral, Qwen2, Qwen3, Phi-2, Phi-3, GPT-NeoX and Mixtral with exactly their float32 RMSNorm, rotary and
    softmax pieces in float64 (Gemma 3 and Gemma 2 with their norms, rotary tables and embedding scale; Mixtral and
    Qwen3-MoE with their router softmax; GPT-OSS with its norms and rotary tables), BLOOM with its softmax in float64,
    T5 with its norm's mean square in float64, the float64 Marian with float64 sinusoids (parity_tests/hf_compare.py
    says why)."""
    import tempfile

    from parity_tests import hf_compare as H

    rows = []
    names = (
        "bert", "roberta", "xlm-roberta relu", "distilbert", "mpnet", "gpt2 tied", "llama GQA 4/2 untied theta=500",
        "llama MQA 4/1 tied theta=10000", "mistral window=3 GQA 4/2", "qwen2 qkv biases GQA 4/2",
        "bloom ALiBi 4 heads tied",
        "qwen3 q/k norm GQA 4/2 untied", "phi3 fused qkv GQA 4/2 untied", "gpt_neox parallel residual, rotary_pct 0.5",
        "gemma3_text local then global window=3 GQA 4/2 tied scalar=12 softcap=3",
        "gemma2 9b shape: GQA 4/2, head_dim 8 (not 28 / 4), scalar 7, released caps 50 and 30, 3 layers, untied",
        "phi phi-2 shape: parallel block of one norm, rotary 4 of 10 (0.4), MHA, biases, untied",
        "mixtral 4 experts top-2 window=3 GQA 4/2", "qwen3_moe top-2 of 4 renormalised, dense layer 1",
        "olmo2 1b shape: post-sublayer norms, q/k norms over the projections, MHA 4/4, theta 5e5, untied",
        "smollm3 3b shape: NoPE every 4th layer (layer 3 of 4), GQA 4/1, theta 5e6, tied",
        "gpt_oss 20b shape: sinks, GQA 8/2, head_dim 8, 4 of 8 experts, clamp 1.5, YaRN, window 3",
    )  # fmt: skip
    for name in names:
        family, overrides = H.VARIANTS[name]
        title = H.CLASSES[family].__name__
        rows.append((f"HF {title} ({name}, tiny random)", H.compare_hf(family, dtype, "numpy", seed, **overrides)))
    # Marian and BART trained a few seconds (tests decode with them too); T5 random (parity needs no training)
    for model_type, steps in (("marian", 60), ("bart", 60), ("t5", 0), ("t5 v1.1", 0)):
        title = H.seq2seq_class(model_type).__name__ + (" v1.1" if model_type.endswith("v1.1") else "")
        kind = "trained" if steps else "random"
        with tempfile.TemporaryDirectory() as directory:
            H.build_seq2seq(model_type, seed, steps=steps).save_pretrained(directory)
            result = H.compare_seq2seq(directory, model_type, dtype, "numpy", seed)
            rows.append((f"HF {title} (tiny, {kind})", result))
    from parity_tests import modernbert_compare as MB  # its float64 patch: the rotary tables, rotation and softmax

    modernbert = MB.compare_modernbert(dtype, "numpy", seed)
    rows.append(("HF ModernBertModel (1 global + 2 local layers, tiny random)", modernbert))
    rows.append(("HF ModernBertForMaskedLM (logits, tiny random)", MB.compare_modernbert_mlm(dtype, "numpy", seed)))
    rows.append(("all-MiniLM-L6-v2 (real weights) vs BertModel in float64", H.compare_minilm(dtype)))
    return rows


def run(args) -> list[dict]:
    """Every row of the report: per device and dtype, the components, torch.nn's own layers and the models; then
    the Hugging Face comparisons (CPU only)."""
    config = build_config(args)
    devices = C.devices() if args.device == "all" else [args.device]
    dtypes = list(DTYPES) if args.dtype == "both" else [args.dtype]
    fd = finite_differences(args.no_fd)
    records = []
    for device in devices:
        for dtype_name in dtypes:
            records += component_records(dtype_name, device, args.seed, fd)
            records += model_records(config, dtype_name, device, args.seed, fd)
    if not args.no_hf and "cpu" in devices:
        for dtype_name in dtypes:
            for name, result in hf_rows(DTYPES[dtype_name], args.seed):
                records.append(_record(name, dtype_name, "cpu", result, None))
    return records


FiniteDifferences = Callable[[str, Callable[[], float]], float | None]  # (row name, compute) -> error or None


def finite_differences(skip: bool) -> FiniteDifferences:
    """fd(row name, compute) -> the row's finite-difference error, computed once per row (the float64 reference
    does not depend on the dtype or device compared); None for every row when `skip` (--no-fd)."""
    cache: dict[str, float] = {}

    def fd(key: str, compute: Callable[[], float]) -> float | None:
        if skip:
            return None
        if key not in cache:
            cache[key] = compute()
        return cache[key]

    return fd


def component_records(dtype_name: str, device: str, seed: int, fd: FiniteDifferences) -> list[dict]:
    """The pairs' rows (C.CASES), then the reference against torch.nn's own layers (BUILTIN_CASES)."""
    dtype = DTYPES[dtype_name]
    records = []
    for name in C.CASES:
        result = C.run_case(C.make_case(name, dtype, seed), device, seed)
        fd_err = fd(name, functools.partial(case_fd_error, name, seed))
        records.append(_record(name, dtype_name, device, result, fd_err))
    for name, make in BUILTIN_CASES.items():
        result = C.run_case(make(np.dtype(dtype), np.random.default_rng(seed)), device, seed)
        fd_err = fd(name, functools.partial(builtin_fd_error, make, seed))
        records.append(_record(name, dtype_name, device, result, fd_err))
    return records


def case_fd_error(name: str, seed: int) -> float:
    """The finite-difference error of pair `name` (C.CASES) in float64."""
    return C.fd_error(C.make_case(name, np.float64, seed), seed)


def builtin_fd_error(make: Callable, seed: int) -> float:
    """The finite-difference error of a case against torch.nn's layers (BUILTIN_CASES) in float64."""
    return C.fd_error(make(np.dtype(np.float64), np.random.default_rng(seed)))


def model_records(config, dtype_name: str, device: str, seed: int, fd: FiniteDifferences) -> list[dict]:
    """The whole models' rows (model_rows): NumPy against torch, and the float64 model against finite
    differences with a fully masked row."""
    records = []
    for name, family, train in model_rows(config, seed):
        result = compare_family(row_config(config, name), family, DTYPES[dtype_name], device, seed, train)
        fd_err = fd(name, functools.partial(model_fd_error, row_config(config, name), family, train, seed))
        records.append(_record(name, dtype_name, device, result, fd_err))
    return records


def model_fd_error(config, family: str, train: bool, seed: int) -> float:
    """The finite-difference error of a whole `family` model in float64, a fully masked row in its batch."""
    return C.model_fd_error(
        config,
        lm=family == "TransformerLM",
        seed=seed,
        scenario="fully_masked",
        train=train,
        encoder=family == "EncoderModel",
    )


def _record(name, dtype_name, device, result, fd_err) -> dict:
    out_diff, out_err, grad_diff, grad_err = C.worst(result, DTYPES[dtype_name])
    problems = C.failures(result, DTYPES[dtype_name])
    if fd_err is not None and dtype_name == "float64" and not fd_err <= C.FD_BAR:
        problems.append(f"finite differences: {fd_err:.3e} > {C.FD_BAR:.0e}")
    return {
        "component": name,
        "dtype": dtype_name,
        "device": device,
        "n_outputs": len(result.outputs),
        "n_gradients": len(result.grads),
        "output_max_abs_diff": out_diff,
        "output_rel_error": out_err,
        "grad_max_abs_diff": grad_diff,
        "grad_rel_error": grad_err,
        "fd_rel_error": fd_err if dtype_name == "float64" else None,
        "bar": max(C.bars(result, DTYPES[dtype_name]).values(), default=C.BAR[np.dtype(DTYPES[dtype_name])]),
        # float32 against a real model: the reference's own float32 error (its float32 run against its float64
        # run) on the worst tensor of ours relative to its bar, and that bar (components.bars)
        "reference_float32": _own_float32(result, DTYPES[dtype_name]),
        "passed": not problems,
        "problems": problems,
    }


def _own_float32(result, dtype) -> dict | None:
    """For a result judged by the reference's own float32 error: the tensor of ours closest to its bar, with our
    error, the reference's own float32 error and the bar; None for a result judged by the conventions' bar."""
    if result.reference_float32 is None:
        return None
    allowed = C.bars(result, dtype)
    errors = C.result_errors(result, dtype)
    name = max(errors, key=lambda n: errors[n][1] / allowed[n])
    return {
        "tensor": name,
        "ours": errors[name][1],
        "reference": result.reference_float32[name],
        "own": None if result.own_float32 is None else result.own_float32[name],  # ours, float32 against float64
        "bar": allowed[name],
        "worst_reference": max(result.reference_float32.values()),
    }


def format_table(records: list[dict]) -> str:
    def num(x):
        return "—" if x is None else f"{x:.1e}"

    header = ("component", "dtype", "device", "max|Δ| out", "rel out", "max|Δ| grad", "rel grad", "FD rel", "")
    rows = [header]
    for r in records:
        rows.append(
            (
                r["component"],
                r["dtype"],
                r["device"],
                num(r["output_max_abs_diff"]),
                num(r["output_rel_error"]),
                num(r["grad_max_abs_diff"]) if r["n_gradients"] else "—",
                num(r["grad_rel_error"]) if r["n_gradients"] else "—",
                num(r["fd_rel_error"]),
                "pass" if r["passed"] else "FAIL",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for k, row in enumerate(rows):
        lines.append(
            "  ".join(
                cell.ljust(w) if i < 3 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="transformer-parity",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=64)
    p.add_argument("--layers", type=int, default=2, help="encoder and decoder layers each")
    p.add_argument("--vocab", type=int, default=40, help="source vocabulary (target: vocab + 7)")
    p.add_argument("--activation", choices=["relu", "gelu", "gelu_tanh"], default="relu")
    p.add_argument("--norm", choices=["post", "pre"], default="post", help="post-norm (the paper) or pre-norm")
    p.add_argument("--positional", choices=["sinusoidal", "learned"], default="sinusoidal")
    p.add_argument("--tie", action="store_true", help="tie the output projection to the target embedding")
    p.add_argument("--dropout", type=float, default=0.1, help="adds training-mode rows with shared masks when > 0")
    p.add_argument("--dtype", choices=["float64", "float32", "both"], default="both")
    p.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-fd", action="store_true", help="skip the finite-difference checks")
    p.add_argument("--no-hf", action="store_true", help="skip the rows against Hugging Face transformers")
    p.add_argument("--json", metavar="PATH", help="also write the records as JSON ('-' for stdout only)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("transformer-parity: --device cuda asked for, but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    start = time.perf_counter()
    if not args.no_hf and importlib.util.find_spec("transformers") is None:
        print("transformer-parity: transformers is not installed: the Hugging Face rows are left out", file=sys.stderr)
        args.no_hf = True
    records = run(args)
    seconds = time.perf_counter() - start
    failed = [r for r in records if not r["passed"]]
    summary = {
        "config": build_config(args).to_dict(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "seconds": seconds,
        "passed": not failed,
        "records": records,
    }
    if args.json == "-":
        json.dump(summary, sys.stdout, indent=2)
        print()
        return 1 if failed else 0
    config = build_config(args)
    print(
        f"Parity: numpy_transformer (hand-written backward) vs torch_transformer (autograd), torch {torch.__version__}"
    )
    print(
        f"config: d_model={config.d_model} heads={config.n_heads} d_ff={config.d_ff} layers={config.n_encoder_layers}"
        f"+{config.n_decoder_layers} {config.activation} {'pre' if config.norm_first else 'post'}-norm "
        f"{config.positional} tied={config.tie_embeddings} dropout={config.dropout}; batch of 3 with padding and "
        "fully masked rows; the EncoderModel rows add BERT's token types (2) and embedding norm"
    )
    llama = llama_config(config)
    print(
        f"{LLAMA_ROW}: d_model={llama.d_model} heads={llama.n_heads} kv_heads={llama.n_kv_heads} pre-norm RMSNorm, "
        "rotary positions, SiLU-gated feed-forward, no biases, no output bias, no padding token"
    )
    cuda = "CUDA available" if torch.cuda.is_available() else "CUDA not available here"
    print(f"devices: {', '.join(C.devices() if args.device == 'all' else [args.device])} ({cuda})")
    print("rel = max|a - b| / max(max|b|, f * largest |value| in the comparison), f = 1e-3 (float64), 0.1 (float32)")
    print(
        f"bars: float64 <= {C.BAR[np.dtype(np.float64)]:.0e}, float32 <= {C.BAR[np.dtype(np.float32)]:.0e}, "
        f"finite differences (float64 NumPy backward) <= {C.FD_BAR:.0e}\n"
    )
    print(format_table(records))
    for r in records:
        own = r["reference_float32"]
        if own is not None:
            larger = ", or ours where larger" if own.get("own") is not None else ""
            mine = "" if own.get("own") is None else f", our own {own['own']:.1e}"
            print(
                f"{r['component']} [{r['dtype']}]: judged by what float32 can do on this model: each tensor within "
                f"min({C.FLOAT32_CAP:.0e}, max({C.BAR[np.dtype(np.float32)]:.0e}, {C.SELF_RATIO:g} x the reference's "
                f"own float32 error on it{larger})). Closest to its bar: {own['tensor']}, ours {own['ours']:.1e}, "
                f"the reference's own {own['reference']:.1e}{mine}, bar {own['bar']:.1e} (the reference's own float32 "
                f"error reaches {own['worst_reference']:.1e})"
            )
    for r in failed:
        for problem in r["problems"]:
            print(f"FAIL {r['component']} [{r['dtype']}, {r['device']}]: {problem}")
    worst = {d: max((r["output_rel_error"] for r in records if r["dtype"] == d), default=math.nan) for d in DTYPES}
    worst_g = {d: max((r["grad_rel_error"] for r in records if r["dtype"] == d), default=math.nan) for d in DTYPES}
    fds = [r["fd_rel_error"] for r in records if r["fd_rel_error"] is not None]
    print(
        f"\n{len(records) - len(failed)}/{len(records)} rows pass in {seconds:.1f} s. Worst relative error: "
        + ", ".join(
            f"{d} outputs {worst[d]:.1e} gradients {worst_g[d]:.1e}" for d in DTYPES if not math.isnan(worst[d])
        )
        + (f"; finite differences {max(fds):.1e}" if fds else "")
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
        print(f"JSON written to {args.json}")
    return 1 if failed else 0
