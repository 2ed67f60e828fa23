"""Test helpers: a student's right answer to each workbook exercise, written from each file's own cache, and the
known mistakes made in them; `answer(directory, name, mistake=None)` writes one into a workbook.

The bodies replace the exercise's `raise NotImplementedError(...)` line; none imports the reference (the grader
refuses that), except the encoder layer's, which chains the reference pairs the exercise file itself imports.
"""

from __future__ import annotations

import re
from pathlib import Path

ANSWERS = {
    "softmax": """
    p = cache["p"]
    return p * (dout - (dout * p).sum(axis=-1, keepdims=True))  # dx = p (dp - rowsum(dp p))
""",
    "linear": """
    x, weight = cache["x"], cache["weight"]
    dx = dout @ weight  # (..., D_in)
    dweight = dout.reshape(-1, dout.shape[-1]).T @ x.reshape(-1, x.shape[-1])  # (D_out, D_in)
    dbias = dout.reshape(-1, dout.shape[-1]).sum(axis=0)  # (D_out,)
    return dx, dweight, dbias
""",
    "layer_norm": """
    x_hat, rstd, weight = cache["x_hat"], cache["rstd"], cache["weight"]
    D = x_hat.shape[-1]
    dweight = (dout * x_hat).reshape(-1, D).sum(axis=0)
    dbias = dout.reshape(-1, D).sum(axis=0)
    g = dout * weight
    dx = rstd * (g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))
    return dx, dweight, dbias
""",
    "embedding": """
    dweight = np.zeros(cache["shape"], dtype=dout.dtype)
    np.add.at(dweight, cache["ids"], dout)  # repeated ids add up
    return dweight
""",
    "dropout": """
    return dout * cache["keep_mask"] * cache["scale"]  # the same mask and scale as the forward
""",
    "scaled_dot_product_attention": """
    q, k, v, p, scale = cache["q"], cache["k"], cache["v"], cache["p"], cache["scale"]
    dv = np.swapaxes(p, -1, -2) @ dout
    dp = dout @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * scale
    return ds @ k, np.swapaxes(ds, -1, -2) @ q, dv
""",
    "multi_head_attention": """
    params, p = cache["params"], cache["p"]
    q, k, v = cache["q"], cache["k"], cache["v"]
    B, H, T_q, Dh = q.shape

    def merge(x):  # (B, H, T, Dh) -> (B, T, D)
        return x.transpose(0, 2, 1, 3).reshape(B, x.shape[2], H * Dh)

    def linear_back(d, x, name):
        d2, x2 = d.reshape(-1, d.shape[-1]), x.reshape(-1, x.shape[-1])
        grads[name + ".weight"], grads[name + ".bias"] = d2.T @ x2, d2.sum(axis=0)
        return d @ params[name + ".weight"]

    grads = {}
    dcontext = linear_back(dout, cache["context"], "out_proj")
    do = dcontext.reshape(B, T_q, H, Dh).transpose(0, 2, 1, 3)
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) / np.sqrt(Dh)
    dq, dk = ds @ k, np.swapaxes(ds, -1, -2) @ q
    dquery = linear_back(merge(dq), cache["query"], "q_proj")
    dkey = linear_back(merge(dk), cache["key"], "k_proj")
    dvalue = linear_back(merge(dv), cache["value"], "v_proj")
    return dquery, dkey, dvalue, grads
""",
    "feed_forward": """
    params, x, h, a = cache["params"], cache["x"], cache["h"], cache["a"]
    grads = {}

    def rows(t):
        return t.reshape(-1, t.shape[-1])

    grads["linear2.weight"], grads["linear2.bias"] = rows(dout).T @ rows(a), rows(dout).sum(axis=0)
    da = dout @ params["linear2.weight"]
    if cache["inputs"]["activation"] == "relu":
        dh = da * (h > 0)
    else:
        dh = da * (0.5 * (1.0 + erf(h / np.sqrt(2.0))) + h * np.exp(-0.5 * h * h) / np.sqrt(2.0 * np.pi))
    grads["linear1.weight"], grads["linear1.bias"] = rows(dh).T @ rows(x), rows(dh).sum(axis=0)
    return dh @ params["linear1.weight"], grads
""",
    "cross_entropy": """
    p, targets, keep, e = cache["p"], cache["targets"], cache["keep"], cache["label_smoothing"]
    V = p.shape[-1]
    target = np.zeros_like(p)
    np.put_along_axis(target, targets[..., None], 1.0, axis=-1)
    dlogits = p - (1.0 - e) * target - e / V
    return dlogits * keep[..., None] * (dloss / cache["count"])
""",
    "encoder_layer": """
    grads = {}

    def put(prefix, g):
        grads.update({f"{prefix}.{k}": v for k, v in g.items()})

    def attention_back(d):
        dq, dk, dv, g = multi_head_attention_backward(d, cache["attn"])
        put("self_attn", g)
        return dq + dk + dv

    def norm_back(d, cache_, prefix):
        dx_, grads[prefix + ".weight"], grads[prefix + ".bias"] = layer_norm_backward(d, cache_)
        return dx_

    def ffn_back(d):
        dx_, g = feed_forward_backward(d, cache["ffn"])
        put("ffn", g)
        return dx_

    if cache["norm_first"]:
        dh = dout + norm_back(ffn_back(dout), cache["norm2"], "ffn_norm")
        dx = dh + norm_back(attention_back(dh), cache["norm1"], "self_attn_norm")
    else:
        ds = norm_back(dout, cache["norm2"], "ffn_norm")
        dh = ds + ffn_back(ds)
        da = norm_back(dh, cache["norm1"], "self_attn_norm")
        dx = da + attention_back(da)
    return dx, grads
""",
}

# Known mistakes, each as a student would make it: (exercise, catalogue id, the gradients it makes wrong, the text
# of the answer it changes, what the student wrote instead).
MISTAKES = [
    ("softmax", "softmax.missing_row_term", ["dx"], "p * (dout - (dout * p).sum(axis=-1, keepdims=True))", "p * dout"),
    ("softmax", "backward.sign_flipped", ["dx"], "return p * (dout", "return -p * (dout"),
    ("softmax", "backward.scaled", ["dx"], "return p * (dout", "return 2 * p * (dout"),
    ("linear", "linear.weight_grad_transposed", ["dweight"], "dout.reshape(-1, dout.shape[-1]).T @ x.reshape(-1, "
     "x.shape[-1])", "x.reshape(-1, x.shape[-1]).T @ dout.reshape(-1, dout.shape[-1])"),
    ("linear", "linear.bias_not_summed", ["dbias"], "dbias = dout.reshape(-1, dout.shape[-1]).sum(axis=0)",
     "dbias = dout.sum(axis=0)"),
    ("linear", "linear.bias_not_summed", ["dbias"], "dbias = dout.reshape(-1, dout.shape[-1]).sum(axis=0)",
     "dbias = dout.reshape(-1, dout.shape[-1]).mean(axis=0)"),
    ("linear", "backward.scaled", ["dx"], "dx = dout @ weight", "dx = 2 * dout @ weight"),
    ("linear", "backward.sign_flipped", ["dweight"], "dweight = dout", "dweight = -dout"),
    ("layer_norm", "layer_norm.missing_mean_term", ["dx"], "g - g.mean(axis=-1, keepdims=True) - x_hat", "g - x_hat"),
    ("layer_norm", "layer_norm.missing_variance_term", ["dx"], " - x_hat * (g * x_hat).mean(axis=-1, keepdims=True)",
     ""),
    ("layer_norm", "layer_norm.missing_mean_term+layer_norm.missing_variance_term", ["dx"],
     "(g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))", "g"),
    ("layer_norm", "linear.bias_not_summed", ["dbias"], "dbias = dout.reshape(-1, D).sum(axis=0)",
     "dbias = dout.sum(axis=0)"),
    ("layer_norm", "backward.scaled", ["dweight"], "(dout * x_hat).reshape(-1, D).sum(axis=0)",
     "(dout * x_hat).reshape(-1, D).mean(axis=0)"),
    ("embedding", "embedding.repeated_ids", ["dweight"], 'np.add.at(dweight, cache["ids"], dout)',
     'dweight[cache["ids"]] += dout'),
    ("dropout", "dropout.mask_not_reapplied", ["dx"], 'dout * cache["keep_mask"] * cache["scale"]',
     'dout * cache["scale"]'),
    ("dropout", "dropout.not_rescaled", ["dx"], 'dout * cache["keep_mask"] * cache["scale"]',
     'dout * cache["keep_mask"]'),
    ("scaled_dot_product_attention", "softmax.missing_row_term", ["dq", "dk"],
     "p * (dp - (dp * p).sum(axis=-1, keepdims=True))", "p * dp"),
    ("scaled_dot_product_attention", "attention.backward_missing_scale", ["dq", "dk"],
     "keepdims=True)) * scale", "keepdims=True))"),
    ("scaled_dot_product_attention", "backward.sign_flipped", ["dv"], "dv = np.swapaxes", "dv = -np.swapaxes"),
    ("multi_head_attention", "softmax.missing_row_term", ["dquery", "dkey", "dparams.q_proj.weight"],
     "p * (dp - (dp * p).sum(axis=-1, keepdims=True))", "p * dp"),
    ("multi_head_attention", "attention.backward_missing_scale", ["dquery", "dkey", "dparams.k_proj.weight"],
     "keepdims=True)) / np.sqrt(Dh)", "keepdims=True))"),
    ("multi_head_attention", "linear.weight_grad_transposed", [f"dparams.{n}_proj.weight" for n in "qkv"] +
     ["dparams.out_proj.weight"], "d2.T @ x2", "x2.T @ d2"),
    ("multi_head_attention", "linear.bias_not_summed", ["dparams.out_proj.bias", "dparams.v_proj.bias"],
     "d2.sum(axis=0)", "d.sum(axis=0)"),
    ("feed_forward", "linear.weight_grad_transposed", ["dparams.linear2.weight"], "rows(dout).T @ rows(a)",
     "rows(a).T @ rows(dout)"),
    ("feed_forward", "linear.bias_not_summed", ["dparams.linear1.bias"], "rows(dh).sum(axis=0)", "dh.sum(axis=0)"),
    ("feed_forward", "backward.sign_flipped", ["dx"], "return dh @", "return -dh @"),
    ("cross_entropy", "cross_entropy.wrong_denominator", ["dlogits"], '(dloss / cache["count"])',
     "(dloss / keep.size)"),
    ("cross_entropy", "cross_entropy.wrong_denominator", ["dlogits"], '* (dloss / cache["count"])', "* dloss"),
    ("cross_entropy", "backward.sign_flipped", ["dlogits"], "p - (1.0 - e) * target - e / V",
     "(1.0 - e) * target + e / V - p"),
    ("encoder_layer", "backward.sign_flipped", ["dx"], "return dx, grads", "return -dx, grads"),
]  # fmt: skip


def mistake(name: str, vid: str) -> tuple:
    """(right text, wrong text) of the first mistake `vid` listed for exercise `name`."""
    return next((right, wrong) for n, i, _, right, wrong in MISTAKES if (n, i) == (name, vid))


def answer(directory, name: str, mistake: tuple | None = None) -> Path:
    """Write the right answer to exercise `name` into the workbook file in `directory`, with `mistake` (a pair
    (right text, wrong text) applied to the answer) put in when given. Returns the file's path."""
    body = ANSWERS[name]
    if mistake is not None:
        right, wrong = mistake
        assert right in body, f"{right!r} is not in the answer to {name}"
        body = body.replace(right, wrong)
    path = Path(directory) / f"{name}.py"
    text = path.read_text()
    stub = re.search(r"\n    raise NotImplementedError\(.*\)\n", text)
    assert stub is not None, f"{path} has no stub left"
    path.write_text(text[: stub.start()] + "\n" + body.strip("\n").join(["", "\n"]) + text[stub.end() :])
    return path
