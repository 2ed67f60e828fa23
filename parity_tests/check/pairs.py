"""check.pair: a user's NumPy forward/backward pair against the reference pair and central finite differences.

The user's pair follows the reference's protocol (docs/conventions.md): `out, cache = forward(**args)`, and
`backward(dout, cache)` returns the gradients of the inputs named below, in the forward's order (a single array
when there is one; a composite's params dict gets a grads dict). cross_entropy's backward is
`backward(cache, dloss)`, as the reference's. Each pair is run on several cases (shapes, padding, a fully masked
row, T_q != T_k, large scores) in float64 and float32; each output and gradient is compared with the reference's,
and the user's backward with central differences of the user's own forward (so a wrong gradient of a right forward
and a right gradient of a wrong forward are told apart).

Shape letters: B batch, H heads, T_q / T_k positions, D d_model, Dh head size, F d_ff, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from numpy_transformer import TransformerConfig, gradcheck
from numpy_transformer import attention as A
from numpy_transformer import layers as L
from numpy_transformer import loss as LS
from numpy_transformer import model as M
from parity_tests.components import BAR, FD_BAR, flatten_into, relative_errors

from . import backward_mistakes as BM
from . import mistakes as MK
from . import variants as VR
from .report import Diagnosis, Result, Row

B, H, D, F, V = 2, 2, 8, 12, 11
LARGE = 1e3  # "large scores": exp overflows without the max subtraction (float64 at 709, float32 at 88)


@dataclass
class Pair:
    """One reference pair: its functions, the inputs differentiated, and its cases (name -> fn(rng) -> args)."""

    forward: object
    backward: object
    wrt: list
    cases: dict
    call_backward: object = None  # how a backward is called: (backward, dout, cache) -> grads
    variants: object = None  # fn(args) -> [(id, message, variant output)]: the catalogue on this pair
    notes: dict = field(default_factory=dict)


def _mask(T_q, T_k, pad=1, full_row=False, causal=False):
    """(B, 1, T_q, T_k) True = may attend: the second sequence's last `pad` keys padded; optionally causal, and
    optionally a fully masked query row (the first sequence's row 0)."""
    keep = np.ones((B, 1, T_q, T_k), dtype=bool)
    if causal:
        keep &= np.tril(np.ones((T_q, T_k), dtype=bool))
    keep[1, :, :, T_k - pad :] = False
    keep[1, :, :, 0] = True
    if full_row:
        keep[0, :, 0, :] = False
    return keep


def _softmax_variants(args):
    x, mask = args["x"], args.get("mask")
    return [("attention.softmax_wrong_axis", "softmax over axis -2 instead of the last", VR.softmax(x, mask, -2))]


def _layer_norm_variants(args):
    x, D = args["x"], args["x"].shape[-1]
    out = []
    for vid, message, knobs in MK.variants("layer_norm", MK.Site(D, D)):
        value = VR.layer_norm(x, args["weight"], args["bias"], args["eps"], **knobs)
        out.append((vid, message.format(eps=args["eps"]), value))
    return out


def _attention_variants(args):
    from .matchers import attention_variants

    q, k, v, keep = args["q"], args["k"], args["v"], args.get("mask")
    out = []
    for vid, message, knobs in attention_variants(q.shape[-1] * H, q.shape[-1], keep, self_attention=False):
        knobs = dict(knobs)
        if "transpose" in knobs:
            continue  # heads are already split in this pair
        out.append((vid, message, VR.attention_heads(q, k, v, knobs.pop("keep", keep), **knobs)))
    return out


def _mha_variants(args):
    from .matchers import attention_variants

    p, q, k, v, keep = args["params"], args["query"], args["key"], args["value"], args.get("attn_mask")
    H_ = args["n_heads"]
    out = []
    for vid, message, knobs in attention_variants(q.shape[-1], q.shape[-1] // H_, keep, self_attention=False):
        knobs = dict(knobs)
        kk, transpose = knobs.pop("keep", keep), knobs.pop("transpose", True)
        heads = [VR.split(VR.linear(x, p, f"{n}_proj"), H_, transpose) for x, n in ((q, "q"), (k, "k"), (v, "v"))]
        context = VR.merge(VR.attention_heads(*heads, kk, **knobs), transpose)
        out.append((vid, message, VR.linear(context, p, "out_proj")))
    return out


def _linear_params(rng, prefix_dims: dict) -> dict:
    params = {}
    for name, (o, i) in prefix_dims.items():
        params[f"{name}.weight"] = rng.standard_normal((o, i)) / math.sqrt(i)
        params[f"{name}.bias"] = 0.3 * rng.standard_normal(o)
    return params


def _layer_params(rng) -> dict:
    params = _linear_params(rng, {f"self_attn.{p}_proj": (D, D) for p in ("q", "k", "v", "out")})
    params |= _linear_params(rng, {"ffn.linear1": (F, D), "ffn.linear2": (D, F)})
    for norm in ("self_attn_norm", "ffn_norm"):
        params[f"{norm}.weight"] = 1 + 0.2 * rng.standard_normal(D)
        params[f"{norm}.bias"] = 0.2 * rng.standard_normal(D)
    return params


def _n(rng, *shape):
    return rng.standard_normal(shape)


PAIRS = {
    "softmax": Pair(
        L.softmax_forward,
        L.softmax_backward,
        ["x"],
        {
            "rows (B, H, T, T)": lambda r: dict(x=_n(r, B, H, 5, 5)),
            "padding mask": lambda r: dict(x=_n(r, B, H, 5, 6), mask=_mask(5, 6, pad=2)),
            "a fully masked row": lambda r: dict(x=_n(r, B, H, 4, 4), mask=_mask(4, 4, full_row=True)),
            "large scores": lambda r: dict(x=LARGE * _n(r, B, 3, 5)),
        },
        variants=_softmax_variants,
    ),
    "linear": Pair(
        L.linear_forward,
        L.linear_backward,
        ["x", "weight", "bias"],
        {
            "(B, T, D) -> (B, T, F)": lambda r: dict(x=_n(r, B, 5, D), weight=_n(r, F, D), bias=_n(r, F)),
            "(N, D) -> (N, V)": lambda r: dict(x=_n(r, 7, D), weight=_n(r, V, D), bias=_n(r, V)),
        },
    ),
    "layer_norm": Pair(
        L.layer_norm_forward,
        L.layer_norm_backward,
        ["x", "weight", "bias"],
        {
            "(B, T, D)": lambda r: dict(x=_n(r, B, 5, D), weight=1 + 0.2 * _n(r, D), bias=_n(r, D), eps=1e-5),
            "offset and scaled rows": lambda r: dict(
                x=3 + 5 * _n(r, 3, 4, D), weight=1 + 0.2 * _n(r, D), bias=_n(r, D), eps=1e-3
            ),
        },
        variants=_layer_norm_variants,
    ),
    "dropout": Pair(
        L.dropout_forward,
        L.dropout_backward,
        ["x"],
        {
            "(B, T, D), p = 0.25": lambda r: dict(x=_n(r, B, 5, D), p=0.25, keep_mask=r.random((B, 5, D)) >= 0.25),
            "(N, F), p = 0.5": lambda r: dict(x=_n(r, 6, F), p=0.5, keep_mask=r.random((6, F)) >= 0.5),
        },
    ),
    "embedding": Pair(
        L.embedding_forward,
        L.embedding_backward,
        ["weight"],
        {
            "repeated ids": lambda r: dict(ids=r.integers(0, 4, size=(B, 6)), weight=_n(r, V, D)),
            "one sequence": lambda r: dict(ids=r.integers(0, V, size=(1, 9)), weight=_n(r, V, D)),
        },
    ),
    "scaled_dot_product_attention": Pair(
        A.scaled_dot_product_attention_forward,
        A.scaled_dot_product_attention_backward,
        ["q", "k", "v"],
        {
            "padding, T_q = T_k": lambda r: dict(
                q=_n(r, B, H, 5, 4), k=_n(r, B, H, 5, 4), v=_n(r, B, H, 5, 4), mask=_mask(5, 5, pad=2)
            ),
            "T_q != T_k, causal": lambda r: dict(
                q=_n(r, B, H, 4, 4), k=_n(r, B, H, 6, 4), v=_n(r, B, H, 6, 4), mask=_mask(4, 6, causal=True)
            ),
            "a fully masked row": lambda r: dict(
                q=_n(r, B, H, 4, 4), k=_n(r, B, H, 4, 4), v=_n(r, B, H, 4, 4), mask=_mask(4, 4, full_row=True)
            ),
            "large scores": lambda r: dict(q=30 * _n(r, B, H, 4, 4), k=30 * _n(r, B, H, 4, 4), v=_n(r, B, H, 4, 4)),
        },
        variants=_attention_variants,
    ),
    "multi_head_attention": Pair(
        A.multi_head_attention_forward,
        A.multi_head_attention_backward,
        ["query", "key", "value", "params"],
        {
            "cross-attention, T_q != T_k, padding": lambda r: dict(
                params=_linear_params(r, {f"{p}_proj": (D, D) for p in ("q", "k", "v", "out")}),
                query=_n(r, B, 4, D),
                key=_n(r, B, 6, D),
                value=_n(r, B, 6, D),
                n_heads=H,
                attn_mask=_mask(4, 6, pad=2),
            ),
            "a fully masked row": lambda r: dict(
                params=_linear_params(r, {f"{p}_proj": (D, D) for p in ("q", "k", "v", "out")}),
                query=_n(r, B, 5, D),
                key=_n(r, B, 5, D),
                value=_n(r, B, 5, D),
                n_heads=H,
                attn_mask=_mask(5, 5, full_row=True, causal=True),
            ),
        },
        variants=_mha_variants,
    ),
    "feed_forward": Pair(
        L.feed_forward_forward,
        L.feed_forward_backward,
        ["x", "params"],
        {
            f"{act}": (
                lambda r, act=act: dict(
                    params=_linear_params(r, {"linear1": (F, D), "linear2": (D, F)}), x=_n(r, B, 5, D), activation=act
                )
            )
            for act in ("relu", "gelu")
        },
    ),
    "cross_entropy": Pair(
        LS.cross_entropy_forward,
        LS.cross_entropy_backward,
        ["logits"],
        {
            "ignored targets": lambda r: dict(logits=2 * _n(r, B, 5, V), targets=_targets(r), ignore_index=-100),
            "label smoothing": lambda r: dict(
                logits=2 * _n(r, B, 5, V), targets=_targets(r), ignore_index=-100, label_smoothing=0.1
            ),
        },
        call_backward=lambda backward, dout, cache: backward(cache, dout),
    ),
    "encoder_layer": Pair(
        M.encoder_layer_forward,
        M.encoder_layer_backward,
        ["x", "params"],
        {
            "post-norm, padding": lambda r: dict(
                params=_layer_params(r),
                x=_n(r, B, 5, D),
                mask=_mask(1, 5, pad=2)[:, :, :1],
                config=_layer_config(False),
            ),
            "pre-norm, gelu": lambda r: dict(
                params=_layer_params(r),
                x=_n(r, B, 6, D),
                mask=_mask(1, 6, pad=1)[:, :, :1],
                config=_layer_config(True, "gelu"),
            ),
        },
    ),
}


def _targets(rng):
    targets = rng.integers(0, V, size=(B, 5))
    targets[1, -2:] = -100
    return targets


def _layer_config(norm_first, activation="relu"):
    return TransformerConfig(d_model=D, n_heads=H, d_ff=F, norm_first=norm_first, activation=activation)


def _cast(args, dtype):
    def one(v):
        if isinstance(v, dict):
            return {k: one(x) for k, x in v.items()}
        if isinstance(v, np.ndarray) and v.dtype.kind == "f":
            return v.astype(dtype)
        return v

    return {k: one(v) for k, v in args.items()}


def _copy(args):
    return {k: ({a: b.copy() for a, b in v.items()} if isinstance(v, dict) else v) for k, v in args.items()}


def _grads(pair: Pair, backward, dout, cache) -> dict:
    call = pair.call_backward or (lambda b, d, c: b(d, c))
    grads = call(backward, dout, cache)
    if len(pair.wrt) == 1:
        grads = (grads,)
    if not isinstance(grads, (tuple, list)) or len(grads) != len(pair.wrt):
        raise TypeError(f"backward must return the gradients of {pair.wrt} in that order, got {type(grads).__name__}")
    out = {}
    for name, g in zip(pair.wrt, grads, strict=True):
        flatten_into(name, g, out)
    return out


@dataclass
class Case:
    """One case of one pair in one dtype, as _judge_case runs it: the reference pair (spec), the user's pair, the
    case's name and inputs, and where what it finds goes (the result's rows and diagnoses, the backward mistakes
    that reproduce one gradient here)."""

    spec: Pair
    reference: str
    forward: object
    backward: object
    name: str
    args: dict
    dtype: np.dtype
    seed: int
    result: Result
    matches: list  # (case, Diagnosis)

    def row(self, tensor: str, error: float, bar: float, note: str = "", against: str = "the reference") -> Row:
        name = f"{self.name}: {tensor}" + (" vs finite differences" if against == "finite differences" else "")
        return Row(name, self.dtype.name, error, bar, note, self.name, tensor, against)


def pair(forward, backward, reference: str, *, dtypes=("float64", "float32"), seed: int = 0) -> Result:
    """Judge a user's NumPy pair (forward, backward) against the reference pair `reference` (one of PAIRS) and
    against central differences of the user's own forward; see the module docstring. print(result) for the report."""
    if reference not in PAIRS:
        raise ValueError(f"reference must be one of {', '.join(PAIRS)}; got {reference!r}")
    if not callable(forward) or not callable(backward):
        raise TypeError(
            f"forward and backward must be callables, got {type(forward).__name__} and {type(backward).__name__}"
        )
    spec = PAIRS[reference]
    result = Result(reference=reference)
    result.conventions = {
        "protocol": "out, cache = forward(**args); grads = backward(dout, cache)",
        "bars": f"float64 {BAR[np.dtype('float64')]:.0e} against the reference and {FD_BAR:.0e} against finite "
        f"differences of your forward, float32 {BAR[np.dtype('float32')]:.0e} against the reference",
    }
    matches: list = []  # (case, Diagnosis): a known backward mistake that reproduces one gradient in one case
    for name, make in spec.cases.items():
        for dtype in dtypes:
            args = _cast(make(np.random.default_rng(seed)), np.dtype(dtype))
            case = Case(spec, reference, forward, backward, name, args, np.dtype(dtype), seed, result, matches)
            if not _run_case(case):
                return result
    _verdict(result, matches)
    return result


def _run_case(case: Case) -> bool:
    """Judge one case; False when the user's pair is not implemented yet (the check stops there)."""
    try:
        with np.errstate(all="ignore"):  # a user's overflow is reported, not warned about
            _judge_case(case)
    except NotImplementedError as exc:
        case.result.rows.append(case.row("(not implemented)", math.inf, 0.0))
        case.result.unexplained = f"not implemented yet: {exc}" if str(exc) else "not implemented yet"
        case.result.passed = False
        return False
    except Exception as exc:  # the user's code failed: report it, the case fails
        case.result.rows.append(case.row(f"raised {type(exc).__name__}", math.inf, 0.0, str(exc)[:80]))
    return True


def _verdict(result: Result, matches: list) -> None:
    """The diagnoses (an overflow only at large scores; the backward mistakes consistent over the cases) and the
    verdict."""
    failing_outputs = {r.case for r in result.rows if not r.ok and r.tensor == "output"}
    if failing_outputs == {"large scores"} and not result.diagnoses:  # right until the scores are large
        result.diagnoses.append(
            Diagnosis(
                "attention.no_max_subtraction",
                "right on ordinary inputs, wrong at scores of "
                f"~{LARGE:g}: exp overflows without subtracting each row's maximum",
                "forward",
                math.inf,
            )
        )
    result.diagnoses += _consistent(matches, result.rows)
    unique: dict = {}
    for d in result.diagnoses:
        unique.setdefault((d.id, d.where), d)
    result.diagnoses = list(unique.values())
    result.passed = all(r.ok for r in result.rows) and not result.diagnoses
    if not result.passed and result.unexplained is None:
        result.unexplained = _worst_gradients(result.rows)


def _consistent(matches, rows) -> list:
    """The backward mistakes that reproduce a gradient in every float64 case where that gradient fails."""
    failing: dict = {}
    for r in rows:
        if r.dtype == "float64" and not r.ok and r.tensor.startswith("d") and r.against == "the reference":
            failing.setdefault(r.tensor, set()).add(r.case)
    seen: dict = {}
    for case, d in matches:
        seen.setdefault((d.id, d.where), (d, set()))[1].add(case)
    return [d for d, cases in seen.values() if cases >= failing.get(d.where, set())]


def _worst_gradients(rows) -> str:
    """Which gradient is wrong and by how much: each failing tensor's worst error (float64), against the reference
    and against finite differences of the user's own forward."""
    worst: dict = {}
    for r in rows:
        if r.ok or r.dtype != "float64" or not r.case:
            continue
        seen = worst.setdefault(r.tensor, {}).get(r.against, 0.0)
        worst[r.tensor][r.against] = r.error if not r.error <= seen else seen  # NaN kept: max(seen, nan) drops it
    parts = [f"{k}: " + ", ".join(f"{e:.2e} against {kind}" for kind, e in v.items()) for k, v in worst.items()]
    return "wrong: " + "; ".join(parts) if parts else "only float32 fails"


def _judge_case(case: Case) -> None:
    """The user's output and gradients against the reference's; the known backward mistakes of each wrong gradient;
    the forward's variants; the user's backward against central differences of the user's own forward."""
    spec, bar = case.spec, BAR[case.dtype]
    ref_out, ref_cache = spec.forward(**_copy(case.args))
    with np.errstate(all="ignore"):
        out, cache = case.forward(**_copy(case.args))
    out = np.asarray(out)
    if out.shape != np.shape(ref_out):
        raise ValueError(f"forward returned shape {out.shape}, expected {np.shape(ref_out)}")
    if not np.all(np.isfinite(out)) and np.all(np.isfinite(ref_out)):
        _overflowed(case)
        return
    dout = np.random.default_rng(case.seed + 1).standard_normal(np.shape(ref_out)).astype(case.dtype)
    dout = float(dout) if np.ndim(ref_out) == 0 else dout
    ref_grads = {k: g for k, g in _grads(spec, spec.backward, dout, ref_cache).items() if g is not None}
    grads = _grads(spec, case.backward, dout, cache)
    misshapen = _misshapen(case, grads, ref_grads, dout)
    compared = {"output": (out, ref_out)} | {f"d{n}": (grads[n], g) for n, g in ref_grads.items() if n not in misshapen}
    errors = {k: e for k, (_, e) in relative_errors(compared, case.dtype).items()}
    case.result.rows += [case.row(n, e, bar) for n, e in errors.items()] + list(misshapen.values())
    if case.dtype != np.float64:
        return
    for name, g in ref_grads.items():  # each wrong gradient: is it a known mistake?
        if errors.get(f"d{name}", 0.0) > bar:
            case.matches += [(case.name, d) for d in BM.diagnose(case.reference, name, grads[name], g, case.args, dout)]
    if misshapen:
        return  # central differences need gradients of the inputs' shapes
    if errors["output"] > bar and spec.variants is not None:
        _forward_variants(case, out)
    _finite_differences(case)


def _overflowed(case: Case) -> None:
    """An output of inf/NaN where the reference's is finite: at large scores, the missing max subtraction."""
    if case.name == "large scores":
        message = f"{case.name}: the forward overflows to inf/NaN; subtract each row's maximum before exp"
        case.result.diagnoses.append(Diagnosis("attention.no_max_subtraction", message, "forward", math.inf))
    case.result.rows.append(case.row("output", math.inf, BAR[case.dtype], "inf/NaN"))


def _misshapen(case: Case, grads: dict, ref_grads: dict, dout) -> dict:
    """{input name: row} for each gradient of the wrong shape, which a known mistake must explain (else raises)."""
    out = {}
    for name, g in ref_grads.items():
        if name not in grads or grads[name] is None:
            raise ValueError(f"backward gave no gradient for {name}")
        if np.shape(grads[name]) == np.shape(g):
            continue
        found = BM.diagnose(case.reference, name, grads[name], g, case.args, dout)
        if not found:
            raise ValueError(f"backward's d{name} has shape {np.shape(grads[name])}, expected {np.shape(g)}")
        case.matches += [(case.name, d) for d in found]
        out[name] = case.row(f"d{name}", math.inf, BAR[case.dtype], f"shape {np.shape(grads[name])}")
    return out


def _forward_variants(case: Case, out) -> None:
    """The pair's forward variants (the catalogue's) that reproduce the user's output."""
    for vid, message, variant in case.spec.variants(case.args):
        if relative_errors({"v": (out, variant)}, np.float64)["v"][1] <= 1e-8:
            case.result.diagnoses.append(Diagnosis(vid, f"{case.name}: {message}", "forward", 0.0))


def _finite_differences(case: Case) -> None:
    """The user's backward against central differences of the user's own forward (float64)."""
    call = case.spec.call_backward or (lambda b, d, c: b(d, c))
    fd = gradcheck.check_pair(
        case.forward, lambda d, c: call(case.backward, d, c), _copy(case.args), case.spec.wrt, seed=case.seed,
        max_coords=12,
    )  # fmt: skip
    for name, error in fd.errors.items():
        case.result.rows.append(case.row(f"d{name}", error, FD_BAR, against="finite differences"))
