"""What a check returns: the catalogue of known mistakes, a diagnosis, and the result with its printed report."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import mistakes as MK
from .diagnosis import Diagnosis as Diagnosis  # re-exported (check.Diagnosis)
from .levels import LEVELS, MODEL_SHOWN
from .pair_table import PAIRS

# The catalogue (docs/howto/check_your_model.md): id -> the line of math the mistake changes, one entry each in the
# registry mistakes.MISTAKES. Ids are stable; new ones may be added.
CATALOGUE = {m.id: m.line for m in MK.MISTAKES}


# The float32 bar of check.module and check.pair, per tensor: FLOAT32_RATIO times the reference's own float32 error
# on that tensor (its float32 run against its float64 run on the same inputs, weights and upstream gradient), never
# below FLOAT32_FLOOR: each float32 result is off the exact value by its own rounding. Measured on the corpus's clean
# models under each OpenBLAS kernel of an AVX-512 CPU: at most 1.4 x the reference's own error (d2l's q/k weight
# gradients), 3.1 x on a key bias's gradient (noise against noise, the exact value ~0), 1.0e-6 where the reference's
# own is below 5e-7; the workbook's answers (check.pair) at most 4e-7. 8 leaves a factor 2.5; the floor (32 float32
# epsilons, 3.8e-6) is for tensors the reference happens to round well.
FLOAT32_RATIO = 8.0
FLOAT32_FLOOR = 32 * float(np.finfo(np.float32).eps)


# config fields the recorded flow sets, shown where set
READ_FROM_FLOW = (
    "parallel_residual", "shared_norm", "attn_softcap", "logit_softcap", "attn_sinks", "sliding_window", "layer_types",
    "attention_scale_by_layer", "rope_scaling", "kv_lora_rank", "q_lora_rank", "head_dim", "v_head_dim",
    "rotary_dim", "attention_scale", "n_experts", "d_expert", "n_shared_experts", "rope_layers",
)  # fmt: skip
MIXTURE = ("top_k", "norm_topk_prob", "dense_layers", "expert_kind")  # shown with n_experts
ROUTER = ["router_scoring", "router_score_bias", "router_groups", "router_topk_groups", "routed_scaling"]  # DeepSeek's


@dataclass
class Row:
    name: str
    dtype: str
    error: float
    bar: float
    note: str = ""
    case: str = ""  # check.pair's: the case, the tensor ("output", "dx", ...) and what it is compared against
    tensor: str = ""
    against: str = "the reference"  # or "finite differences" (of the user's own forward)
    own: float | None = None  # in float32: the reference's own float32 error on this tensor, the bar's basis

    @property
    def ok(self) -> bool:
        return self.error <= self.bar


@dataclass
class Result:
    """The verdict of check.module or check.pair (docs/howto/check_your_model.md)."""

    reference: str
    passed: bool = False
    first_divergence: str | None = None
    diagnoses: list = field(default_factory=list)
    mapping: dict = field(default_factory=dict)
    config: Any = None  # the TransformerConfig judged under
    conventions: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    unexplained: str | None = None
    # "differs at <submodule>: <the user's op> computes <what>, which the reference has no pair for"
    unsupported: str | None = None
    error: str | None = None  # the user's code could not run to a verdict (sys.exit in forward, ...): why
    caveats: list = field(default_factory=list)  # (catalogue id, message): what a pass rests on or is judged by
    assumed: dict = field(default_factory=dict)  # the closest conventions, when no run confirmed any
    confirmed: bool = True  # the conventions and config reproduced the reference's output (a run confirmed them)

    def to_dict(self) -> dict:
        """A JSON-ready summary (the CLI's --json): every field, in order, as plain data."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)} | {
            "diagnoses": [vars(d) for d in self.diagnoses],
            "mapping": {k: list(v) + ([v.data()] if hasattr(v, "data") else []) for k, v in self.mapping.items()},
            "config": None if self.config is None else dict(vars(self.config)),
            "rows": [vars(r) | {"ok": r.ok} for r in self.rows],
            "caveats": [list(c) for c in self.caveats],
        }

    def _table(self) -> list:
        """One line per tensor: its relative error in each dtype compared, against that dtype's bar."""
        cells = {(r.name, r.dtype): f"{r.error:.2e}" + ("" if r.ok else " FAIL") for r in self.rows}
        names, dtypes = (list(dict.fromkeys(getattr(r, key) for r in self.rows)) for key in ("name", "dtype"))
        width = max(map(len, names))
        lines = [f"  {'tensor':<{width}}" + "".join(f"  {d + ' (' + self._bars(d) + ')':>20}" for d in dtypes)]
        return lines + [f"  {n:<{width}}" + "".join(f"  {cells.get((n, d), ''):>20}" for d in dtypes) for n in names]

    def _bars(self, dtype: str) -> str:
        """The bars of a dtype's rows: one, or two (check.pair's: the reference's, then finite differences'), or a
        range (check.module's float32 bars, scaled to the reference's own float32 error per tensor)."""
        bars = sorted({r.bar for r in self.rows if r.dtype == dtype})
        if len(bars) <= 2:
            return "bar " + " / ".join(format(b, ".0e") for b in bars)
        return f"bars {bars[0]:.0e} to {bars[-1]:.0e}"

    def summary(self) -> str:
        """The report without the map and the table: verdict, conventions, config, counts, divergence, diagnosis."""
        head = self._head()
        counts = f"{sum(r.ok for r in self.rows)} of {len(self.rows)} comparisons within their bars"
        return "\n".join(head[:1] + [counts] + head[1:] + self._findings())

    def __str__(self) -> str:
        return "\n".join(self._head() + self._map() + (self._table() if self.rows else []) + self._findings())

    def _head(self) -> list:
        """The verdict, the conventions (confirmed or assumed) and the config."""
        lines = [f"check against the reference {self.reference!r}: {'PASSED' if self.passed else 'FAILED'}"]
        if self.conventions:
            lines.append("conventions: " + ", ".join(f"{k}={v}" for k, v in self.conventions.items()))
        if self.assumed:
            assumed = ", ".join(f"{k}={v}" for k, v in self.assumed.items())
            lines.append(f"conventions assumed (none reproduced the reference; judged under the closest): {assumed}")
        fields = self._config_fields()
        if fields:
            head = "config" if self.confirmed else "config assumed (the closest, not confirmed)"
            lines.append(f"{head}: " + ", ".join(f"{k}={getattr(self.config, k)!r}" for k in fields))
        return lines

    def _config_fields(self) -> list:
        """The config fields shown: the level's (levels.py), RoPE's only where it rotates (an attention or a layer
        has no other positions); a parallel layer's and Gemma 2's soft caps, a first attention without its norm where
        set."""
        if self.config is None:
            return []
        entry = LEVELS.get(self.reference)  # None for "encoder", the alias: a model's fields
        fields = list(MODEL_SHOWN if entry is None or entry.shown is None else entry.shown)
        if self.config.positional != "rope":
            layer = entry is not None and entry.rope and entry.group != "model"  # no position table
            hidden = {"rope_theta"} | ({"positional"} if layer else set())
            fields = [k for k in fields if k not in hidden]
        scaled = ["output_scale"] if self.config.output_scale != 1 else []  # Cohere's logit scale, the paper's d^-0.5
        scaled += ["first_attn_norm"] * (not self.config.first_attn_norm)  # the first attention reads the stream
        mixture = list(MIXTURE) * bool(self.config.n_experts) + ROUTER * self.config.deepseek_router
        mixture += ["relative_buckets", "relative_max_distance"] * self.config.has_relative_bias  # T5's
        return fields + scaled + [k for k in READ_FROM_FLOW if getattr(self.config, k, None)] + mixture

    def _map(self) -> list:
        if not self.mapping:
            return []
        width = max(len(k) for k in self.mapping)
        return ["mapping (user parameter -> reference, layout); pass an edited copy back as mapping=:"] + [
            f"  {k:<{width}}  {ref}  ({note})" for k, (ref, note) in self.mapping.items()
        ]

    def _findings(self) -> list:
        """The first divergence, the diagnoses, what is unexplained, an error, the caveats and the notes."""
        lines = [] if self.first_divergence is None else [f"first divergence: {self.first_divergence}"]
        lines += [f"diagnosis: {d}" for d in self.diagnoses]
        lines += [f"unexplained: {self.unexplained}"] if self.unexplained and not self.unsupported else []
        lines += [self.unsupported] if self.unsupported else []
        lines += [f"error: {self.error}"] if self.error else []
        lines += [f"caveat: {id_}: {message}" for id_, message in self.caveats]
        return lines + [f"note: {n}" for n in self.notes]


def levels_of(mistake: MK.Mistake) -> tuple:
    """The levels `mistake` is looked for at: a forward unit's own level (an attention's: scaled dot-product
    attention too) and every layer, stack and model holding that unit (an embedding's or positions': models); a
    backward mistake's pairs (every pair when none are named); a probe's: every level."""
    if mistake.unit == MK.BACKWARD:
        return mistake.pairs or tuple(PAIRS)
    units = ("attention", "heads") if mistake.unit == MK.ATTENTION else (mistake.unit,)
    holders = ("model",) if mistake.unit in ("embedding", "positions") else ("layer", "stacks", "model")
    return tuple(
        name for name, level in LEVELS.items() if mistake.unit is None or level.unit in units or level.group in holders
    )
