"""The reference with one known mistake put in: forward passes only, in NumPy, float64. Each function is the
reference's math (docs/explanation/derivations.md) with knobs that catalogue mistakes turn; at its defaults every
knob gives the reference itself, which the tests check against the reference pairs. Shape letters: B batch,
H heads, T_q / T_k query and key positions, D d_model, Dh = D / H."""

from __future__ import annotations

import math

import numpy as np

from numpy_transformer.attention import rope_angles
from numpy_transformer.latent_attention import LATENT_NORM_EPS
from numpy_transformer.layers import ACTIVATIONS, sinusoidal_table
from numpy_transformer.model import cross_score_mod, score_mod
from numpy_transformer.scores import relative_buckets


def softmax(scores: np.ndarray, keep: np.ndarray | None, axis: int = -1) -> np.ndarray:
    """softmax over `axis` of the scores with masked entries (keep False) excluded; a row with nothing kept is 0."""
    s = scores if keep is None else np.where(keep, scores, -np.inf)
    top = s.max(axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(s - top)
    total = e.sum(axis=axis, keepdims=True)
    return e / np.where(total == 0.0, 1.0, total)


def attention_heads(
    q, k, v, keep, divisor=None, mask_mode="before", axis=-1, swap_qk=False, softcap=None, cap_mode="scores",
    sinks=None, sink_mode="denominator", alibi=None, bias=None,
):  # fmt: skip
    """out = softmax(Q K^T / divisor) V on heads already split: q (B, H, T_q, Dh), k and v (B, H, T_k, Dh), keep
    broadcastable to (B, H, T_q, T_k) or None. The reference's knobs first: divisor None (sqrt(Dh)); mask_mode
    "before" (masked scores excluded), "fill" (-1e9, as masked_fill, then the softmax over `axis`), "after"
    (probabilities zeroed), "after_renorm" (zeroed, then rows renormalised), "ignored", "added"; axis -1 (-2: over the
    queries); swap_qk: scores K Q^T; softcap: Gemma 2's cap or None, cap_mode "scores" (cap * tanh(S / cap) before
    the mask), "undivided" (cap * tanh(S)), "probabilities" (cap * tanh(P / cap) after the softmax); sinks: GPT-OSS's
    logit per head (H,) in each row's denominator or None, sink_mode "missing": left out of it; alibi: ALiBi's
    (slopes m_h (H,), causal) or None: -m_h |i - j| added to the scores before the cap; causal, m_h j (the key
    index, as BLOOM, MPT and Baichuan add it: on keys j <= i the same softmax over the keys, and the user's scores
    where a mistake reads the keys after the query or softmaxes over the queries); bias: T5's (H, T_q, T_k) or None,
    added to the scores after the scale."""
    divisor = math.sqrt(q.shape[-1]) if divisor is None else divisor
    scores = (k @ q.swapaxes(-1, -2) if swap_qk else q @ k.swapaxes(-1, -2)) / divisor  # (B, H, T_q, T_k)
    scores = scores if bias is None else scores + bias
    if alibi is not None:
        i, j = np.arange(scores.shape[-2])[:, None], np.arange(scores.shape[-1])
        scores = scores + np.asarray(alibi[0])[:, None, None] * (j if alibi[1] else -np.abs(i - j))
    if softcap is not None and cap_mode != "probabilities":
        scores = softcap * np.tanh(scores / softcap if cap_mode == "scores" else scores)
    joined = sinks is not None and sink_mode == "denominator"
    if joined:  # a column of s_h beside the scores, always kept, softmaxed with them (over `axis`) and dropped after
        scores = np.concatenate([scores, np.broadcast_to(sinks.reshape(1, -1, 1, 1), (*scores.shape[:3], 1))], -1)
        if keep is not None:
            keep = np.broadcast_to(keep, scores[..., :-1].shape)
            keep = np.concatenate([keep, np.ones((*keep.shape[:3], 1), bool)], -1)
    if mask_mode == "before":
        probs = softmax(scores, keep, axis)
    elif mask_mode == "fill":  # masked_fill(-1e9) then a plain softmax: a wrong axis then sees the filled entries
        probs = softmax(scores if keep is None else np.where(keep, scores, -1e9), None, axis)
    else:  # "ignored", "after", "after_renorm"; "added": the 0/1 keep mask added to the scores, softmax(S + m)
        probs = softmax(scores + keep if mask_mode == "added" and keep is not None else scores, None, axis)
        if mask_mode in ("after", "after_renorm") and keep is not None:
            probs = probs * keep
            if mask_mode == "after_renorm":
                total = probs.sum(axis=-1, keepdims=True)
                probs = probs / np.where(total == 0.0, 1.0, total)
    probs = probs[..., :-1] if joined else probs
    if softcap is not None and cap_mode == "probabilities":
        probs = softcap * np.tanh(probs / softcap)
    return probs @ v  # (B, H, T_q, Dh)


def split(x: np.ndarray, H: int, transpose: bool = True) -> np.ndarray:
    """(B, T, D) -> (B, H, T, Dh): the reference transposes; without it, a plain reshape mixes positions."""
    B, T, D = x.shape
    return x.reshape(B, T, H, D // H).transpose(0, 2, 1, 3) if transpose else x.reshape(B, H, T, D // H)


def merge(x: np.ndarray, transpose: bool = True) -> np.ndarray:
    """(B, H, T, Dh) -> (B, T, D), the inverse of split with the same `transpose`."""
    B, H, T, Dh = x.shape
    return (x.transpose(0, 2, 1, 3) if transpose else x).reshape(B, T, H * Dh)


def linear(x, params, name):
    return x @ params[f"{name}.weight"].T + params.get(f"{name}.bias", 0.0)


def rotate(x: np.ndarray, theta: float, pairing="half", shift=0, rotary: int | None = None, scaling=None) -> np.ndarray:
    """RoPE on the first `rotary` features (None: all Dh; fewer: GPT-NeoX's partial rotary, the rest passed) of each
    head of x (B, H, T, Dh) at positions shift .. shift + T - 1. pairing "half" (the reference, Hugging Face's
    rotate_half: feature i with i + R/2) or "interleaved" (Meta's: feature 2i with 2i + 1). scaling: a scaled
    RoPE's (RopeScaling, max_len), or None."""
    T, R = x.shape[-2], rotary or x.shape[-1]
    cos, sin = rope_angles(np.arange(shift, shift + T), R, theta, np.float64, *(scaling or ()))  # (T, R/2)
    first, second = (slice(0, R // 2), slice(R // 2, R)) if pairing == "half" else (slice(0, R, 2), slice(1, R, 2))
    x1, x2 = x[..., first], x[..., second]
    out = x.copy()
    out[..., first], out[..., second] = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    return out


def rope_knobs(cfg, rotary: bool = True, layer: int = 0, causal: bool = False) -> dict:
    """multi_head_attention's knobs for a config: its K/V heads, and its RoPE base where layer `layer` rotates (its
    own: Gemma 3's local layers'; none on a NoPE layer, SmolLM3's); the whole model's terms on the scores
    (score_mod's, `rotary` its self-attention, `causal` a decoder's, else cross_score_mod's): the scale, ALiBi,
    the soft cap, T5's buckets (their table in the params: multi_head_attention); windows come in the masks
    (probes.keep_mask), sinks in the params."""
    turns = rotary and cfg.positional == "rope" and cfg.layer_uses_rope(layer)
    mod = score_mod(cfg, causal, layer) if rotary else cross_score_mod(cfg)
    return {
        "n_kv": cfg.n_kv_heads,
        "theta": cfg.layer_rope_theta(layer) if turns else None,
        "rotary": cfg.rotary_dim,  # the features of each head RoPE turns (None: all)
        "scaling": (cfg.layer_rope_scaling(layer), cfg.max_len) if turns and cfg.layer_rope_scaling(layer) else None,
        "qk_eps": cfg.layer_norm_eps,  # Qwen3's per-head q/k norms, where params hold q_norm.weight
        "softcap": mod.softcap,  # Gemma 2's cap on the scores, or None
        "divisor": None if mod.scale is None else 1.0 / mod.scale,  # 1 / the scale (None: sqrt(Dh))
        # ALiBi's slopes and form, or None: the key index only uncapped (a row's constant does not pass through tanh)
        "alibi": mod.alibi_slopes and (mod.alibi_slopes, causal and mod.softcap is None),
        "relative": mod.relative,  # T5's (n_buckets, max_distance, bidirectional), or None
    }


def multi_head_attention(
    params, query, key, value, H, keep, transpose=True, n_kv=None, theta=None, pairs=("half", "half"),
    rope_v=False, k_shift=0, tile=False, qk_eps=1e-6, rotary=None, scaling=None, order=None, norms=None, **knobs,
):  # fmt: skip
    """MultiHead(Q, K, V) with attention_heads' knobs; params keyed q_proj.weight, ...; query (B, T_q, D), key and
    value (B, T_k, D) -> (B, T_q, D). n_kv: K/V heads, head h reading K/V head h // n_rep (`tile`: h % n_kv, as
    .repeat). transpose: False for a split and a merge without the transpose, "split" or "merge" for that one only.
    theta: RoPE's base (None: none; `scaling` as rotate's), the queries' and keys' `pairs`, the keys' positions
    shifted by `k_shift`, the values rotated too with `rope_v` (True: in the keys' pairing; else that pairing).
    order: where the map reads the q and k rows of each head in another order (the user's = the reference's[order],
    mapping.pair_order), "interleaved" in `pairs` turns q or k in the user's halves: the pairing the map did not read.
    q_norm.weight and k_norm.weight RMS-normalise (eps `qk_eps`) each head's queries and keys first (Qwen3), or each
    projection's output where as wide (OLMo 2); `norms` (role "q" or "k" -> a function) puts another in one's place.
    `relative` (rope_knobs') with params holding relative_bias.weight: T5's bias of those buckets on the scores.
    params holding kv_b_proj.weight: DeepSeek's latent attention (latent_heads, with the same RoPE knobs)."""
    relative, table = knobs.pop("relative", None), params.get("relative_bias.weight")
    if relative and table is not None:  # the table (n_buckets, H) read at each query and key's bucket: (H, T_q, T_k)
        buckets = relative_buckets(relative, np.arange(query.shape[1]), np.arange(key.shape[1]))
        knobs["bias"] = np.moveaxis(table[buckets], -1, 0)
    if "kv_b_proj.weight" in params:
        q, k, v = latent_heads(params, query, key, H, theta, rotary, scaling, pairs, k_shift)
        return linear(merge(attention_heads(q, k, v, keep, **knobs)), params, "out_proj")
    n_kv = H if n_kv is None else n_kv
    transpose, transpose_back = {"split": (False, True), "merge": (True, False)}.get(transpose, (transpose,) * 2)
    q, k = linear(query, params, "q_proj"), linear(key, params, "k_proj")
    whole = "q_norm.weight" in params and params["q_norm.weight"].shape[-1] == q.shape[-1]  # OLMo 2's: all heads
    norms = {r: lambda x, r=r: rms_norm(x, params[f"{r}_norm.weight"], qk_eps) for r in "qk"} | (norms or {})
    if whole:
        q, k = norms["q"](q), norms["k"](k)
    q, k = split(q, H, transpose), split(k, n_kv, transpose)
    v = split(linear(value, params, "v_proj"), n_kv, transpose)
    if "q_norm.weight" in params and not whole:
        q, k = norms["q"](q), norms["k"](k)
    if theta is not None:
        q, k = (
            rotate(x[..., order], theta, "half", shift, rotary, scaling)[..., np.argsort(order)]
            if order is not None and pairing == "interleaved"
            else rotate(x, theta, pairing, shift, rotary, scaling)
            for x, pairing, shift in ((q, pairs[0], 0), (k, pairs[1], k_shift))
        )
        v = rotate(v, theta, rope_v if isinstance(rope_v, str) else pairs[1], 0, rotary, scaling) if rope_v else v
    if n_kv != H:
        k, v = (np.tile(t, (1, H // n_kv, 1, 1)) if tile else np.repeat(t, H // n_kv, axis=1) for t in (k, v))
    knobs = {"sinks": params.get("sinks")} | knobs  # GPT-OSS's sink logits, where the attention has them
    return linear(merge(attention_heads(q, k, v, keep, **knobs), transpose_back), params, "out_proj")


def latent_heads(params, query, key, H, theta, R, scaling=None, pairs=("half", "half"), k_shift=0):
    """Multi-head latent attention's heads (numpy_transformer/latent_attention.py): q (B, H, T_q, Dn + R) from
    q_proj; from kv_a_proj the latent (RMS-normalised, kv_a_norm) and the rotary key part shared by the heads;
    kv_b_proj's latent to each head's keys (Dn) and values; the last R features of q and k turned (their frequencies
    scaled by `scaling`, rotate's) in the reference's pairs (2i, 2i + 1), where `pairs` (multi_head_attention's)
    names the reference's pairing ("half"), else in halves; the keys at positions shifted by `k_shift`."""
    (B, T, _), C = key.shape, params["kv_a_norm.weight"].shape[0]
    low_rank = "q_a_proj.weight" in params  # V3's queries: q_a_proj, q_a_norm, q_b_proj
    x = rms_norm(linear(query, params, "q_a_proj"), params["q_a_norm.weight"], LATENT_NORM_EPS) if low_rank else query
    q, latent = split(linear(x, params, "q_b_proj" if low_rank else "q_proj"), H), linear(key, params, "kv_a_proj")
    kv = split(linear(rms_norm(latent[..., :C], params["kv_a_norm.weight"], LATENT_NORM_EPS), params, "kv_b_proj"), H)
    Dn, (q_pairing, k_pairing) = q.shape[-1] - R, ("interleaved" if p == "half" else "half" for p in pairs)
    q[..., Dn:] = rotate(q[..., Dn:], theta, q_pairing, scaling=scaling)
    k_pe = rotate(latent[:, None, :, C:], theta, k_pairing, k_shift, scaling=scaling)
    return q, np.concatenate([kv[..., :Dn], np.broadcast_to(k_pe, (B, H, T, R))], axis=-1), kv[..., Dn:]


def layer_norm(x, weight, bias, eps, unbiased=False, eps_outside=False, axis=-1):
    """y = (x - mean) / sqrt(var + eps) * weight + bias; unbiased divides the variance by n - 1, eps_outside
    computes (x - mean) / (sqrt(var) + eps), `axis` the axes of the statistics (the features, -1, in the reference)."""
    n = x.size // np.mean(x, axis=axis, keepdims=True).size  # the count of the entries each statistic reads
    centred = x - x.mean(axis=axis, keepdims=True)
    var = (centred**2).sum(axis=axis, keepdims=True) / (n - 1 if unbiased else n)
    denominator = np.sqrt(var) + eps if eps_outside else np.sqrt(var + eps)
    return centred / denominator * weight + bias


def rms_norm(x, weight, eps, eps_outside=False, axis=-1):
    """y = x / sqrt(mean(x^2) + eps) * weight; eps_outside computes x / (sqrt(mean(x^2)) + eps), `axis` the
    axis (or axes) the mean runs over (the features, -1, in the reference)."""
    square = (x**2).mean(axis=axis, keepdims=True)
    return x / (np.sqrt(square) + eps if eps_outside else np.sqrt(square + eps)) * weight


def gated_feed_forward(params, x, activation="silu", on_up=False):
    """down(act(gate(x)) * up(x)) (the reference's gated block, linear1 the up projection); on_up puts the
    activation on the up projection instead: down(gate(x) * act(up(x))). With params' "limit" L and "alpha" (GPT-OSS's
    expert) the clamped SwiGLU down((clip(up, -L, L) + 1) * a sigmoid(alpha a)), a = min(gate, L)."""
    g, u = linear(x, params, "gate"), linear(x, params, "linear1")
    g, u = (u, g) if on_up else (g, u)
    if "limit" not in params:
        return linear(ACTIVATIONS[activation][0](g)[0] * u, params, "linear2")
    L, a = params["limit"], np.minimum(g, params["limit"])
    return linear((np.clip(u, -L, L) + 1) * a / (1 + np.exp(-params["alpha"] * a)), params, "linear2")


def sinusoid_tables(max_len: int, d_model: int, layout: str = "interleaved") -> dict:
    """The fixed tables a user's module may hold: the reference's two layouts, and the one with every frequency 1
    (`2 * i // d_model` is 0 for every i < d_model / 2, so 10000 ** 0 = 1) in `layout`: PE[pos, 2i] = sin(pos), cos
    at 2i+1, or (split) the sines first."""
    tables = {order: sinusoidal_table(max_len, d_model, np.float64, order) for order in ("interleaved", "split")}
    pos = np.arange(max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    ones = np.where(np.arange(d_model) % 2 == 0, np.sin(pos), np.cos(pos))
    ones = np.concatenate([ones[:, 0::2], ones[:, 1::2]], axis=1) if layout == "split" else ones
    return tables | {"wrong_frequencies": ones}
