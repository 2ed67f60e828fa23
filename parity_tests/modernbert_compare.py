"""ModernBERT (ModernBertModel) against our EncoderModel: tiny random checkpoints written by transformers itself,
and the float64 patch that replaces transformers' float32 islands, for test_hf_modernbert.py and the parity report.

transformers' ModernBERT computes three pieces in float32 whatever the model's dtype: the rotary cos / sin (an
inverse-frequency table made in float32, positions cast with .float()), the rotation itself (apply_rotary_pos_emb
casts q and k to float32) and the eager attention's softmax. A float64 model is then only float32-accurate (~4e-7
against ours). `modernbert_in_float64()` swaps exactly those three functions for float64 versions of the same math;
the comparisons run the eager attention (attn_implementation="eager"), never the unpadding / flash paths.
"""

from __future__ import annotations

import contextlib
import tempfile

import numpy as np
import torch
import transformers
from transformers.models.modernbert import modeling_modernbert as mb

import torch_transformer.hf as torch_hf
from numpy_transformer import hf as numpy_hf
from parity_tests.components import TORCH_DTYPE, Result, to_numpy
from parity_tests.hf_compare import eager_attention_forward_float64, rotary_forward_float64  # as Llama's, Gemma 3's

STD = 0.3  # weights ~ N(0, 0.3^2), as hf_compare's tiny models
# Tiny, but every feature present: 3 layers (layer 0 without an attention norm, global; layers 1 and 2 local), head
# size 8 (four rotary frequencies), rotary bases other than the defaults, a local window of 4 (keys |i - j| <= 2)
# shorter than the inputs (9 tokens). Ids 0, 1, 2 are pad, cls (bos), sep (eos).
TINY = dict(
    vocab_size=40,
    hidden_size=32,
    intermediate_size=24,
    num_hidden_layers=3,
    num_attention_heads=4,
    max_position_embeddings=32,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    cls_token_id=1,
    sep_token_id=2,
    global_attn_every_n_layers=3,
    local_attention=4,
    global_rope_theta=500.0,
    local_rope_theta=50.0,
)


def build_tiny(directory, seed: int = 0, **overrides) -> transformers.ModernBertModel:
    """A tiny random ModernBertModel (TINY with `overrides`), written to `directory` with save_pretrained in float32,
    eager attention, in evaluation mode. Every parameter redrawn from one seeded generator: matrices N(0, STD^2),
    biases N(0, 0.2^2), norm weights 1 + N(0, 0.2^2) (transformers' init would leave them at 0 and 1, where a
    misplaced one goes unnoticed)."""
    torch.manual_seed(seed)
    config = transformers.ModernBertConfig(**{**TINY, **overrides})
    model = transformers.ModernBertModel._from_config(config, attn_implementation="eager").float().eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            if name.endswith("weight") and p.ndim == 1:
                p.copy_(1 + 0.2 * noise)
            elif p.ndim == 1:
                p.copy_(0.2 * noise)
            else:
                p.copy_(STD * noise)
    model.save_pretrained(directory)
    return model


def make_inputs(seed: int = 0, batch: int = 2, length: int = 9):
    """ids (B, T) avoiding 0, 1, 2, the last row's last two tokens padding, and attention_mask = ids != pad. Every
    query keeps a real key within the local band (|i - j| <= 2): a padded query whose band holds only padding would
    have every key masked, a row transformers fills with the mean of every value (its additive mask shifts all the
    scores alike) and no real token reads."""
    rng = np.random.default_rng(seed + 7)
    ids = rng.integers(3, TINY["vocab_size"], size=(batch, length))
    ids[-1, length - 2 :] = TINY["pad_token_id"]
    return ids, ids != TINY["pad_token_id"]


# ----------------------------------------------------------------------------------------------
# The float64 patch: the same math as modeling_modernbert's, without the casts to float32.


def apply_rotary_pos_emb_float64(q, k, cos, sin, unsqueeze_dim=1):
    """modeling_modernbert.apply_rotary_pos_emb in the inputs' dtype (the original rotates in float32)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + mb.rotate_half(q) * sin, k * cos + mb.rotate_half(k) * sin


@contextlib.contextmanager
def modernbert_in_float64():
    """Within the block, transformers' ModernBERT computes the rotary tables, the rotation and the eager softmax in
    the model's dtype (float64 in the comparisons)."""
    saved = mb.ModernBertRotaryEmbedding.forward, mb.apply_rotary_pos_emb, mb.eager_attention_forward
    mb.ModernBertRotaryEmbedding.forward = rotary_forward_float64
    mb.apply_rotary_pos_emb = apply_rotary_pos_emb_float64
    mb.eager_attention_forward = eager_attention_forward_float64
    try:
        yield
    finally:
        mb.ModernBertRotaryEmbedding.forward, mb.apply_rotary_pos_emb, mb.eager_attention_forward = saved


# ----------------------------------------------------------------------------------------------
# One comparison: outputs and every parameter gradient, under transformers' names.


def run_transformers(model, ids, mask, upstream) -> tuple[np.ndarray, dict]:
    """Last hidden states (B, T, D) and d(sum(out * upstream))/d(param) for every parameter."""
    model.eval().zero_grad(set_to_none=True)
    out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long()).last_hidden_state
    (out * torch.from_numpy(upstream)).sum().backward()
    grads = {n: to_numpy(p.grad) if p.grad is not None else np.zeros(p.shape) for n, p in model.named_parameters()}
    return to_numpy(out), grads


def run_ours(model, side: str, ids, mask, upstream) -> tuple[np.ndarray, dict]:
    """The same for our model of either side, gradients translated with hf.to_hf."""
    if side == "numpy":
        model.eval().zero_grad()
        out = model.forward(ids, attention_mask=mask)
        model.backward(upstream)
        return out, numpy_hf.to_hf(model, model.grads, tied=False)
    model.eval().zero_grad(set_to_none=True)
    out = model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    (out * torch.from_numpy(upstream)).sum().backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    return to_numpy(out), {k: to_numpy(v) for k, v in torch_hf.to_hf(model, grads, tied=False).items()}


def load_ours(side: str, directory, dtype):
    if side == "numpy":
        return numpy_hf.load(directory, dtype=dtype)
    return torch_hf.load(directory, dtype=TORCH_DTYPE[np.dtype(dtype)])


def compare_modernbert(dtype=np.float64, side: str = "numpy", seed: int = 0, patch: bool = True, **overrides) -> Result:
    """Our EncoderModel (NumPy or torch side) against ModernBertModel of a tiny random checkpoint, both holding the
    checkpoint's float32 values widened to `dtype`; objective sum(hidden * R), R random. patch: the float64 patch
    (module docstring) when dtype is float64."""
    dtype = np.dtype(dtype)
    with tempfile.TemporaryDirectory() as directory:
        theirs = build_tiny(directory, seed, **overrides).to(dtype=TORCH_DTYPE[dtype])
        ours = load_ours(side, directory, dtype)
    ids, mask = make_inputs(seed)
    upstream = np.random.default_rng(seed + 1000).standard_normal((*ids.shape, TINY["hidden_size"])).astype(dtype)
    use_patch = patch and dtype == np.float64
    with modernbert_in_float64() if use_patch else contextlib.nullcontext():
        theirs_out, theirs_grads = run_transformers(theirs, ids, mask, upstream)
    ours_out, ours_grads = run_ours(ours, side, ids, mask, upstream)
    if set(ours_grads) != set(theirs_grads):
        raise AssertionError(
            f"gradient names differ: only ours {sorted(set(ours_grads) - set(theirs_grads))}, "
            f"only transformers' {sorted(set(theirs_grads) - set(ours_grads))}"
        )
    result = Result(outputs={"hidden": (ours_out, theirs_out)})
    for name, grad in theirs_grads.items():
        result.grads[name] = (ours_grads[name], grad)
    return result


# ----------------------------------------------------------------------------------------------
# ModernBertForMaskedLM: the logits through its head, and every gradient (the tied table's sums both uses).


def build_tiny_mlm(directory, seed: int = 0, **overrides) -> transformers.ModernBertForMaskedLM:
    """A tiny random ModernBertForMaskedLM (TINY with `overrides`), redrawn as build_tiny's, written to `directory`."""
    torch.manual_seed(seed)
    config = transformers.ModernBertConfig(**{**TINY, **overrides})
    model = transformers.ModernBertForMaskedLM._from_config(config, attn_implementation="eager").float().eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # the tied decoder.weight is listed once, as tok_embeddings
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            if name.endswith("weight") and p.ndim == 1:
                p.copy_(1 + 0.2 * noise)
            elif p.ndim == 1:
                p.copy_(0.2 * noise)
            else:
                p.copy_(STD * noise)
    model.save_pretrained(directory)
    return model


def run_ours_mlm(model, side: str, ids, mask, upstream) -> tuple[np.ndarray, dict]:
    """Logits (B, T, V) of our model's masked-LM head and every gradient, translated with hf.to_hf."""
    if side == "numpy":
        model.eval().zero_grad()
        logits = model.mlm_logits(model.forward(ids, attention_mask=mask))
        model.backward(model.mlm_logits_backward(upstream))
        return logits, numpy_hf.to_hf(model, model.grads, tied=False)
    model.eval().zero_grad(set_to_none=True)
    logits = model.mlm_logits(model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)))
    (logits * torch.from_numpy(upstream)).sum().backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    return to_numpy(logits), {k: to_numpy(v) for k, v in torch_hf.to_hf(model, grads, tied=False).items()}


def compare_modernbert_mlm(dtype=np.float64, side: str = "numpy", seed: int = 0, **overrides) -> Result:
    """Our EncoderModel with its masked-LM head against ModernBertForMaskedLM: logits and every gradient, the
    objective sum(logits * R); float64 with the patch."""
    dtype = np.dtype(dtype)
    with tempfile.TemporaryDirectory() as directory:
        theirs = build_tiny_mlm(directory, seed, **overrides).to(dtype=TORCH_DTYPE[dtype])
        ours = load_ours(side, directory, dtype)
    ids, mask = make_inputs(seed)
    upstream = np.random.default_rng(seed + 1000).standard_normal((*ids.shape, TINY["vocab_size"])).astype(dtype)
    with modernbert_in_float64() if dtype == np.float64 else contextlib.nullcontext():
        theirs.zero_grad(set_to_none=True)
        logits = theirs(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long()).logits
        (logits * torch.from_numpy(upstream)).sum().backward()
    theirs_grads = {n: to_numpy(p.grad) for n, p in theirs.named_parameters()}
    ours_out, ours_grads = run_ours_mlm(ours, side, ids, mask, upstream)
    if set(ours_grads) != set(theirs_grads):
        raise AssertionError(
            f"gradient names differ: only ours {sorted(set(ours_grads) - set(theirs_grads))}, "
            f"only transformers' {sorted(set(theirs_grads) - set(ours_grads))}"
        )
    result = Result(outputs={"logits": (ours_out, to_numpy(logits))})
    for name, grad in theirs_grads.items():
        result.grads[name] = (ours_grads[name], grad)
    return result
