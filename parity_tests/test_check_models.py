"""Whole models judged as their authors call them, with no glue beyond a factory: the output read from a
`(logits, loss)` tuple or a dict, the last position only (nanoGPT's inference path), hidden states put through the
model's own head (the Annotated Transformer's `generator`).
"""

from __future__ import annotations

import math
import re
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from parity_tests import check
from parity_tests import user_models as U
from parity_tests.check import tables as TB


class AuthorsOutput(nn.Module):
    """A Llama-style LM returned the way published code returns it: `returns` says how."""

    def __init__(self, returns: str, mistake=None):
        super().__init__()
        torch.manual_seed(0)
        self.model = U.TutorialLlama(mistake=mistake)
        self.returns = returns

    def forward(self, idx, targets=None):
        logits = self.model(idx)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        if self.returns == "last position":  # nanoGPT: forward(idx) without targets
            return logits[:, [-1], :], loss
        if self.returns == "last position, squeezed":
            return logits[:, -1, :]
        return {"loss": loss, "logits": logits}  # a dict with the loss first (None without targets)


@pytest.mark.parametrize("returns", ["last position", "last position, squeezed", "dict"])
def test_authors_output_is_read_and_compared(returns):
    result = check.module(AuthorsOutput(returns), "transformer_lm")
    assert result.passed, str(result)
    gradients = [r for r in result.rows if r.name.startswith("d ")]
    assert len(gradients) >= 10 and all(r.note != "all zero" for r in gradients), str(result)
    assert ("positions" in result.conventions) == returns.startswith("last"), result.conventions


def test_mistake_behind_the_last_position_is_named_where_it_is():
    result = check.module(AuthorsOutput("last position", "attention.kv_heads_tiled"), "transformer_lm")
    assert not result.passed
    assert result.first_divergence == "model.layers.0.attention", str(result)
    assert [d.id for d in result.diagnoses] == ["attention.kv_heads_tiled"], str(result)


def test_hidden_states_go_through_the_models_own_generator():
    """AnnotatedStyle's forward(src, tgt, src_mask, tgt_mask) returns the decoder's hidden states; its head is the
    separate `generator`. No call= adapter: the judge builds the masks and applies the generator."""
    result = check.module(U.AnnotatedStyle(), "transformer")
    assert result.passed, str(result)
    trap = check.module(U.AnnotatedStyle(mistake="std"), "transformer")
    assert trap.first_divergence == "encoder.0.sublayer.0.norm", str(trap)
    assert [d.id for d in trap.diagnoses] == ["layer_norm.unbiased_variance", "layer_norm.eps_outside_sqrt"]


# -- float32 inside a model is not a mistake -----------------------------------------------------------------------


def test_long_float32_sinusoid_table_is_recognised_and_overwritten():
    """The Annotated Transformer's max_len=5000 table built in float32 is 1.5e-4 from the float64 one at the last
    positions (float32 rounding of the angle): the table, not a mistake."""
    result = check.module(U.Positions(8, max_len=5000), "positional_encoding")
    assert result.passed, str(result)
    assert any("float32 precision" in note for note in result.notes), result.notes
    wrong = check.module(U.Positions(8, max_len=5000, mistake="positions.wrong_frequencies"), "positional_encoding")
    assert [d.id for d in wrong.diagnoses] == ["positions.wrong_frequencies"], str(wrong)


class PlainAttributeTable(nn.Module):
    """d2l's positional encoding: the float32 sinusoids kept as a plain tensor attribute `P`, not a buffer."""

    def __init__(self, d_model=8, max_len=1000):
        super().__init__()
        self.P = torch.zeros((1, max_len, d_model))
        X = torch.arange(max_len, dtype=torch.float32).reshape(-1, 1) / torch.pow(
            10000, torch.arange(0, d_model, 2, dtype=torch.float32) / d_model
        )
        self.P[:, :, 0::2], self.P[:, :, 1::2] = torch.sin(X), torch.cos(X)

    def forward(self, X):
        return X + self.P[:, : X.shape[1], :].to(X.device)


def test_sinusoid_table_kept_as_a_plain_attribute_is_recognised():
    result = check.module(PlainAttributeTable(), "positional_encoding")
    assert result.passed and any(n.startswith("P: the reference's") for n in result.notes), str(result)


def test_one_rotary_pair_is_read_as_two_features_at_no_base():
    """A table of one pair turned (frequency 1 at any base), (T, 2) as halves or pairs, is R = 2 with no base read,
    not R = 4 at base 1 (two equal columns); a real table of R = 4 keeps its base."""
    t = torch.arange(6.0)[:, None]
    for f in (torch.cos, torch.sin):
        assert TB.base_of(f(t).repeat(1, 2), 8) == (None, 2)
        assert TB.rope_table(f(t).repeat(1, 2).numpy(), 4) is None  # no base of 1
        assert TB.base_of(f(t * torch.tensor([1.0, 0.01])), 8) == (10000.0, 4)


def test_long_float32_rope_tables_are_recognised_and_overwritten():
    model = U.TutorialLlama()
    for layer in model.layers:
        layer.attention.rotary = U.Rotary(layer.attention.head_dim, max_len=4096)
    result = check.module(model, "transformer_lm")
    assert result.passed, str(result)
    assert any("cos_cached: RoPE cos" in note for note in result.notes), result.notes


class UpcastRMSNorm(U.RMSNorm):
    """Meta's RMSNorm: normalises x.float(), then casts back (a float32 island inside a float64 model)."""

    def forward(self, x):
        return super().forward(x.float()).type_as(x)


def _upcast_llama(mistake=None):
    torch.manual_seed(0)
    model = U.TutorialLlama(mistake=mistake)
    for layer in model.layers:
        layer.attention_norm, layer.ffn_norm = UpcastRMSNorm(16), UpcastRMSNorm(16)
    return model


def test_float32_island_is_named_at_its_submodule_and_run_in_float64_for_the_float64_bar():
    result = check.module(_upcast_llama(), "transformer_lm")
    assert result.passed, str(result)
    (caveat,) = result.caveats
    assert caveat[0] == "dtype.float32_island" and caveat[1].startswith("at layers.0.attention_norm:"), caveat
    assert "layers.1.ffn_norm" in caveat[1] and "caveat: dtype.float32_island" in str(result)
    assert {r.bar for r in result.rows if r.dtype == "float64"} == {1e-10}, str(result)  # the islands run in float64


@pytest.mark.parametrize(
    "mistake, where",
    [("attention.kv_heads_tiled", "layers.0.attention"), ("rms_norm.eps_outside_sqrt", "layers.0.attention_norm")],
)
def test_mistake_inside_a_model_with_float32_islands_is_named(mistake, where):
    model = _upcast_llama()
    if mistake == "rms_norm.eps_outside_sqrt":
        model.layers[0].attention_norm = UpcastRMSNorm(16, eps=1e-3, mistake=mistake)
    else:
        model = _upcast_llama(mistake)
    result = check.module(model, "transformer_lm")
    assert not result.passed and result.first_divergence == where, str(result)
    assert [d.id for d in result.diagnoses] == [mistake], str(result)


class NudgedRMSNorm(UpcastRMSNorm):
    """An upcast RMSNorm whose output is off by a relative 1e-7: no catalogued mistake, below float32 precision."""

    def forward(self, x):
        return super().forward(x) * (1 + 1e-7)


def test_mistake_below_float32_precision_inside_a_float32_island_is_caught_in_float64_and_named():
    """Eps outside the root at eps = 1e-6, inside an RMSNorm that computes in float32: a change below what float32
    can show (every float32 row passes its bar), but the islands run in float64 for the float64 comparison, which
    fails there, and the mistake is named at its submodule."""
    model = _upcast_llama()
    model.layers[0].attention_norm = UpcastRMSNorm(16, eps=1e-6, mistake="rms_norm.eps_outside_sqrt")
    result = check.module(model, "transformer_lm")
    assert all(r.ok for r in result.rows if r.dtype == "float32"), str(result)  # below float32's precision
    assert not all(r.ok for r in result.rows if r.dtype == "float64"), str(result)
    assert not result.passed and result.first_divergence == "layers.0.attention_norm", str(result)
    assert [d.id for d in result.diagnoses] == ["rms_norm.eps_outside_sqrt"], str(result)


def test_difference_below_float32_precision_that_no_mistake_explains_fails_where_it_is():
    """A 1e-7 nudge inside a float32 island is no rounding once the island runs in float64: the float64
    comparison fails, first diverging at the nudged norm, and nothing in the catalogue is claimed for it."""
    model = _upcast_llama()
    model.layers[1].ffn_norm = NudgedRMSNorm(16)
    result = check.module(model, "transformer_lm")
    assert not result.passed and result.first_divergence == "layers.1.ffn_norm", str(result)
    assert [d.id for d in result.diagnoses] == [] and "layers.1.ffn_norm" in result.unexplained, str(result)


# -- no mistake absorbed as a convention ---------------------------------------------------------------------------


def test_pass_on_a_polarity_that_is_also_a_mistake_says_so():
    inverted = check.module(U.Attention(8, 2, mistake="attention.mask_inverted"), "multi_head_attention")
    assert inverted.passed, str(inverted)  # True = hidden is a convention too (torch's key_padding_mask)
    ((id_, message),) = inverted.caveats
    assert id_ == "attention.mask_inverted" and "if your callers pass True = keep" in message, message
    assert "caveat: attention.mask_inverted: passes if True means hidden" in str(inverted)
    assert check.module(U.Attention(8, 2), "multi_head_attention").caveats == []  # the reference's polarity


def _unscaled_annotated():
    model = U.AnnotatedStyle()
    model.src_embed = U.Embedding(13, 16, mistake="embedding.missing_scale")
    model.tgt_embed = U.Embedding(11, 16, mistake="embedding.missing_scale")
    return model


def test_pass_without_the_embedding_scale_says_so():
    unscaled = check.module(_unscaled_annotated(), "transformer")
    assert unscaled.passed and [c[0] for c in unscaled.caveats] == ["embedding.missing_scale"], str(unscaled)
    assert check.module(U.AnnotatedStyle(), "transformer").caveats == []
    stated = check.module(_unscaled_annotated(), "transformer", scale_embeddings=False)
    assert stated.passed and stated.caveats == []  # the caller said so: nothing left to tell


def test_conventions_hold_only_what_a_run_confirmed():
    result = check.module(U.Attention(8, 2, mistake="attention.heads_without_transpose"), "multi_head_attention")
    assert not result.passed and result.conventions == {} and not result.confirmed, str(result)
    assert result.assumed["batch_first"] is True
    assert "conventions assumed (none reproduced the reference" in str(result)
    assert "config assumed (the closest, not confirmed)" in str(result)
    assert "output" not in check.module(U.Attention(8, 2), "multi_head_attention").conventions  # not logits


# -- the first divergence at the innermost submodule, whatever the call path ---------------------------------------


class SlippedListAttention(U.ListAttention):
    """The Annotated Transformer's attention (projections in a ModuleList `linears`) with one slip put in."""

    def __init__(self, h, d_model, mistake):
        super().__init__(h, d_model)
        self.mistake = mistake

    def forward(self, query, key, value, mask):
        B = query.shape[0]
        q, k, v = (
            lin(x).view(B, -1, self.h, self.d_k).transpose(1, 2)
            for lin, x in zip(self.linears, (query, key, value), strict=False)
        )
        divisor = self.d_k if self.mistake == "attention.wrong_scale" else math.sqrt(self.d_k)
        hidden = mask.unsqueeze(1) == (1 if self.mistake == "attention.mask_inverted" else 0)
        scores = (q @ k.transpose(-2, -1) / divisor).masked_fill(hidden, -1e9)
        x = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, -1, self.h * self.d_k)
        return self.linears[3](x)


@pytest.mark.parametrize("mistake", ["attention.wrong_scale", "attention.mask_inverted"])
def test_attention_called_through_a_lambda_is_where_the_mistake_is_named(mistake):
    """encoder.0's self-attention runs as `self.sublayer[0](x, lambda y: self.self_attn(y, y, y, mask))`; with the
    author's own masks (annotated_call) an inverted polarity is the mistake itself, not a convention."""
    torch.manual_seed(0)
    model = U.AnnotatedStyle()
    model.encoder[0].self_attn = SlippedListAttention(2, 16, mistake)
    result = check.module(model, "transformer", call=U.annotated_call)
    assert not result.passed and result.first_divergence == "encoder.0.self_attn", str(result)
    assert [d.id for d in result.diagnoses] == [mistake], str(result)


def test_wrong_frequencies_are_named_at_the_module_that_keeps_the_table():
    model = U.AnnotatedStyle()
    model.positions = U.Positions(16, mistake="positions.wrong_frequencies")
    result = check.module(model, "transformer", call=U.annotated_call)
    assert result.first_divergence == "positions" and [d.id for d in result.diagnoses] == [
        "positions.wrong_frequencies"
    ], str(result)


def test_attention_with_no_mask_that_sees_the_future_is_not_causal_only():
    """minGPT's block with its causal buffer all ones: no mask is passed in, so none is 'ignored'."""
    block = U.MinGPTBlock()
    block.attn.bias.fill_(1.0)
    result = check.module(block, "decoder_only_layer", n_heads=2)
    assert result.first_divergence == "attn" and [d.id for d in result.diagnoses] == ["attention.not_causal"], str(
        result
    )


class HalfTransposed(U.Attention):
    """The transpose left out of the split only, or of the merge only (`which`)."""

    def __init__(self, which):
        super().__init__(8, 2)
        self.which = which

    def split(self, x):
        if self.which == "split":
            return x.view(x.shape[0], self.n_heads, -1, self.head_dim)
        return super().split(x)

    def forward(self, query, key, value, mask=None):
        if self.which == "split":
            return super().forward(query, key, value, mask)
        Q, K, V = self.split(self.fc_q(query)), self.split(self.fc_k(key)), self.split(self.fc_v(value))
        scores = (Q @ K.transpose(-1, -2) / self.scale).masked_fill(mask == 0, -1e10)
        return self.fc_o((scores.softmax(-1) @ V).reshape(query.shape[0], -1, self.hid_dim))  # no transpose back


@pytest.mark.parametrize("which", ["split", "merge"])
def test_heads_without_transpose_on_one_side_only_is_named(which):
    result = check.module(HalfTransposed(which), "multi_head_attention")
    assert not result.passed and [d.id for d in result.diagnoses] == ["attention.heads_without_transpose"], str(result)
    assert which in result.diagnoses[0].message


def test_encoder_reference_searches_the_first_divergence_like_any_model():
    """check.module(..., "encoder") is the encoder_model level: the (caller, config) whose divergence comes latest is
    kept, not the one whose output happens to be closest (here GELU, wrongly blaming layers.0's feed-forward)."""
    model = U.Encoder()
    model.layers[1].self_attention = U.Attention(8, 2, mistake="attention.heads_without_transpose")
    result = check.module(model, "encoder")
    assert result.first_divergence == "layers.1.self_attention", str(result)
    assert [d.id for d in result.diagnoses] == ["attention.heads_without_transpose"], str(result)


def test_values_rotated_in_metas_pairing_are_named():
    """In a model rotating Meta's pairs (2i, 2i + 1), the q and k rows are read in that order; the v rows are not,
    so values rotated too are rotated in pairs of the user's own layout."""
    result = check.module(U.TutorialLlama(interleaved=True, mistake="rope.applied_to_v"), "transformer_lm")
    assert result.first_divergence == "layers.0.attention", str(result)
    assert [d.id for d in result.diagnoses] == ["rope.applied_to_v"], str(result)


def test_embedding_scale_is_named_at_the_module_that_scales():
    """The Annotated Transformer's Embeddings multiplies its nn.Embedding `lut` by sqrt(d_model): a scale mistake
    sits in the wrapper, not in the table."""
    model = U.AnnotatedStyle()
    model.src_embed = U.Embedding(13, 16, mistake="embedding.double_scale")
    result = check.module(model, "transformer", call=U.annotated_call)
    assert result.first_divergence == "src_embed" and [d.where for d in result.diagnoses] == ["src_embed"], str(result)


class OptionalPaddingMask(nn.Module):
    """transformers' GPT-2 signature: forward(input_ids, attention_mask=None), the mask a (B, T) padding mask only."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = U.TutorialLlama()

    def forward(self, input_ids, attention_mask=None):
        if attention_mask is not None and attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask must be (B, T) like input_ids, got {tuple(attention_mask.shape)}")
        return {"logits": self.model(input_ids)}


def test_an_optional_mask_is_also_left_out():
    result = check.module(OptionalPaddingMask(), "transformer_lm")
    assert result.passed and result.conventions["mask"].startswith("none passed"), str(result)


ATTENTION_IDS = [
    "attention.wrong_scale",
    "attention.no_max_subtraction",
    "attention.mask_after_softmax",
    "attention.mask_ignored",
    "attention.mask_inverted",
    "attention.padding_on_queries",
    "attention.heads_without_transpose",
    "attention.softmax_wrong_axis",
    "dropout.active_in_eval",
]


@pytest.mark.parametrize("mistake", ATTENTION_IDS)
def test_every_attention_mistake_is_named_inside_a_whole_model(mistake):
    """Each id put into the second layer's attention of a whole encoder: named, and named there (the first
    divergence too, except for what a probe finds: dropout, overflow). The polarity is stated for the inverted mask:
    unstated, a flipped mask passes with its caveat (test_pass_on_a_polarity_that_is_also_a_mistake_says_so)."""
    model = U.Encoder()
    model.layers[1].self_attention = U.Attention(8, 2, mistake=mistake)
    result = check.module(model, "encoder", mask="bool_keep" if mistake == "attention.mask_inverted" else None)
    assert [(d.id, d.where) for d in result.diagnoses] == [(mistake, "layers.1.self_attention")], str(result)
    probed = mistake in ("attention.no_max_subtraction", "dropout.active_in_eval")
    assert result.first_divergence == (None if probed else "layers.1.self_attention"), str(result)


# -- encoder_stack: layers on embeddings (nn.TransformerEncoder, the Annotated Transformer's Encoder(layer, N)) ----


def torch_encoder(norm_first: bool) -> nn.TransformerEncoder:
    """torch's own stack: post-norm without a final norm (the PyTorch tutorial's), or pre-norm with one."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first)
    return nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(16) if norm_first else None, enable_nested_tensor=False)


def annotated_encoder(attention=None) -> nn.Module:
    """The Annotated Transformer's Encoder(layer, N): pre-norm sublayers called through lambdas, a final norm."""
    from parity_tests.corpus import annotated as AT

    torch.manual_seed(0)
    heads = AT.MultiHeadedAttention(2, 16, 0.0, attention=attention or AT.attention)
    return AT.Encoder(AT.EncoderLayer(16, heads, AT.PositionwiseFeedForward(16, 32, 0.0), 0.0), 2)


@pytest.mark.parametrize("norm_first", [False, True])
def test_torchs_encoder_stack_passes_at_encoder_stack(norm_first):
    result = check.module(torch_encoder(norm_first), "encoder_stack")
    assert result.passed and result.config.n_encoder_layers == 2, str(result)
    assert result.config.norm_first == norm_first, str(result)
    assert ("encoder.final_norm.weight" in {ref for ref, _ in result.mapping.values()}) == norm_first
    assert not result.caveats, str(result)  # torch's padding mask is documented: True = masked


def test_annotated_encoder_passes_and_a_wrong_scale_inside_is_named_at_its_attention():
    from parity_tests.corpus import annotated as AT

    assert check.module(annotated_encoder(), "encoder_stack").passed
    result = check.module(annotated_encoder(AT.attention_by_d_k), "encoder_stack")
    assert not result.passed, str(result)
    assert [(d.id, d.where) for d in result.diagnoses] == [("attention.wrong_scale", "layers.0.self_attn")], str(result)
    assert result.first_divergence == "layers.0.self_attn"
    failing = [r for r in result.rows if not r.ok]
    assert failing and all(r.error > 1e-3 and not math.isnan(r.error) for r in failing), str(result)


# -- decoder_stack: cross-attending layers on embeddings (nn.TransformerDecoder, Decoder(layer, N)) ----------------


def torch_decoder(norm_first: bool) -> nn.TransformerDecoder:
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first)
    return nn.TransformerDecoder(layer, 2, norm=nn.LayerNorm(16) if norm_first else None)


def annotated_decoder(attention=None) -> nn.Module:
    """The Annotated Transformer's Decoder(layer, N): self-, source- and feed-forward sublayers, a final norm."""
    from parity_tests.corpus import annotated as AT

    torch.manual_seed(0)
    heads = [AT.MultiHeadedAttention(2, 16, 0.0, attention=attention or AT.attention) for _ in range(2)]
    return AT.Decoder(AT.DecoderLayer(16, *heads, AT.PositionwiseFeedForward(16, 32, 0.0), 0.0), 2)


@pytest.mark.parametrize("norm_first", [False, True])
def test_torchs_decoder_stack_passes_at_decoder_stack(norm_first):
    result = check.module(torch_decoder(norm_first), "decoder_stack")
    assert result.passed and result.config.n_decoder_layers == 2, str(result)
    assert result.config.norm_first == norm_first and not result.caveats, str(result)
    rows = {r.name: r for r in result.rows if r.dtype == "float64"}
    assert rows["dmemory"].ok and rows["dmemory"].note != "all zero", str(result)  # the memory's gradient compared


def test_annotated_decoder_passes_and_a_wrong_scale_inside_is_named_at_its_attention():
    from parity_tests.corpus import annotated as AT

    assert check.module(annotated_decoder(), "decoder_stack").passed
    result = check.module(annotated_decoder(AT.attention_by_d_k), "decoder_stack")
    assert not result.passed and result.first_divergence == "layers.0.self_attn", str(result)
    assert [(d.id, d.where) for d in result.diagnoses] == [("attention.wrong_scale", "layers.0.self_attn")], str(result)


# -- transformers' own models as a user's: layouts read from the computation, no glue -----------------------------

SMALL = dict(hidden_size=16, num_attention_heads=4, num_hidden_layers=2, vocab_size=40, max_position_embeddings=64)


def _transformers_model(name: str):
    """A tiny random transformers model of `name`, (model, level, {user parameter: the layout note expected})."""
    import transformers as T

    torch.manual_seed(0)
    layer = "model.layers.0."
    cases = {
        "gpt_neox": (  # query_key_value's rows are q, k, v of each head in turn
            T.GPTNeoXForCausalLM, T.GPTNeoXConfig(**SMALL, intermediate_size=24, rotary_pct=1.0,
                                                 use_parallel_residual=False), "transformer_lm",
            {"gpt_neox.layers.0.attention.query_key_value.weight": "fused rows q, k, v, head by head"},
        ),
        "gemma": (  # RMSNorm scales by 1 + weight
            T.GemmaForCausalLM, T.GemmaConfig(**SMALL, intermediate_size=24, num_key_value_heads=2, head_dim=4),
            "transformer_lm", {f"{layer}input_layernorm.weight": "minus 1 (scaled by 1 + weight)"},
        ),
        "phi3": (  # one qkv_proj (grouped-query) and one gate_up_proj, split in the forward
            T.Phi3ForCausalLM, T.Phi3Config(**SMALL, intermediate_size=24, num_key_value_heads=2, pad_token_id=0),
            "transformer_lm", {f"{layer}self_attn.qkv_proj.weight": "fused rows q, k, v",
                               f"{layer}mlp.gate_up_proj.weight": "fused rows gate, linear1"},
        ),
        "opt": (  # the residual sum reshaped before the next norm reads it: pre-norm all the same
            T.OPTForCausalLM, T.OPTConfig(**SMALL, ffn_dim=24, word_embed_proj_dim=16), "transformer_lm",
            {"model.decoder.embed_positions.weight": "after 2 unread rows"},
        ),
        "falcon": (  # the projections add their own bias after the product; one K/V head
            T.FalconForCausalLM, T.FalconConfig(**{k: v for k, v in SMALL.items() if "position" not in k},
                                                new_decoder_architecture=False, parallel_attn=False, alibi=False,
                                                bias=True),
            "transformer_lm", {"transformer.h.0.self_attention.query_key_value.weight": "fused rows q, k, v"},
        ),
        "roberta": (  # positions numbered from the ids that are not padding, from row 2
            T.RobertaModel, T.RobertaConfig(**SMALL, intermediate_size=24, pad_token_id=1), "encoder",
            {"embeddings.position_embeddings.weight": "after 2 unread rows"},
        ),
    }  # fmt: skip
    seq2seq = dict(d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                   encoder_ffn_dim=24, decoder_ffn_dim=24, vocab_size=40, max_position_embeddings=64)  # fmt: skip
    plain = {  # read as they are, nothing in the map to check
        "llama": (T.LlamaForCausalLM, T.LlamaConfig(**SMALL, intermediate_size=24, num_key_value_heads=2),
                  "transformer_lm"),
        "mistral": (T.MistralForCausalLM, T.MistralConfig(**SMALL, intermediate_size=24, num_key_value_heads=2),
                    "transformer_lm"),
        "qwen2": (T.Qwen2ForCausalLM, T.Qwen2Config(**SMALL, intermediate_size=24, num_key_value_heads=2),
                  "transformer_lm"),
        "qwen3": (T.Qwen3ForCausalLM, T.Qwen3Config(**SMALL, intermediate_size=24, num_key_value_heads=2, head_dim=4),
                  "transformer_lm"),
        "olmo2": (T.Olmo2ForCausalLM, T.Olmo2Config(**SMALL, intermediate_size=24, num_key_value_heads=2),
                  "transformer_lm"),  # norms after the sublayers only, q and k normed whole: ~4 s, slow
        "gemma2": (T.Gemma2ForCausalLM, T.Gemma2Config(**(SMALL | {"hidden_size": 24}), intermediate_size=24,
                                                      num_key_value_heads=2, head_dim=6, query_pre_attn_scalar=6),
                   "transformer_lm"),  # four norms a layer, soft caps, sqrt(24) kept in float32 (embed_scale)
        "gpt2": (T.GPT2LMHeadModel, T.GPT2Config(n_embd=16, n_head=4, n_layer=2, vocab_size=40, n_positions=64),
                 "transformer_lm"),
        "bert": (T.BertModel, T.BertConfig(**SMALL, intermediate_size=24), "encoder"),
        "distilbert": (T.DistilBertModel, T.DistilBertConfig(dim=16, n_heads=4, n_layers=2, hidden_dim=24,
                                                             vocab_size=40, max_position_embeddings=64), "encoder"),
        "electra": (T.ElectraModel, T.ElectraConfig(**SMALL, intermediate_size=24, embedding_size=16), "encoder"),
        "mbart": (T.MBartForConditionalGeneration, T.MBartConfig(**seq2seq), "transformer"),
        "pegasus": (T.PegasusForConditionalGeneration, T.PegasusConfig(**seq2seq), "transformer"),
    }  # fmt: skip
    cases |= {k: (*v, {}) for k, v in plain.items()}
    cls, config, level, notes = cases[name]
    return cls(config).eval(), level, notes


TRANSFORMERS_MODELS = ["gpt_neox", "gemma", "phi3", "opt", "falcon", "roberta", "llama", "mistral", "qwen2", "qwen3",
                       "gpt2", "bert", "distilbert", "electra", "mbart", "pegasus"]  # fmt: skip
TRANSFORMERS_MODELS += [pytest.param(name, marks=pytest.mark.slow) for name in ("olmo2", "gemma2")]  # 4 s and 11 s


@pytest.mark.parametrize("name", TRANSFORMERS_MODELS)
def test_transformers_models_pass_with_their_own_layouts_read(name, monkeypatch):
    """The first six were judged a divergence before their layouts were read from the computation: GPT-NeoX's
    per-head fused rows, Gemma's 1 + weight norms, OPT's reshaped residual, Falcon's bias added after the product,
    RoBERTa's positions after the padding id; the rest as the howto lists them."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, level, notes = _transformers_model(name)
    result = check.module(model, level)
    assert result.passed and result.confirmed, str(result)
    for user, note in notes.items():
        assert result.mapping[user][1] == note, str(result)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_transformers_mistral_with_a_window_shorter_than_the_probe_passes(implementation, monkeypatch):
    """transformers' decoder-only models take attention_mask as the ids' padding and build the causal mask and the
    sliding window themselves: called without one, the band they apply is read (before: a (B, 1, T, T) causal mask
    was passed, which replaced theirs, so no window was seen and the comparison failed unexplained)."""
    import transformers as T

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    config = T.MistralConfig(**SMALL, intermediate_size=24, num_key_value_heads=2, sliding_window=3)
    config._attn_implementation = implementation
    result = check.module(T.MistralForCausalLM(config).eval(), "transformer_lm")
    assert result.passed and result.config.sliding_window == 3, str(result)


def test_a_mistake_in_a_per_head_fused_layout_is_still_named():
    """The layout read (GPT-NeoX's q, k, v rows head by head) does not absorb a mistake: the scores scaled by
    1 / sqrt(d_model) instead of 1 / sqrt(head size) are named at the attention."""
    model, level, _ = _transformers_model("gpt_neox")
    for layer in model.gpt_neox.layers:
        layer.attention.scaling = 16**-0.5
    result = check.module(model, level)
    assert not result.passed and [d.id for d in result.diagnoses][:1] == ["attention.wrong_scale"], str(result)
    assert result.first_divergence == "gpt_neox.layers.0.attention", str(result)


@pytest.mark.parametrize(
    "name, model",
    [
        pytest.param(  # Pythia's; its pass takes ~5 s (the parallel block's pass in the default run: test_unseen)
            "gpt_neox",
            lambda T: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**SMALL, intermediate_size=24)),
            marks=pytest.mark.slow,
        ),
        (
            "gptj",
            lambda T: T.GPTJForCausalLM(T.GPTJConfig(n_embd=32, n_head=2, n_layer=2, vocab_size=40, rotary_dim=4)),
        ),
    ],
)
def test_a_parallel_block_is_judged_as_the_references_parallel_residual(name, model, monkeypatch):
    """Attention and feed-forward reading the same input, their outputs summed (GPT-NeoX's default
    use_parallel_residual, two norms; GPT-J's one norm): judged as the reference's parallel_residual (shared_norm
    for GPT-J's), not refused (issue 49), and both pass. GPT-J's rotary table (embed_positions: sin and cos side by
    side, built in float32 at construction, so .double() keeps its float32 rounding, 1.1e-8 at the attention) is
    read as a RoPE table and overwritten with the float64 one (check/tables.py); its width is the rotary_dim (4 of a
    head's 16 features here, as GPT-J-6B turns 64 of 256), and the interleaved pairs are read within it."""
    import transformers as T

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    result = check.module(model(T).eval(), "transformer_lm")
    assert result.config is not None and result.config.parallel_residual, str(result)
    assert result.config.shared_norm == (name == "gptj") and not result.unsupported and not result.error, str(result)
    assert result.passed, str(result)


TOWER = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 24}


@pytest.mark.parametrize(
    "name, model",
    [
        ("vit", lambda T: T.ViTModel(T.ViTConfig(**TOWER, image_size=8, patch_size=4))),
        (
            "vit_classifier",
            lambda T: T.ViTForImageClassification(T.ViTConfig(**TOWER, image_size=8, patch_size=4, num_labels=3)),
        ),
        ("clip_text", lambda T: T.CLIPTextModel(T.CLIPTextConfig(**TOWER, vocab_size=30, max_position_embeddings=10))),
        (  # pooled at eos_token_id, made the vocabulary's last id here (the end token as the original CLIP's)
            "clip_text_projected",
            lambda T: T.CLIPTextModelWithProjection(
                T.CLIPTextConfig(**TOWER, vocab_size=30, max_position_embeddings=10, projection_dim=8, eos_token_id=29)
            ),
        ),
    ],
)
def test_transformers_vit_and_clip_text_towers_pass_with_zero_glue(name, model, monkeypatch):
    """transformers' ViT (hidden states; a classifier on the class token) and CLIP text tower (hidden states; the end
    token projected) read from their structure and judged by the reference's vision pairs (check/towers.py, issue
    49): every parameter's gradient compared, none all zero."""
    import transformers as T

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    result = check.module(model(T).eval(), "transformer_lm")
    assert result.passed and "read as" in result.reference, str(result)
    grads = [r for r in result.rows if r.name.startswith("d ") and r.dtype == "float64"]
    assert len(grads) >= 20 and max(r.error for r in grads) < 1e-12, str(result)
    assert not any("vacuous" in r.name for r in result.rows), str(result)  # some gradient is not zero


def test_layers_that_share_their_weights_are_read_as_tied_layers(monkeypatch):
    """ALBERT runs one layer's weights at every depth: reference layers holding the same weights, which the judge
    reads. Its embedding mapping (a projection on the residual stream before the first layer) is not taken for a
    feed-forward block: the reference has no place for it, said there."""
    import transformers as T

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    albert = T.AlbertModel(T.AlbertConfig(**SMALL, intermediate_size=24, embedding_size=16)).eval()
    result = check.module(albert, "encoder")  # differs at ...: no pair (result.unsupported)
    said = r"^differs at encoder\.embedding_hidden_mapping_in: .* in no attention or feed-forward block"
    assert not result.passed and re.search(said, result.unsupported or ""), str(result)


MOE = dict(SMALL, num_key_value_heads=2, num_experts_per_tok=2, experts_implementation="eager")  # loops in float64


@pytest.mark.parametrize(
    "model",
    [
        lambda T: T.MixtralForCausalLM(T.MixtralConfig(**MOE, intermediate_size=24, num_local_experts=4)),
        lambda T: T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(**MOE, moe_intermediate_size=12, num_experts=4, head_dim=4)),
        lambda T: T.GptOssForCausalLM(T.GptOssConfig(**MOE, intermediate_size=12, num_local_experts=4, head_dim=4,
                                                     rope_parameters={"rope_type": "default", "rope_theta": 1.5e5})),
    ],
    ids=["mixtral", "qwen3_moe", "gpt_oss"],
)  # fmt: skip
def test_transformers_mixtures_of_experts_pass(model, monkeypatch):
    """Mixtral's, Qwen3-MoE's and GPT-OSS's routers and stacked experts (GPT-OSS's: router bias, interleaved gate and
    up, clamped) read from the flow as the reference's ffn.router / ffn.experts: every gradient compared, some not
    zero (the experts' too)."""
    import transformers as T

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    result = check.module(model(T).eval(), "transformer_lm")
    assert result.passed and result.config.n_experts == 4 and result.config.top_k == 2, str(result)
    grads = {r.name: r for r in result.rows if r.name.startswith("d ") and r.dtype == "float64"}
    assert "d decoder.layers.1.ffn.experts.down_proj" in grads and "d decoder.layers.0.ffn.router.weight" in grads
    assert not any("vacuous" in r.name for r in result.rows), str(result)


LLAMA3 = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}  # fmt: skip


@pytest.mark.parametrize(
    "family, overrides, kind",
    [
        ("deepseek_v3", dict(qk_rope_head_dim=8), "yarn"),  # 4 frequencies on YaRN's ramp: no plain base fits them
        ("gpt_oss", {}, "yarn"),  # as released but small: a window of 3 beside its sink column, swiglu_limit 1.5
        ("llama", dict(head_dim=16, rope_parameters=LLAMA3), "llama3"),
        ("qwen2", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                        "original_max_position_embeddings": 32}), "yarn"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("wrong", [False, True])
def test_transformers_scaled_rope_is_read_from_the_config_it_states(family, overrides, kind, wrong, tmp_path):
    """transformers' models whose config states a scaled RoPE (rope_parameters: YaRN, llama3) pass, the scaling read
    from the config and its frequencies matched to the module's inv_freq (overwritten in float64); the same model
    turning by plain frequencies at that base (its inv_freq replaced) fails at the first attention."""
    from parity_tests import hf_compare as H

    model = H.build_tiny(family, tmp_path, **overrides)
    if wrong:
        rotary = model.model.rotary_emb
        plain = rotary.inv_freq.numel() * 2
        rotary.inv_freq.copy_(model.config.rope_parameters["rope_theta"] ** (-torch.arange(0, plain, 2) / plain))
    result = check.module(model, "transformer_lm")
    if wrong:
        assert not result.passed and "model.layers.0.self_attn" in str(result), str(result)
        return
    assert result.passed and result.config.rope_scaling.rope_type == kind, str(result)
    assert any(f"{kind}-scaled RoPE inverse frequencies" in n for n in result.notes), result.notes
    if family == "gpt_oss":
        assert (result.config.sliding_window, result.config.swiglu_limit) == (3, 1.5), str(result)


def _silu_on_up_in_expert_2(self, hidden, top_k_index, top_k_weights):
    """transformers' eager experts' loop (MixtralExperts.forward's), expert 2 with silu on its up projection."""
    out = torch.zeros_like(hidden)
    for e in range(self.num_experts):
        rows, slot = torch.where(top_k_index == e)
        gate, up = F.linear(hidden[rows], self.gate_up_proj[e]).chunk(2, dim=-1)
        h = gate * self.act_fn(up) if e == 2 else self.act_fn(gate) * up
        out.index_add_(0, rows, F.linear(h, self.down_proj[e]) * top_k_weights[rows, slot, None])
    return out


@pytest.mark.parametrize(
    "model",
    [
        lambda T: T.MixtralForCausalLM(T.MixtralConfig(**MOE, intermediate_size=24, num_local_experts=4)),
        lambda T: T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(**MOE, moe_intermediate_size=12, num_experts=4, head_dim=4)),
    ],
    ids=["mixtral", "qwen3_moe"],
)  # fmt: skip
def test_a_mistake_inside_one_of_transformers_stacked_experts_is_named_with_its_number(model, monkeypatch):
    """divergence._expert_variants: silu on the up projection of expert 2 of layer 1 only (its experts stacked in
    one tensor): gated_feed_forward.activation_on_up at the experts' module, the message naming expert 2."""
    import transformers as T

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    built = model(T).eval()
    experts = built.model.layers[1].mlp.experts
    monkeypatch.setattr(experts, "forward", types.MethodType(_silu_on_up_in_expert_2, experts))
    result = check.module(built, "transformer_lm")
    got = [(d.id, d.where) for d in result.diagnoses]
    assert got == [("gated_feed_forward.activation_on_up", "model.layers.1.mlp.experts")], str(result)
    assert result.diagnoses[0].message.endswith("(expert 2)"), str(result)


def test_a_forward_an_op_of_which_refuses_float64_is_answered_with_what_settles_it(monkeypatch):
    """transformers' mixtures with their default grouped_mm experts refuse float64 ("Expected mat_a to be Float32 ...,
    got Double"): could not judge, saying so and naming experts_implementation="eager", not "pass call=" (which would
    not help); with it they pass (test_transformers_mixtures_of_experts_pass)."""
    import transformers as T

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    fields = {k: v for k, v in MOE.items() if k != "experts_implementation"}
    model = T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(**fields, moe_intermediate_size=12, num_experts=4, head_dim=4))
    result = check.module(model.eval(), "transformer_lm")
    assert result.error.startswith("could not judge: ") and "got Double" in result.error, str(result)
    assert 'experts_implementation="eager"' in result.error and "pass call=" not in result.error, str(result)


@pytest.mark.parametrize(
    "model, said",
    [
        (lambda T: T.OlmoForCausalLM(T.OlmoConfig(**SMALL, intermediate_size=24, num_key_value_heads=2)),
         r"differs at model\.layers\.0\.input_layernorm: layer_norm.* without a (weight|scale)"),
    ],
)  # fmt: skip
def test_ops_the_reference_never_computes_are_refused_naming_the_module(model, said, monkeypatch):
    """A norm without weights: refused where it runs, not by a count of norms."""
    import transformers as T

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    result = check.module(model(T).eval(), "transformer_lm")  # differs at ...: no pair (result.unsupported)
    assert not result.passed and re.search(said + ".*no pair for", result.unsupported or ""), str(result)


STORED = {  # how a raw Linear applies its weight: (stored (out, in)?, forward)
    "x @ W.T": (True, lambda x, w: x @ w.T),
    "matmul(x, W.t())": (True, lambda x, w: torch.matmul(x, w.t())),
    "einsum(...i,oi->...o)": (True, lambda x, w: torch.einsum("...i,oi->...o", x, w)),
    "x @ W": (False, lambda x, w: x @ w),
    "einsum(...i,io->...o)": (False, lambda x, w: torch.einsum("...i,io->...o", x, w)),
}


@pytest.mark.parametrize("form", list(STORED))
def test_a_raw_weights_orientation_is_read_from_the_product_that_applies_it(form, monkeypatch):
    """A 2-D weight (out, in) or (in, out), by how the recorded product sums it against the input (d_ff != d)."""
    from parity_tests.corpus import fresh21

    out_in, apply = STORED[form]

    def init(self, d_in: int, d_out: int) -> None:
        nn.Module.__init__(self)
        self.weight = nn.Parameter(0.2 * torch.randn(*((d_out, d_in) if out_in else (d_in, d_out))))

    monkeypatch.setattr(fresh21.Linear, "__init__", init)
    monkeypatch.setattr(fresh21.Linear, "forward", lambda self, x: apply(x, self.weight))
    result = check.module(fresh21.scratch_block(), "decoder_only_layer")
    assert result.passed, str(result)
    assert "transposed" not in str(result.mapping) if out_in else "transposed" in str(result.mapping)
