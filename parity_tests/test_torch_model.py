"""Tests of `torch_transformer` on its own: the state-dict contract of docs/conventions.md, the two attention
paths, masks, dropout keep-masks, device hygiene and the error messages.

Gradients are taken with random upstream gradients (never `.sum()`, which would make the softmax and
layer-norm input gradients vanish) and are asserted to be non-zero.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import torch_transformer as tt
from parity_tests import components as C
from torch_transformer import TransformerConfig

one_torch_thread = pytest.fixture(autouse=True)(C.one_torch_thread)

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available here")),
]

PAD = 0


def make_config(**overrides) -> TransformerConfig:
    """A small model with every size distinct, so that a transposed weight cannot pass."""
    values = dict(
        src_vocab_size=11,
        tgt_vocab_size=13,
        d_model=12,
        n_heads=3,
        d_ff=20,
        n_encoder_layers=2,
        n_decoder_layers=2,
        max_len=16,
        pad_id=PAD,
    )
    values.update(overrides)
    return TransformerConfig(**values)


def make_model(config: TransformerConfig, lm: bool = False, dtype=torch.float64, device="cpu"):
    torch.manual_seed(0)
    model = tt.TransformerLM(config) if lm else tt.Transformer(config)
    return model.to(device=device, dtype=dtype)


def random_ids(batch: int, length: int, vocab: int, device="cpu", seed: int = 1) -> torch.Tensor:
    """Token ids in [3, vocab): no pad, bos or eos unless a test puts them there."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=generator).to(device)


def example_inputs(config: TransformerConfig, device="cpu"):
    """src (2, 7) and tgt (2, 5) with some padding at the ends, as a real batch has."""
    src = random_ids(2, 7, config.src_vocab_size, device, seed=1)
    tgt = random_ids(2, 5, config.tgt_vocab_size, device, seed=2)
    src[1, 5:] = PAD
    tgt[1, 3:] = PAD
    return src, tgt


def run(model, inputs, **kwargs):
    return model(*inputs, **kwargs)


def forward_backward(model, inputs, seed: int = 3, **kwargs):
    """Logits and every parameter gradient, from a random upstream gradient."""
    model.zero_grad(set_to_none=True)
    logits = run(model, inputs, **kwargs)
    generator = torch.Generator().manual_seed(seed)
    upstream = torch.randn(logits.shape, generator=generator, dtype=logits.dtype).to(logits.device)
    logits.backward(upstream)
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    return logits.detach(), grads


def relative_error(a: torch.Tensor, b: torch.Tensor, scale: float, floor: float = 1e-3) -> float:
    """The error of docs/conventions.md: max|a - b| / max(max|b|, floor * scale)."""
    return ((a - b).abs().max() / max(b.abs().max().item(), floor * scale)).item()


def assert_close_all(got: dict, want: dict, bar: float) -> None:
    scale = max(t.abs().max().item() for t in want.values())
    errors = {name: relative_error(got[name], want[name], scale) for name in want}
    worst = max(errors, key=errors.get)
    assert errors[worst] <= bar, f"{worst}: error {errors[worst]:.3g} > {bar}"


def assert_gradients_useful(grads: dict) -> None:
    for name, grad in grads.items():
        assert torch.isfinite(grad).all(), f"{name}: non-finite gradient"
    assert any(grad.abs().max() > 0 for grad in grads.values()), "all gradients are zero"


# --- The state-dict contract, written out from docs/conventions.md independently of the modules ----------------


def expected_state_dict_shapes(c: TransformerConfig, lm: bool) -> dict[str, tuple[int, ...]]:
    """In the order of the state dict. After the paper: RMSNorm has no bias; `bias=False` drops the
    attention and feed-forward biases; a gated feed-forward adds ffn.gate.* before linear1; k_proj and
    v_proj are n_kv_heads * Dh wide; rotary positions store no table; `output_bias=False` drops
    output_proj.bias."""
    shapes = ExpectedStateDict(c)
    if not lm:
        shapes.stack("encoder", c.src_vocab_size, c.n_encoder_layers, cross=False)
    shapes.stack("decoder", c.tgt_vocab_size, c.n_decoder_layers, cross=not lm)
    if not c.tie_embeddings:
        shapes.shapes["output_proj.weight"] = (c.tgt_vocab_size, c.d_model)
    if c.output_bias:
        shapes.shapes["output_proj.bias"] = (c.tgt_vocab_size,)
    return shapes.shapes


class ExpectedStateDict:
    """The expected state dict being written, name -> shape, one method per kind of module."""

    def __init__(self, c: TransformerConfig) -> None:
        self.c = c
        self.shapes: dict[str, tuple[int, ...]] = {}

    def linear(self, prefix: str, out_features: int, in_features: int) -> None:
        self.shapes[f"{prefix}.weight"] = (out_features, in_features)
        if self.c.bias:
            self.shapes[f"{prefix}.bias"] = (out_features,)

    def attention(self, prefix: str) -> None:
        c, d = self.c, self.c.d_model
        kv = (c.n_heads if c.n_kv_heads is None else c.n_kv_heads) * (d // c.n_heads)
        for proj, width in (("q_proj", d), ("k_proj", kv), ("v_proj", kv), ("out_proj", d)):
            self.linear(f"{prefix}.{proj}", width, d)

    def norm(self, prefix: str) -> None:
        self.shapes[f"{prefix}.weight"] = (self.c.d_model,)
        if self.c.norm == "layer":
            self.shapes[f"{prefix}.bias"] = (self.c.d_model,)

    def layer(self, layer: str, cross: bool) -> None:
        d, f = self.c.d_model, self.c.d_ff
        self.attention(f"{layer}.self_attn")
        self.norm(f"{layer}.self_attn_norm")
        if cross:
            self.attention(f"{layer}.cross_attn")
            self.norm(f"{layer}.cross_attn_norm")
        if self.c.gated_ffn:
            self.linear(f"{layer}.ffn.gate", f, d)
        self.linear(f"{layer}.ffn.linear1", f, d)
        self.linear(f"{layer}.ffn.linear2", d, f)
        self.norm(f"{layer}.ffn_norm")

    def stack(self, name: str, vocab: int, n_layers: int, cross: bool) -> None:
        self.shapes[f"{name}.token_embedding.weight"] = (vocab, self.c.d_model)
        if self.c.positional == "learned":
            self.shapes[f"{name}.position_embedding.weight"] = (self.c.max_len, self.c.d_model)
        for i in range(n_layers):
            self.layer(f"{name}.layers.{i}", cross)
        if self.c.norm_first:
            self.norm(f"{name}.final_norm")


@pytest.mark.parametrize("lm", [False, True], ids=["Transformer", "TransformerLM"])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
@pytest.mark.parametrize("tie_embeddings", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_state_dict_keys_and_shapes(lm, positional, tie_embeddings, norm_first):
    config = make_config(positional=positional, tie_embeddings=tie_embeddings, norm_first=norm_first)
    model = make_model(config, lm=lm)
    got = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    assert got == expected_state_dict_shapes(config, lm)
    assert list(got) == list(expected_state_dict_shapes(config, lm))  # the same order too
    # The sinusoidal table is computed, not stored: no buffers at all.
    assert list(model.buffers()) == []


# d_model 12: 3 heads of 6 (MQA: 1 K/V head), or 6 heads of 2 (GQA: 2 or 3 K/V heads)
MODERN_CONFIGS = {
    "llama: pre-norm rms rope silu gated GQA 6/3, no biases, no output bias": dict(
        norm_first=True,
        norm="rms",
        positional="rope",
        activation="silu",
        gated_ffn=True,
        n_heads=6,
        n_kv_heads=3,
        bias=False,
        output_bias=False,
    ),
    "post-norm rms MQA learned tied": dict(norm="rms", n_kv_heads=1, positional="learned", tie_embeddings=True),
    "gated with biases, GQA 6/2, rope, layer norm": dict(gated_ffn=True, n_heads=6, n_kv_heads=2, positional="rope"),
    "no linear biases, output bias kept, pre-norm": dict(bias=False, norm_first=True),
}


@pytest.mark.parametrize("lm", [False, True], ids=["Transformer", "TransformerLM"])
@pytest.mark.parametrize("overrides", list(MODERN_CONFIGS.values()), ids=list(MODERN_CONFIGS))
def test_state_dict_keys_and_shapes_after_the_paper(overrides, lm):
    config = make_config(**overrides)
    model = make_model(config, lm=lm)
    got = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    expected = expected_state_dict_shapes(config, lm)
    assert got == expected
    assert list(got) == list(expected)
    assert list(model.buffers()) == []  # rotary tables are computed per forward, not stored


@pytest.mark.parametrize("lm", [False, True], ids=["Transformer", "TransformerLM"])
def test_state_dict_round_trip(lm):
    config = make_config(positional="learned")
    source, target = make_model(config, lm=lm), make_model(config, lm=lm)
    torch.manual_seed(5)
    for p in source.parameters():
        torch.nn.init.normal_(p)
    target.load_state_dict(source.state_dict())
    inputs = example_inputs(config)[1:] if lm else example_inputs(config)
    torch.testing.assert_close(run(target.eval(), inputs), run(source.eval(), inputs), rtol=0, atol=0)


def test_initialisation():
    config = make_config(positional="learned", d_model=48, n_heads=4, src_vocab_size=400)
    model = make_model(config, dtype=torch.float32)
    params = dict(model.named_parameters())
    bound = math.sqrt(6 / (48 + 48))  # Xavier-uniform for a (D, D) projection
    q = params["encoder.layers.0.self_attn.q_proj.weight"]
    assert q.abs().max() <= bound and q.abs().max() > 0.9 * bound
    assert (params["encoder.layers.0.self_attn.q_proj.bias"] == 0).all()
    assert (params["encoder.layers.0.ffn_norm.weight"] == 1).all()
    assert (params["encoder.layers.0.ffn_norm.bias"] == 0).all()
    assert params["encoder.token_embedding.weight"].std().item() == pytest.approx(48**-0.5, rel=0.1)
    assert params["encoder.position_embedding.weight"].std().item() == pytest.approx(0.02, rel=0.1)


# --- Shapes, dtypes, embeddings --------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("lm", [False, True], ids=["Transformer", "TransformerLM"])
def test_logits_shape_and_dtype(device, dtype, lm):
    config = make_config()
    model = make_model(config, lm=lm, dtype=dtype, device=device)
    src, tgt = example_inputs(config, device)
    logits = model(tgt) if lm else model(src, tgt)
    assert logits.shape == (2, 5, config.tgt_vocab_size)
    assert logits.dtype == dtype
    assert logits.device.type == device
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("d_model", [8, 7])
def test_sinusoidal_table_follows_the_paper(d_model):
    table = tt.sinusoidal_table(10, d_model, dtype=torch.float64)
    assert table.shape == (10, d_model)
    for pos in range(10):
        for col in range(d_model):
            i2 = col - col % 2  # the "2i" shared by a sine column and the cosine column after it
            angle = pos / 10000 ** (i2 / d_model)
            want = math.sin(angle) if col % 2 == 0 else math.cos(angle)
            assert table[pos, col].item() == pytest.approx(want, abs=1e-15)
    assert tt.sinusoidal_table(10, d_model, dtype=torch.float32).dtype == torch.float32


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
@pytest.mark.parametrize("scale_embeddings", [True, False])
def test_embedding_is_scaled_tokens_plus_positions(positional, scale_embeddings):
    # With no layers and post-norm, the encoder's output is its embedding.
    config = make_config(n_encoder_layers=0, positional=positional, scale_embeddings=scale_embeddings)
    model = make_model(config)
    src, _ = example_inputs(config)
    encoder = model.encoder
    tokens = encoder.token_embedding.weight[src] * (math.sqrt(12) if scale_embeddings else 1.0)
    if positional == "learned":
        positions = encoder.position_embedding.weight[:7]
    else:
        positions = tt.sinusoidal_table(7, 12, dtype=torch.float64)
    torch.testing.assert_close(encoder(src), tokens + positions, rtol=0, atol=1e-15)


def test_tied_model_equals_untied_model_with_copied_weight():
    tied = make_model(make_config(tie_embeddings=True))
    untied = make_model(make_config(tie_embeddings=False))
    state = tied.state_dict()
    state["output_proj.weight"] = state["decoder.token_embedding.weight"].clone()
    untied.load_state_dict(state)
    inputs = example_inputs(tied.config)
    torch.testing.assert_close(run(untied.eval(), inputs), run(tied.eval(), inputs), rtol=0, atol=1e-14)


# --- Attention: the fused and the explicit path, and a hand-written reference ---------------------


def reference_attention(mha, query, key, value, mask):
    """Multi-head attention spelled out with einsum, fully masked rows set to zero by hand."""
    H, Dh = mha.n_heads, mha.head_dim
    B, T_q, D = query.shape

    def heads(x, proj):
        return proj(x).reshape(B, -1, H, Dh).permute(0, 2, 1, 3)

    q, k, v = heads(query, mha.q_proj), heads(key, mha.k_proj), heads(value, mha.v_proj)
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(Dh)
    mask = mask.expand_as(scores)
    scores = torch.where(mask, scores, torch.full_like(scores, -1e300))
    probs = torch.softmax(scores, dim=-1) * mask.any(-1, keepdim=True)
    context = torch.einsum("bhqk,bhkd->bhqd", probs, v).permute(0, 2, 1, 3).reshape(B, T_q, D)
    return mha.out_proj(context), probs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
def test_multi_head_attention_matches_reference(device, need_weights):
    torch.manual_seed(0)
    mha = tt.MultiHeadAttention(12, 3).to(device=device, dtype=torch.float64)
    for p in mha.parameters():  # non-zero biases, so a bias mix-up shows
        torch.nn.init.normal_(p, std=0.3)
    query = torch.randn(2, 4, 12, dtype=torch.float64, device=device, requires_grad=True)
    memory = torch.randn(2, 6, 12, dtype=torch.float64, device=device, requires_grad=True)
    mask = torch.ones(2, 1, 4, 6, dtype=torch.bool, device=device)
    mask[0, :, :, 4:] = False  # padding
    mask[1, :, 2, :] = False  # a fully masked query row

    out, probs = mha(query, memory, memory, mask, need_weights=need_weights)
    want, want_probs = reference_attention(mha, query, memory, memory, mask)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    if need_weights:
        torch.testing.assert_close(probs, want_probs, rtol=0, atol=1e-13)
        assert (probs[1, :, 2] == 0).all()
    else:
        assert probs is None
    # The fully masked row's output is the output projection's bias alone.
    torch.testing.assert_close(out[1, 2], mha.out_proj.bias, rtol=0, atol=1e-14)

    upstream = torch.randn_like(out)
    grads = torch.autograd.grad(out, (query, memory), upstream)
    want_grads = torch.autograd.grad(want, (query, memory), upstream)
    for got_grad, want_grad in zip(grads, want_grads, strict=True):
        assert got_grad.abs().max() > 0
        torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=1e-12)
    assert (grads[0][1, 2] == 0).all(), "a fully masked query row must get zero gradient"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lm", [False, True], ids=["Transformer", "TransformerLM"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_fast_path_matches_explicit_path(device, lm, norm_first):
    config = make_config(norm_first=norm_first, activation="gelu", dropout=0.1)
    model = make_model(config, lm=lm, device=device).eval()
    src, tgt = example_inputs(config, device)
    tgt[0, 0] = PAD  # a fully masked row as well
    inputs = (tgt,) if lm else (src, tgt)
    fast_logits, fast_grads = forward_backward(model, inputs, need_weights=False)
    slow_logits, slow_grads = forward_backward(model, inputs, need_weights=True)
    assert relative_error(fast_logits, slow_logits, slow_logits.abs().max().item()) <= 1e-12
    assert_close_all(fast_grads, slow_grads, bar=1e-12)
    assert_gradients_useful(fast_grads)


def test_attention_maps_names_shapes_and_rows():
    config = make_config()
    model = make_model(config).eval()
    with pytest.raises(RuntimeError, match="need_weights=True"):
        model.attention_maps()
    src, tgt = example_inputs(config)
    model(src, tgt, need_weights=True)
    maps = model.attention_maps()
    H = config.n_heads
    assert {name: tuple(p.shape) for name, p in maps.items()} == {
        **{f"encoder.layers.{i}.self_attn": (2, H, 7, 7) for i in range(2)},
        **{f"decoder.layers.{i}.self_attn": (2, H, 5, 5) for i in range(2)},
        **{f"decoder.layers.{i}.cross_attn": (2, H, 5, 7) for i in range(2)},
    }
    for name, probs in maps.items():
        torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs.sum(-1)), msg=name)
    # Causal: nothing above the diagonal; padding: no weight on the padded keys.
    assert (maps["decoder.layers.0.self_attn"].triu(diagonal=1) == 0).all()
    assert (maps["decoder.layers.0.cross_attn"][1, :, :, 5:] == 0).all()
    assert (maps["encoder.layers.1.self_attn"][1, :, :, 5:] == 0).all()


# --- Fully masked rows ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train-dropout"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_fully_masked_rows_are_zero_and_finite(device, need_weights, train, norm_first):
    config = make_config(norm_first=norm_first, dropout=0.2)
    model = make_model(config, device=device).train(train)
    src, tgt = example_inputs(config, device)
    src[1] = PAD  # a source of nothing but padding: every encoder row and cross row of item 1
    tgt[0, 0] = PAD  # the decoder masks only the future: target position 0 of item 0 attends to this pad
    logits, grads = forward_backward(model, (src, tgt), need_weights=need_weights)
    assert torch.isfinite(logits).all()
    assert_gradients_useful(grads)
    if need_weights:
        maps = model.attention_maps()
        for i in range(config.n_encoder_layers):
            assert (maps[f"encoder.layers.{i}.self_attn"][1] == 0).all()
        for i in range(config.n_decoder_layers):
            assert (maps[f"decoder.layers.{i}.cross_attn"][1] == 0).all()
            assert (maps[f"decoder.layers.{i}.self_attn"][0, :, 0, 0] == 1).all()
            assert (maps[f"decoder.layers.{i}.cross_attn"][0].sum(-1) > 0.99).all()


# --- Device hygiene ------------------------------------------------------------------------------


@pytest.mark.parametrize("lm", [False, True], ids=["Transformer", "TransformerLM"])
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train-dropout"])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope"])
def test_no_tensor_is_created_on_the_default_device(lm, need_weights, train, positional):
    """Build on CPU, then make "meta" the default device: any tensor the forward or backward pass
    creates without an explicit device lands on meta and breaks the computation. Rotary positions come
    with the other Llama pieces (RMSNorm, SwiGLU, one K/V head for the three query heads, no biases)."""
    llama = dict(norm="rms", gated_ffn=True, activation="silu", n_kv_heads=1, bias=False, output_bias=False)
    config = make_config(dropout=0.2, positional=positional, **(llama if positional == "rope" else {}))
    model = make_model(config, lm=lm, dtype=torch.float32).train(train)
    src, tgt = example_inputs(config)
    inputs = (tgt,) if lm else (src, tgt)
    previous = torch.get_default_device()
    torch.set_default_device("meta")
    try:
        logits = run(model, inputs, need_weights=need_weights)
        upstream = torch.randn(logits.shape, device="cpu")
        loss = tt.cross_entropy(logits, tgt) + (logits * upstream).mean()
        loss.backward()
    finally:  # None, not "cpu": setting "cpu" would leave a default-device mode active for later tests
        torch.set_default_device(None if previous.type == "cpu" else previous)
    assert logits.device.type == "cpu" and torch.isfinite(logits).all()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.device.type == "cpu", name
    assert_gradients_useful({name: p.grad for name, p in model.named_parameters()})


def test_cpu_autocast_bfloat16_runs():
    config = make_config()
    model = make_model(config, dtype=torch.float32)
    src, tgt = example_inputs(config)
    tgt[0, 0] = PAD
    for need_weights in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(src, tgt, need_weights=need_weights)
        assert torch.isfinite(logits).all()


# --- Dropout keep-masks --------------------------------------------------------------------------


def random_keep_masks(sites: dict, p: float, seed: int = 0, device="cpu") -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {name: (torch.rand(shape, generator=generator) >= p).to(device) for name, shape in sites.items()}


def test_dropout_sites_are_the_dropout_modules():
    """Every dropout module is a site with a keep-mask when its rate is above 0; a site at rate 0 has none."""
    for lm in (False, True):
        for rates, left_out in ((dict(dropout=0.1), ()), (dict(dropout=0.1, activation_dropout=0.0), ("ffn.dropout",))):
            model = make_model(make_config(**rates), lm=lm)
            src, tgt = example_inputs(model.config)
            sites = model.dropout_site_shapes(tgt) if lm else model.dropout_site_shapes(src, tgt)
            modules = {name for name, m in model.named_modules() if isinstance(m, tt.Dropout)}
            assert set(sites) == {name for name in modules if not name.endswith(left_out)}
            assert len(sites) < len(modules) if left_out else True
            assert not any("cross_attn" in name for name in sites) if lm else True
        no_dropout = make_model(make_config(), lm=lm)
        assert not (no_dropout.dropout_site_shapes(tgt) if lm else no_dropout.dropout_site_shapes(src, tgt))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lm", [False, True], ids=["Transformer", "TransformerLM"])
def test_same_keep_masks_give_same_outputs(device, lm):
    config = make_config(dropout=0.3)
    model = make_model(config, lm=lm, device=device).train()
    src, tgt = example_inputs(config, device)
    inputs = (tgt,) if lm else (src, tgt)
    sites = model.dropout_site_shapes(*inputs)
    masks = random_keep_masks(sites, 0.3, seed=0, device=device)
    first, first_grads = forward_backward(model, inputs, dropout_masks=masks)
    second, second_grads = forward_backward(model, inputs, dropout_masks=masks)
    assert torch.equal(first, second)
    assert all(torch.equal(first_grads[name], second_grads[name]) for name in first_grads)
    assert_gradients_useful(first_grads)
    other = run(model, inputs, dropout_masks=random_keep_masks(sites, 0.3, seed=1, device=device))
    assert not torch.allclose(other, first)
    # All-True keep-masks still scale by 1 / (1 - p) at every site, so they differ from eval mode.
    all_kept = {name: torch.ones(shape, dtype=torch.bool, device=device) for name, shape in sites.items()}
    assert not torch.allclose(run(model, inputs, dropout_masks=all_kept), run(model.eval(), inputs))


@pytest.mark.parametrize("lm", [False, True], ids=["Transformer", "TransformerLM"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_every_dropout_site_is_used(lm, norm_first):
    """Dropping units at one site alone, every other site keeping everything, changes the output."""
    config = make_config(dropout=0.5, norm_first=norm_first)
    model = make_model(config, lm=lm).train()
    src, tgt = example_inputs(config)
    inputs = (tgt,) if lm else (src, tgt)
    sites = model.dropout_site_shapes(*inputs)
    all_kept = {name: torch.ones(shape, dtype=torch.bool) for name, shape in sites.items()}
    baseline = run(model, inputs, dropout_masks=all_kept)
    random = random_keep_masks(sites, 0.5)
    for name in sites:
        logits = run(model, inputs, dropout_masks={**all_kept, name: random[name]})
        assert not torch.allclose(logits, baseline, rtol=0, atol=1e-12), f"site {name} has no effect"


@pytest.mark.parametrize("lm", [False, True], ids=["Transformer", "TransformerLM"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_keep_masks_reproduce_torch_dropout(lm, norm_first):
    """On CPU, F.dropout draws `empty_like(x).bernoulli_(1 - p)` and scales by 1 / (1 - p). Drawing
    the keep-masks the same way, in the order of `dropout_site_shapes`, must reproduce the random
    explicit-path forward exactly: every site multiplies by its own mask, at its place, in order."""
    p = 0.25
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(7)
    x = torch.randn(3, 4, dtype=torch.float64)
    torch.manual_seed(8)
    dropped = F.dropout(x, p, training=True)
    torch.manual_seed(8)
    premise = torch.equal(dropped != 0, torch.empty_like(x).bernoulli_(1 - p).bool())
    torch.random.set_rng_state(generator_state)
    if not premise:
        pytest.skip("this torch build's F.dropout draws its units differently on CPU")

    config = make_config(dropout=p, norm_first=norm_first)
    model = make_model(config, lm=lm).train()
    src, tgt = example_inputs(config)
    inputs = (tgt,) if lm else (src, tgt)
    sites = model.dropout_site_shapes(*inputs)
    torch.manual_seed(9)
    random_logits = run(model, inputs, need_weights=True)  # the explicit path: F.dropout at every site
    torch.manual_seed(9)
    masks = {name: torch.empty(shape, dtype=torch.float64).bernoulli_(1 - p).bool() for name, shape in sites.items()}
    masked_logits = run(model, inputs, dropout_masks=masks)
    torch.testing.assert_close(masked_logits, random_logits, rtol=0, atol=1e-12)


def test_keep_masks_are_ignored_in_eval_mode_and_without_dropout():
    config = make_config(dropout=0.3)
    model = make_model(config).eval()
    inputs = example_inputs(config)
    garbage = {"not a site": torch.zeros(1, dtype=torch.bool)}
    assert torch.equal(run(model, inputs, dropout_masks=garbage), run(model, inputs))
    no_dropout = make_model(make_config(dropout=0.0)).train()
    assert torch.equal(run(no_dropout, inputs, dropout_masks=garbage), run(no_dropout.eval(), inputs))


def test_random_dropout_is_active_in_training():
    config = make_config(dropout=0.3)
    model = make_model(config).train()
    inputs = example_inputs(config)
    torch.manual_seed(0)
    first = run(model, inputs)
    second = run(model, inputs)
    assert not torch.allclose(first, second)
    assert torch.equal(run(model.eval(), inputs), run(model, inputs))


def test_dropout_module_and_feed_forward_apply_the_given_mask():
    torch.manual_seed(0)
    dropout = tt.Dropout(0.25).train()
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    keep = torch.rand(2, 3, 4) > 0.25
    torch.testing.assert_close(dropout(x, keep), torch.where(keep, x / 0.75, 0.0), rtol=0, atol=1e-15)
    assert dropout.eval()(x, keep) is x

    ffn = tt.FeedForward(4, 6, "gelu_tanh", dropout=0.25).double().train()
    keep_hidden = torch.rand(2, 3, 6) > 0.25
    hidden = F.gelu(ffn.linear1(x), approximate="tanh") * keep_hidden / 0.75
    torch.testing.assert_close(ffn(x, keep_hidden), ffn.linear2(hidden), rtol=0, atol=1e-14)


@pytest.mark.parametrize(
    "activation, formula",
    [
        ("relu", lambda h: h.clamp(min=0)),
        ("gelu", lambda h: 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))),
        ("gelu_tanh", lambda h: 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))),
    ],
)
def test_feed_forward_activations(activation, formula):
    torch.manual_seed(0)
    ffn = tt.FeedForward(4, 6, activation).double()
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    torch.testing.assert_close(ffn(x), ffn.linear2(formula(ffn.linear1(x))), rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="activation.*'swish'"):
        tt.FeedForward(4, 6, "swish")


def test_keep_mask_errors_name_the_site():
    config = make_config(dropout=0.3)
    model = make_model(config).train()
    inputs = example_inputs(config)
    masks = random_keep_masks(model.dropout_site_shapes(*inputs), 0.3)

    missing = dict(masks)
    del missing["decoder.layers.1.cross_attn.dropout"]
    with pytest.raises(ValueError, match=r"decoder\.layers\.1\.cross_attn\.dropout.*\(2, 3, 5, 7\)"):
        run(model, inputs, dropout_masks=missing)

    misshaped = {**masks, "encoder.layers.0.ffn.dropout": torch.ones(2, 7, 12, dtype=torch.bool)}
    with pytest.raises(ValueError, match=r"encoder\.layers\.0\.ffn\.dropout.*\(2, 7, 12\).*\(2, 7, 20\)"):
        run(model, inputs, dropout_masks=misshaped)

    with pytest.raises(ValueError, match="unknown sites.*encoder.typo"):
        run(model, inputs, dropout_masks={**masks, "encoder.typo": torch.ones(1, dtype=torch.bool)})

    with pytest.raises(ValueError, match="keep_mask"):
        tt.Dropout(0.3).train()(torch.ones(2, 3), torch.ones(3, 2, dtype=torch.bool))
    with pytest.raises(TypeError, match="boolean"):
        tt.Dropout(0.3).train()(torch.ones(2, 3), torch.ones(2, 3))


# --- Errors are part of the interface ------------------------------------------------------------


def _ids(*shape, value=3, dtype=torch.long):
    return torch.full(shape, value, dtype=dtype)


TRANSFORMER_INPUT_ERRORS = [
    # (src_ids, tgt_ids, exception, words the message must contain)
    (_ids(2, 4, dtype=torch.float32), _ids(2, 3), TypeError, ["src_ids", "integer tensor", "torch.float32"]),
    (_ids(2, 4), _ids(2, 3, dtype=torch.bool), TypeError, ["tgt_ids", "integer tensor", "torch.bool"]),
    ([[3, 4]], _ids(1, 3), TypeError, ["src_ids", "integer tensor", "list"]),
    (_ids(4), _ids(2, 3), ValueError, ["src_ids", "(B, T)", "(4,)"]),
    (_ids(2, 4), _ids(2, 3, 1), ValueError, ["tgt_ids", "(B, T)", "(2, 3, 1)"]),
    (_ids(2, 4, value=11), _ids(2, 3), ValueError, ["src_ids", "[0, 11)", "max 11"]),
    (_ids(2, 4), _ids(2, 3, value=-1), ValueError, ["tgt_ids", "[0, 13)", "min -1"]),
    (_ids(2, 4), _ids(3, 3), ValueError, ["src_ids", "tgt_ids", "batch size", "2", "3"]),
    (_ids(2, 17), _ids(2, 3), ValueError, ["src_ids", "max_len=16", "T=17"]),
    (_ids(2, 0), _ids(2, 3), ValueError, ["src_ids", "empty", "(2, 0)"]),
    (_ids(2, 4), _ids(2, 0), ValueError, ["tgt_ids", "empty", "(2, 0)"]),
]


@pytest.mark.parametrize("src, tgt, error, words", TRANSFORMER_INPUT_ERRORS)
def test_transformer_input_errors(src, tgt, error, words):
    model = make_model(make_config())
    for call in (lambda: model(src, tgt), lambda: model.dropout_site_shapes(src, tgt)):
        with pytest.raises(error) as info:
            call()
        for word in words:
            assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"


@pytest.mark.parametrize(
    "ids, error, words",
    [
        (_ids(2, 4, dtype=torch.float64), TypeError, ["ids", "integer tensor", "torch.float64"]),
        (_ids(2, 4, 1), ValueError, ["ids", "(B, T)"]),
        (_ids(2, 4, value=13), ValueError, ["ids", "[0, 13)"]),
        (_ids(1, 17), ValueError, ["ids", "max_len"]),
        (_ids(1, 0), ValueError, ["ids", "empty"]),
    ],
)
def test_lm_input_errors(ids, error, words):
    model = make_model(make_config(), lm=True)
    with pytest.raises(error) as info:
        model(ids)
    for word in words:
        assert word in str(info.value)


def test_integer_dtypes_other_than_int64_are_accepted():
    config = make_config()
    model = make_model(config).eval()
    src, tgt = example_inputs(config)
    want = model(src, tgt)
    for dtype in (torch.int32, torch.uint8):
        assert torch.equal(model(src.to(dtype), tgt.to(dtype)), want)


def test_multi_head_attention_errors():
    with pytest.raises(ValueError, match="d_model.*n_heads"):
        tt.MultiHeadAttention(10, 3)
    mha = tt.MultiHeadAttention(6, 2)
    x = torch.randn(1, 2, 6)
    with pytest.raises(TypeError, match="attn_mask.*boolean"):
        mha(x, x, x, attn_mask=torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"query.*\(B, T, D\)"):
        mha(x[0], x, x)
    with pytest.raises(ValueError, match=r"n_heads must be a multiple of n_kv_heads.*n_heads=4, n_kv_heads=3"):
        tt.MultiHeadAttention(8, 4, n_kv_heads=3)


@pytest.mark.parametrize("strict", [True, False])
def test_load_state_dict_errors(strict):
    model = make_model(make_config())
    state = model.state_dict()

    misshaped = {**state, "decoder.layers.0.ffn.linear1.weight": torch.zeros(20, 13)}
    with pytest.raises(
        ValueError, match=r"decoder\.layers\.0\.ffn\.linear1\.weight: got \(20, 13\), expected \(20, 12\)"
    ):
        model.load_state_dict(misshaped, strict=strict)

    incomplete = {k: v for k, v in state.items() if k != "output_proj.bias"}
    extra = {**state, "output_proj.scale": torch.zeros(1)}
    if strict:
        with pytest.raises(ValueError, match=r"missing keys \['output_proj.bias'\]"):
            model.load_state_dict(incomplete)
        with pytest.raises(ValueError, match=r"unexpected keys \['output_proj.scale'\]"):
            model.load_state_dict(extra)
    else:
        result = model.load_state_dict(incomplete, strict=False)
        assert result.missing_keys == ["output_proj.bias"]
        result = model.load_state_dict(extra, strict=False)
        assert result.unexpected_keys == ["output_proj.scale"]


def test_config_is_checked():
    with pytest.raises(TypeError, match="config"):
        tt.Transformer({"d_model": 12})


# --- Loss -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("ignore_index", [-100, PAD])
def test_cross_entropy_equals_torch(label_smoothing, ignore_index):
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 13, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 13, (2, 5))
    targets[0, :2] = PAD
    loss = tt.cross_entropy(logits, targets, ignore_index=ignore_index, label_smoothing=label_smoothing)
    want = F.cross_entropy(
        logits.reshape(10, 13), targets.reshape(10), ignore_index=ignore_index, label_smoothing=label_smoothing
    )
    torch.testing.assert_close(loss, want, rtol=0, atol=1e-15)
    (grad,) = torch.autograd.grad(loss, logits)
    assert grad.abs().max() > 0
    if ignore_index == PAD:
        assert (grad[0, :2] == 0).all()


def test_cross_entropy_errors():
    logits = torch.randn(2, 5, 13)
    with pytest.raises(ValueError, match="targets"):
        tt.cross_entropy(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="targets"):
        tt.cross_entropy(logits, torch.zeros(2, 5))
