"""RoBERTa, XLM-RoBERTa, DistilBERT and MPNet beyond what test_hf.py runs for every family (outputs and every
gradient, both sides, float64 and float32; round trips; to_hf): the poolers, RoBERTa's positions (pad_id + the count
of real tokens, the pad row without gradient), MPNet's bucketed bias over long distances, the checkpoints of the head
classes, and what each family refuses.
Tiny random models written by transformers in the test (hf_compare.build_tiny), never downloaded."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
import transformers

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import hf as np_hf
from numpy_transformer.validation import pad_offset_positions
from parity_tests import components as C
from parity_tests import hf_compare as H
from torch_transformer import hf as torch_hf

SIDES = ["numpy", "torch"]
POOLED = ["roberta", "xlm-roberta", "mpnet"]  # a pooler in the base class, and RoBERTa's positions
HF = {"numpy": np_hf, "torch": torch_hf}


def load(side: str, directory):
    return H.load_ours(side, directory, np.float64)


def forward(model, side: str, ids: np.ndarray, token_types=None) -> np.ndarray:
    """Our hidden states (B, T, D) in evaluation mode, as a NumPy array."""
    model.eval()
    if side == "numpy":
        return model.forward(ids, token_types)
    with torch.no_grad():
        return C.to_numpy(model(torch.from_numpy(ids), None if token_types is None else torch.from_numpy(token_types)))


# ----------------------------------------------------------------------------------------------
# The poolers: the checkpoint holds one, ours reads it, and its gradients match.


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("family", POOLED)
def test_pooler_and_every_gradient_match_transformers(family, side, tmp_path):
    """RobertaModel, XLMRobertaModel and MPNetModel hold a pooler: ours has it (config.pooler), pool(hidden) equals
    pooler_output, and with random upstream gradients on both the hidden states and the pooled output every gradient
    (the pooler's, and the encoder's through the first position) agrees with transformers' autograd in float64."""
    H.build_tiny(family, tmp_path)
    reference = H.CLASSES[family].from_pretrained(tmp_path, dtype=torch.float64).eval()
    ids, _ = H.make_inputs(family)
    rng = np.random.default_rng(5)
    D = reference.config.hidden_size
    up_hidden, up_pooled = rng.standard_normal((*ids.shape, D)), rng.standard_normal((ids.shape[0], D))
    t_ids = torch.from_numpy(ids)
    out = reference(input_ids=t_ids, attention_mask=(t_ids != reference.config.pad_token_id).long())
    loss = (out.last_hidden_state * torch.from_numpy(up_hidden)).sum()
    (loss + (out.pooler_output * torch.from_numpy(up_pooled)).sum()).backward()
    theirs = {name: p.grad.numpy() for name, p in reference.named_parameters()}
    model = load(side, tmp_path)
    assert model.config.pooler and model.config.positions_after_pad
    if side == "numpy":
        model.zero_grad()
        hidden = model.forward(ids)
        pooled = model.pool(hidden)
        model.backward(up_hidden + model.pool_backward(up_pooled))
        ours = np_hf.to_hf(model, model.grads, tied=False)
    else:
        hidden = model(t_ids)
        pooled = model.pool(hidden)
        ((hidden * torch.from_numpy(up_hidden)).sum() + (pooled * torch.from_numpy(up_pooled)).sum()).backward()
        ours = torch_hf.to_hf(model, {name: p.grad for name, p in model.named_parameters()}, tied=False)
        ours = {k: v.numpy() for k, v in ours.items()}
        hidden, pooled = hidden.detach().numpy(), pooled.detach().numpy()
    assert sorted(ours) == sorted(theirs) and {"pooler.dense.weight", "pooler.dense.bias"} <= set(ours)
    result = C.Result(
        outputs={"hidden": (hidden, out.last_hidden_state.detach().numpy()),
                 "pooled": (pooled, out.pooler_output.detach().numpy())},
        grads={name: (ours[name], theirs[name]) for name in theirs},
    )  # fmt: skip
    problems = C.failures(result, np.float64)
    assert not problems, "\n".join(problems)
    zero = [name for name, (g, _) in result.grads.items() if not np.any(g)]
    assert not zero, f"zero gradients: {zero}"


# ----------------------------------------------------------------------------------------------
# RoBERTa's positions.


def test_positions_are_transformers_create_position_ids_from_input_ids():
    """pad_id + the count of real tokens up to and including each token, pad_id at a pad: by hand, and equal to
    transformers' own function on left, inner and right padding."""
    ids = np.array([[1, 1, 7, 8, 9], [7, 1, 8, 9, 1], [5, 6, 7, 8, 9]])
    expected = np.array([[1, 1, 2, 3, 4], [2, 1, 3, 4, 1], [2, 3, 4, 5, 6]])
    np.testing.assert_array_equal(pad_offset_positions(ids, 1), expected)
    create = transformers.models.roberta.modeling_roberta.RobertaEmbeddings.create_position_ids_from_input_ids
    np.testing.assert_array_equal(create(torch.from_numpy(ids), 1).numpy(), expected)


@pytest.mark.parametrize("side", SIDES)
def test_a_left_padded_row_reads_the_positions_of_the_row_alone(side, tmp_path):
    """RoBERTa counts real tokens, so padding in front of a row moves none of its positions: its real tokens get the
    hidden states of the row run alone (BERT's index positions would shift them), as in transformers."""
    H.build_tiny("roberta", tmp_path)
    model = load(side, tmp_path)
    row = np.array([[5, 9, 7, 21, 12]])
    padded = np.array([[1, 1, 5, 9, 7, 21, 12]])
    alone, together = forward(model, side, row), forward(model, side, padded)
    np.testing.assert_allclose(together[:, 2:], alone, rtol=0, atol=1e-12)
    reference = H.CLASSES["roberta"].from_pretrained(tmp_path, dtype=torch.float64).eval()
    with torch.no_grad():
        theirs = reference(input_ids=torch.from_numpy(padded), attention_mask=torch.from_numpy(padded != 1).long())
    np.testing.assert_allclose(together, theirs.last_hidden_state.numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("side", SIDES)
def test_the_pad_row_of_the_position_table_takes_no_gradient(side, tmp_path):
    """Pad tokens read row pad_id of the position table; it takes no gradient (nn.Embedding(padding_idx=pad)) even
    where the upstream gradient at the pads is not zero, while every row a real token reads does."""
    H.build_tiny("roberta", tmp_path)
    model = load(side, tmp_path)
    ids = np.array([[1, 1, 5, 9, 7], [4, 6, 1, 8, 1]])
    upstream = np.random.default_rng(2).standard_normal((*ids.shape, model.config.d_model))
    if side == "numpy":
        model.eval().zero_grad()
        model.forward(ids)
        model.backward(upstream)
        table = model.grads["encoder.position_embedding.weight"]
    else:
        (model.eval()(torch.from_numpy(ids)) * torch.from_numpy(upstream)).sum().backward()
        table = model.encoder.position_embedding.weight.grad.numpy()
    assert not table[1].any() and table[2:5].all(1).all() and not table[5:].any()  # three real tokens at most


@pytest.mark.parametrize("side", SIDES)
def test_an_input_past_the_shifted_table_is_refused(side, tmp_path):
    """A table of max_position_embeddings = 18 rows with pad 1 covers 16 tokens (positions 2 .. 17)."""
    H.build_tiny("roberta", tmp_path)
    model = load(side, tmp_path)
    forward(model, side, np.full((1, 16), 5))
    with pytest.raises(ValueError, match=r"ids has 17 positions.*pad_id=1.*max_len=18.*T <= 16"):
        forward(model, side, np.full((1, 17), 5))


def test_the_config_refuses_positions_after_pad_where_they_mean_nothing():
    base = dict(src_vocab_size=11, tgt_vocab_size=11, d_model=8, n_heads=2, d_ff=12, n_decoder_layers=0)
    with pytest.raises(ValueError, match=r"positions_after_pad.*positional='sinusoidal' \(needs 'learned'\)"):
        nt.TransformerConfig(**base, positions_after_pad=True)
    with pytest.raises(ValueError, match=r"positions_after_pad.*pad_id=None"):
        nt.TransformerConfig(**base, positional="learned", pad_id=None, positions_after_pad=True)
    with pytest.raises(ValueError, match=r"positions_after_pad.*pad_id=7 \(needs a token id below max_len - 1 = 7"):
        nt.TransformerConfig(**base, positional="learned", max_len=8, pad_id=7, positions_after_pad=True)
    with pytest.raises(TypeError, match="positions_after_pad must be a bool"):
        nt.TransformerConfig(**base, positional="learned", positions_after_pad=1)
    with pytest.raises(ValueError, match="relative_bias adds T5's bias beside another positional"):
        nt.TransformerConfig(**base, positional="relative", relative_bias=True)
    with pytest.raises(TypeError, match="relative_bias must be a bool"):
        nt.TransformerConfig(**base, relative_bias="yes")
    config = nt.TransformerConfig(**base | {"n_decoder_layers": 1}, positional="learned", positions_after_pad=True)
    for make in (nt.TransformerLM, nt.Transformer, tt.TransformerLM, tt.Transformer):
        with pytest.raises(ValueError, match="positions_after_pad .* is an EncoderModel's"):
            make(config)


# ----------------------------------------------------------------------------------------------
# MPNet's bias at long distances.


@pytest.mark.parametrize("side", SIDES)
def test_mpnet_long_inputs_reach_the_logarithmic_buckets(side, tmp_path):
    """30 tokens (distances up to 29: the 16 buckets of each direction are exact below 8, logarithmic beyond), a
    padded row: hidden states and every gradient, the bias table's included, equal transformers' in float64."""
    H.build_tiny("mpnet", tmp_path, max_position_embeddings=40)
    theirs_model = H.CLASSES["mpnet"].from_pretrained(tmp_path, dtype=torch.float64).eval()
    buckets = theirs_model.encoder.relative_position_bucket(torch.arange(30)[None, :] - torch.arange(30)[:, None])
    assert len(buckets.unique()) > 20  # far more than the 2 * 8 exact ones
    ours_model = load(side, tmp_path)
    ids = np.random.default_rng(4).integers(3, 40, size=(2, 30))
    ids[1, 20:] = 1
    upstream = np.random.default_rng(5).standard_normal((*ids.shape, 16))
    theirs_out, theirs = H.run_transformers(theirs_model, "mpnet", ids, None, upstream)
    ours_out, ours = (H.run_numpy if side == "numpy" else H.run_torch)(ours_model, "mpnet", ids, None, upstream)
    result = H.pair(ours_out, theirs_out, ours, theirs, "hidden")
    assert not C.failures(result, np.float64), C.failures(result, np.float64)
    assert np.any(ours["encoder.relative_attention_bias.weight"][8:16]), "no gradient reached the far buckets"


# ----------------------------------------------------------------------------------------------
# The head classes' checkpoints, and what each family refuses.

HEADS = [
    ("roberta", transformers.RobertaForMaskedLM, "lm_head.dense.weight"),
    ("xlm-roberta", transformers.XLMRobertaForSequenceClassification, "classifier.out_proj.weight"),
    ("distilbert", transformers.DistilBertForMaskedLM, "vocab_projector.weight"),
    ("distilbert", transformers.DistilBertForSequenceClassification, "pre_classifier.weight"),
    ("mpnet", transformers.MPNetForMaskedLM, "lm_head.decoder.weight"),
]


@pytest.mark.parametrize(("family", "head_class", "head_tensor"), HEADS, ids=[h[1].__name__ for h in HEADS])
def test_a_head_class_checkpoint_loads_its_base_model(family, head_class, head_tensor, tmp_path):
    """A checkpoint of a head class (its base model under "roberta." / "distilbert.", its head beside it) loads as
    the EncoderModel of its base model: the hidden states of the base model, within 1e-12 in float64."""
    torch.manual_seed(0)
    model = head_class(H.tiny_config(family)).eval()
    model.save_pretrained(tmp_path)
    assert head_tensor in model.state_dict()
    ours = np_hf.load(tmp_path, dtype=np.float64)
    ids, types = H.make_inputs(family)
    base = getattr(model, model.base_model_prefix).double()
    theirs = C.to_numpy(H.transformers_forward(base, family, ids, types).detach())
    assert np.abs(ours.eval().forward(ids, types) - theirs).max() < 1e-12


REFUSED = [
    ("distilbert", {"sinusoidal_pos_embds": True}, "sinusoidal_pos_embds=True is not supported"),
    ("distilbert", {"dim": 16.0}, "dim=16.0"),
    ("roberta", {"pad_token_id": None}, r"positions_after_pad .* pad_id=None"),
    ("roberta", {"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key' is not supported"),
    ("xlm-roberta", {"pad_token_id": 17, "max_position_embeddings": 18}, r"pad_id=17 \(needs a token id below max_len"),
    ("mpnet", {"pad_token_id": 0}, r"pad_token_id=0 is not supported \(supported: 1\)"),
    ("mpnet", {"relative_attention_num_buckets": 16}, "relative_attention_num_buckets=16 is not supported"),
]


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(("family", "fields", "message"), REFUSED, ids=[f"{f} {'+'.join(x)}" for f, x, _ in REFUSED])
def test_a_config_json_the_family_cannot_express_is_refused(family, fields, message, side, tmp_path):
    H.build_tiny(family, tmp_path)
    HF[side].load(tmp_path)  # intact, it loads
    path = tmp_path / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))
    with pytest.raises(ValueError, match=message):
        HF[side].load(tmp_path)


def test_distilbert_writes_only_its_fixed_eps_and_no_token_types(tmp_path):
    """DistilBERT's LayerNorm eps is 1e-12 in its code (config.json cannot say another), and it has no token types:
    a model with either is refused by name rather than written as a checkpoint that loads differently."""
    model = H.native_model("distilbert", "numpy")
    other_eps = nt.EncoderModel(dataclasses.replace(model.config, layer_norm_eps=1e-5))
    other_eps.hf_model_type = "distilbert"
    with pytest.raises(ValueError, match=r"'distilbert' checkpoint: layer_norm_eps=1e-05 \(needs 1e-12"):
        np_hf.save(other_eps, tmp_path / "eps")
    typed = nt.EncoderModel(dataclasses.replace(model.config, type_vocab_size=2))
    typed.hf_model_type = "distilbert"
    with pytest.raises(ValueError, match=r"type_vocab_size=2 \(needs 0\)"):
        np_hf.save(typed, tmp_path / "types")


@pytest.mark.parametrize("side", SIDES)
def test_distilbert_loads_its_dropout_rates_and_saves_them_back(side, tmp_path):
    """dropout -> the embedding and residual sites, attention_dropout -> attention; written back unchanged."""
    H.build_tiny("distilbert", tmp_path / "in", dropout=0.1, attention_dropout=0.2)
    model = HF[side].load(tmp_path / "in")
    assert model.config.dropout_rates == {"embedding": 0.1, "attention": 0.2, "activation": 0.0, "residual": 0.1}
    HF[side].save(model, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (written["dropout"], written["attention_dropout"], written["model_type"]) == (0.1, 0.2, "distilbert")
