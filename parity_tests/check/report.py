"""What a check returns: the catalogue of known mistakes, a diagnosis, and the result with its printed report."""

from __future__ import annotations

from dataclasses import dataclass, field

# The catalogue (docs/howto/check_your_model.md): id -> the line of math the mistake changes. Ids are stable; new
# ones may be added.
CATALOGUE = {
    "layer_norm.unbiased_variance": "var = sum((x - mean)^2) / (n - 1) instead of / n",
    "layer_norm.eps_outside_sqrt": "y = (x - mean) / (sqrt(var) + eps) instead of / sqrt(var + eps)",
    "attention.wrong_scale": "scores = Q K^T / c with c != sqrt(d_head)",
    "attention.no_max_subtraction": "softmax = exp(s) / sum(exp(s)) without subtracting the row maximum: overflows",
    "attention.mask_after_softmax": "P = softmax(S) then P[masked] = 0, instead of S[masked] = -inf before softmax",
    "attention.mask_ignored": "the mask is passed in but never applied: P = softmax(S) over every key",
    "attention.mask_inverted": "the mask's polarity flipped: the kept keys are masked and the masked ones kept",
    "attention.not_causal": "the decoder's self-attention sees the future: no causal mask",
    "attention.causal_hides_diagonal": "causal mask j < i instead of j <= i: a query cannot see its own position",
    "attention.causal_shows_next": "causal mask j <= i + 1 instead of j <= i: a query sees one future position",
    "attention.padding_on_queries": "padding masks query rows instead of key columns",
    "attention.masks_swapped": "the decoder's self-attention gets the source mask and cross-attention the target's",
    "attention.heads_without_transpose": "(B, T, D).view(B, H, T, Dh) without the transpose: heads mix positions",
    "attention.softmax_wrong_axis": "softmax over queries (dim=-2) instead of keys (dim=-1)",
    "dropout.active_in_eval": "dropout applied in evaluation mode: two calls on the same input differ",
    "positions.wrong_frequencies": "sinusoid frequencies not 1 / 10000^(2i/d)",
    "embedding.missing_scale": "token embeddings not multiplied by sqrt(d_model)",
    "embedding.double_scale": "token embeddings multiplied by sqrt(d_model) twice (by d_model)",
    "rms_norm.eps_outside_sqrt": "y = x / (sqrt(mean(x^2)) + eps) instead of x / sqrt(mean(x^2) + eps)",
    "rms_norm.wrong_axis": "mean(x^2) over the positions, the batch or everything instead of the features (dim=-1)",
    "rope.mixed_pairing": "queries and keys rotated with different pairings: halves (i, i + Dh/2) and pairs (2i, 2i+1)",
    "rope.position_offset": "keys rotated at positions offset from the queries': scores see n - m + 1, not n - m",
    "rope.applied_to_v": "the values rotated too: RoPE rotates queries and keys only",
    "gated_feed_forward.activation_on_up": "down(gate(x) * silu(up(x))) instead of down(silu(gate(x)) * up(x))",
    "attention.kv_heads_tiled": "K/V heads tiled (.repeat: head h reads h % n_kv), not repeat_interleave (h // n_rep)",
    "dtype.float32_island": "a float64 model computes in float32 inside a submodule (x.float(), .to(torch.float32))",
    # A hand-written backward pass (check.pair), named per gradient by check/backward_mistakes.py:
    "softmax.missing_row_term": "dx = p * dp instead of p * (dp - rowsum(dp * p)): rows of dx must sum to zero",
    "layer_norm.missing_mean_term": "dx = r (g - x_hat mean(g x_hat)) without - mean(g): the path through the mean",
    "layer_norm.missing_variance_term": "dx = r (g - mean(g)) without - x_hat mean(g x_hat): the path through the var",
    "embedding.repeated_ids": "dweight[ids] += dout (a repeated id counted once) instead of np.add.at",
    "backward.scaled": "a gradient off by a constant factor (a scale missing, doubled or inverted; a mean for a sum)",
    "backward.sign_flipped": "a gradient with the wrong sign",
    "linear.weight_grad_transposed": "dweight = x^T dout (D_in, D_out) instead of dout^T x (D_out, D_in)",
    "linear.bias_not_summed": "dbias = dout (or summed over some leading axes, or averaged) instead of summed over all",
    "dropout.mask_not_reapplied": "dx = dout / (1 - p) without the forward's keep mask",
    "dropout.not_rescaled": "dx = dout * mask without the 1 / (1 - p) the forward applied",
    "attention.backward_missing_scale": "dq = dS K, dk = dS^T Q without the 1/sqrt(d_head) of S = Q K^T / sqrt(d_head)",
    "cross_entropy.wrong_denominator": "dlogits divided by the wrong count (all positions, the batch, or not at all)",
}


# The config fields the report shows at each level (what that level's reference reads).
CONFIG_SHOWN = {
    "scaled_dot_product_attention": (),
    "multi_head_attention": ("d_model", "n_heads", "n_kv_heads", "positional", "rope_theta"),
    "layer_norm": ("d_model", "layer_norm_eps"),
    "rms_norm": ("d_model", "layer_norm_eps"),
    "feed_forward": ("d_model", "d_ff", "activation"),
    "gated_feed_forward": ("d_model", "d_ff", "activation", "bias"),
    "positional_encoding": ("d_model", "positional", "max_len", "sinusoid_layout"),
    "embedding": ("d_model", "src_vocab_size", "scale_embeddings"),
    "encoder_layer": ("d_model", "n_heads", "d_ff", "norm_first", "activation", "layer_norm_eps", "bias"),
    "decoder_layer": ("d_model", "n_heads", "d_ff", "norm_first", "activation", "layer_norm_eps", "bias"),
    "decoder_only_layer": (
        "d_model",
        "n_heads",
        "n_kv_heads",
        "d_ff",
        "norm_first",
        "norm",
        "activation",
        "gated_ffn",
        "positional",
        "rope_theta",
        "layer_norm_eps",
        "bias",
    ),  # fmt: skip
    "model": (
        "src_vocab_size",
        "tgt_vocab_size",
        "d_model",
        "n_heads",
        "d_ff",
        "n_encoder_layers",
        "n_decoder_layers",
        "norm_first",
        "norm",
        "activation",
        "gated_ffn",
        "n_kv_heads",
        "positional",
        "rope_theta",
        "max_len",
        "scale_embeddings",
        "tie_embeddings",
        "share_embeddings",
        "bias",
        "output_bias",
        "layer_norm_eps",
        "pad_id",
    ),
}


@dataclass
class Diagnosis:
    """A known mistake that reproduces the user's output: its catalogue id, a readable message, the user's
    submodule where it sits, and the relative error between the user's output and the variant (float64)."""

    id: str
    message: str
    where: str
    error: float

    def __str__(self) -> str:
        return f"{self.id} at {self.where or '(the module)'}: {self.message} (variant error {self.error:.1e})"


@dataclass
class Row:
    """One compared tensor: its reference name, dtype, relative error, bar, and whether it passed."""

    name: str
    dtype: str
    error: float
    bar: float
    note: str = ""

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
    config: object = None
    conventions: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    unexplained: str | None = None
    error: str | None = None  # the user's code could not run to a verdict (sys.exit in forward, ...): why
    caveats: list = field(default_factory=list)  # (catalogue id, message): what a pass rests on or is judged by
    assumed: dict = field(default_factory=dict)  # the closest conventions, when no run confirmed any
    confirmed: bool = True  # the conventions and config reproduced the reference's output (a run confirmed them)

    def to_dict(self) -> dict:
        """A JSON-ready summary (the CLI's --json)."""
        return {
            "reference": self.reference,
            "passed": self.passed,
            "first_divergence": self.first_divergence,
            "diagnoses": [vars(d) for d in self.diagnoses],
            "mapping": {k: list(v) for k, v in self.mapping.items()},
            "config": None if self.config is None else dict(vars(self.config)),
            "conventions": self.conventions,
            "rows": [vars(r) | {"ok": r.ok} for r in self.rows],
            "notes": self.notes,
            "unexplained": self.unexplained,
            "error": self.error,
            "caveats": [list(c) for c in self.caveats],
            "assumed": self.assumed,
            "confirmed": self.confirmed,
        }

    def _table(self) -> list:
        """One line per tensor: its relative error in each dtype compared, against that dtype's bar."""
        by_name, dtypes = {}, []
        for r in self.rows:
            by_name.setdefault(r.name, {})[r.dtype] = r
            if r.dtype not in dtypes:
                dtypes.append(r.dtype)
        width = max(len(n) for n in by_name)
        head = "".join(f"  {d + ' (' + self._bars(d) + ')':>20}" for d in dtypes)
        lines = [f"  {'tensor':<{width}}{head}"]
        for name, cells in by_name.items():
            text = ""
            for d in dtypes:
                r = cells.get(d)
                text += f"  {'':>20}" if r is None else f"  {format(r.error, '.2e') + ('' if r.ok else ' FAIL'):>20}"
            lines.append(f"  {name:<{width}}{text}")
        return lines

    def _bars(self, dtype: str) -> str:
        """The bars of a dtype's rows: one, or two (check.pair's: the reference's, then finite differences'), or a
        range (check.module's float32 bars, scaled to the reference's own float32 error per tensor)."""
        bars = sorted({r.bar for r in self.rows if r.dtype == dtype})
        if len(bars) <= 2:
            return "bar " + " / ".join(format(b, ".0e") for b in bars)
        return f"bars {bars[0]:.0e} to {bars[-1]:.0e}"

    def summary(self) -> str:
        """The report without the map and the table: verdict, conventions, config, counts, divergence, diagnosis."""
        failed = [r for r in self.rows if not r.ok]
        lines = [line for line in str(self).splitlines() if not line.startswith("  ")]
        lines = [line for line in lines if not line.startswith("mapping (")]
        lines.insert(1, f"{len(self.rows) - len(failed)} of {len(self.rows)} comparisons within their bars")
        return "\n".join(lines)

    def __str__(self) -> str:
        lines = [f"check against the reference {self.reference!r}: {'PASSED' if self.passed else 'FAILED'}"]
        if self.conventions:
            lines.append("conventions: " + ", ".join(f"{k}={v}" for k, v in self.conventions.items()))
        if self.assumed:
            lines.append(
                "conventions assumed (none reproduced the reference; judged under the closest): "
                + ", ".join(f"{k}={v}" for k, v in self.assumed.items())
            )
        if self.config is not None:
            c = self.config
            fields = CONFIG_SHOWN.get(self.reference, CONFIG_SHOWN["model"])
            if c.positional != "rope":  # RoPE's fields only where it rotates; an attention has no other positions
                layer = self.reference in ("multi_head_attention", "decoder_only_layer")
                hidden = {"rope_theta"} | ({"positional"} if layer else set())
                fields = [k for k in fields if k not in hidden]
            if fields:
                head = "config" if self.confirmed else "config assumed (the closest, not confirmed)"
                lines.append(f"{head}: " + ", ".join(f"{k}={getattr(c, k)!r}" for k in fields))
        if self.mapping:
            width = max(len(k) for k in self.mapping)
            lines.append("mapping (user parameter -> reference, layout); pass an edited copy back as mapping=:")
            lines += [f"  {k:<{width}}  {ref}  ({note})" for k, (ref, note) in self.mapping.items()]
        if self.rows:
            lines += self._table()
        if self.first_divergence is not None:
            lines.append(f"first divergence: {self.first_divergence}")
        for d in self.diagnoses:
            lines.append(f"diagnosis: {d}")
        if self.unexplained:
            lines.append(f"unexplained: {self.unexplained}")
        if self.error:
            lines.append(f"error: {self.error}")
        lines += [f"caveat: {id_}: {message}" for id_, message in self.caveats]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)
