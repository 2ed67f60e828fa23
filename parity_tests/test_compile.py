"""torch.compile of the three torch models: one graph per forward (no graph breaks, so no `Tensor.item()`
and no host-device synchronisation), in training and eval mode, for every model option; compiled outputs
and gradients equal eager and the NumPy reference within the conventions' float32 bar.

Graph breaks are counted with `torch._dynamo.explain` (tracing only, no code generation). Equality runs
through `backend="aot_eager"` (Dynamo's graph and AOTAutograd's forward and backward graphs, executed by
eager kernels) for every case, and through one real inductor compile (generated C++ kernels)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch._dynamo
import torch._inductor.config
from torch._dynamo.testing import CompileCounterWithBackend

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import TransformerConfig
from parity_tests.components import Result, failures, ignore_index, make_batch, make_encoder_batch, to_numpy
from torch_transformer import decoding

# torch's own inductor import calls the deprecated torch.jit.script_method: not this project's warning
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

FAMILIES = {  # name -> (NumPy class, torch class)
    "Transformer": (nt.Transformer, tt.Transformer),
    "TransformerLM": (nt.TransformerLM, tt.TransformerLM),
    "EncoderModel": (nt.EncoderModel, tt.EncoderModel),
}

BASE = dict(
    src_vocab_size=11,
    tgt_vocab_size=13,
    d_model=16,
    n_heads=4,
    d_ff=20,
    n_encoder_layers=1,
    n_decoder_layers=1,
    max_len=16,
    dropout=0.1,
)
# Every option the models have, spread over four configurations (a tiny one-layer model each).
CONFIGS = {
    # the paper: post-norm, relu, sinusoids, separate output projection with bias
    "paper": dict(),
    # Llama: RMSNorm, rotary positions, SwiGLU, grouped-query attention, no biases anywhere, pre-norm
    "llama": dict(
        norm="rms",
        positional="rope",
        activation="silu",
        gated_ffn=True,
        n_kv_heads=2,
        bias=False,
        output_bias=False,
        norm_first=True,
    ),
    # Marian: one token table for encoder, decoder and output, padding_idx, split sinusoids, output bias
    "marian": dict(
        src_vocab_size=13,
        share_embeddings=True,
        tie_embeddings=True,
        embedding_padding_idx=True,
        sinusoid_layout="split",
    ),
    # BERT: token types, learned positions, embedding layer norm, gelu
    "bert": dict(type_vocab_size=3, positional="learned", embedding_norm=True, activation="gelu_tanh"),
    # MPNet: RoBERTa's positions (counted from the ids) and T5's bucketed bias beside them
    "mpnet": dict(
        positional="learned",
        positions_after_pad=True,
        relative_bias=True,
        relative_buckets=8,
        relative_max_distance=6,
        embedding_norm=True,
        embedding_padding_idx=True,
        activation="gelu",
    ),
}
CASES = [
    ("Transformer", "paper"),
    ("Transformer", "llama"),
    ("Transformer", "marian"),
    ("TransformerLM", "paper"),
    ("TransformerLM", "llama"),
    ("EncoderModel", "bert"),
    ("EncoderModel", "llama"),
    ("EncoderModel", "mpnet"),
]
# Equality needs AOTAutograd's forward and backward graphs (seconds each): every option once, in each family.
# (The LM's "paper" decoder is the Transformer's; the encoder's "llama" case is the inductor test's.)
EQUALITY_CASES = [case for case in CASES if case not in (("TransformerLM", "paper"), ("EncoderModel", "llama"))]
MODES = ["eval", "train-given-masks", "train-random-dropout"]


def config_of(name: str) -> TransformerConfig:
    return TransformerConfig(**{**BASE, **CONFIGS[name]})


class Pair:
    """A NumPy model and a torch model from one state dict (float32), one batch with padding and fully
    masked rows, the random upstream gradient R, and the NumPy side's outputs, gradients and keep-masks."""

    def __init__(self, family: str, config_name: str, mode: str, device: str, seed: int = 0):
        self.family, self.config = family, config_of(config_name)
        rng = np.random.default_rng(seed)
        train = mode != "eval"
        np_cls, torch_cls = FAMILIES[family]
        self.np_model = np_cls(self.config, seed=seed, dtype=np.float32).train(train)
        torch.manual_seed(seed)
        self.torch_model = torch_cls(self.config).to(device).train(train)
        self.torch_model.load_state_dict({k: torch.from_numpy(v) for k, v in self.np_model.state_dict().items()})
        if family == "EncoderModel":
            ids, types = make_encoder_batch(self.config, rng, batch=3, scenario="fully_masked")
            self.np_inputs = (ids, types)
            out_shape = (*ids.shape, self.config.d_model)
        else:
            src, tgt_in, self.tgt_out = make_batch(self.config, rng, batch=3, scenario="fully_masked")
            self.np_inputs = (tgt_in,) if family == "TransformerLM" else (src, tgt_in)
            out_shape = (*tgt_in.shape, self.config.tgt_vocab_size)
        self.R = rng.standard_normal(out_shape).astype(np.float32) / out_shape[1]
        self.inputs = tuple(None if a is None else torch.from_numpy(a).to(device) for a in self.np_inputs)
        self.device = device

        out = self.np_model.forward(*self.np_inputs)
        if family == "EncoderModel":
            self.np_loss, dout = None, self.R
        else:
            self.np_loss, cache = nt.cross_entropy_forward(out, self.tgt_out, ignore_index(self.config), 0.1)
            dout = nt.cross_entropy_backward(cache) + self.R
        self.np_model.zero_grad()
        self.np_model.backward(dout)
        self.np_out, self.np_grads = out, dict(self.np_model.grads)
        self.masks = None
        if mode == "train-given-masks":
            self.masks = {k: torch.from_numpy(v).to(device) for k, v in self.np_model.dropout_masks.items()}

    def call(self, model) -> torch.Tensor:
        return model(*self.inputs, dropout_masks=self.masks)

    def run(self, model) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
        """Output, loss and every parameter gradient of `model` (the torch model or a compiled wrapper)."""
        self.torch_model.zero_grad(set_to_none=True)
        out = self.call(model)
        objective = (out * torch.from_numpy(self.R).to(self.device)).sum()
        loss = None
        if self.family != "EncoderModel":
            targets = torch.from_numpy(self.tgt_out).to(self.device)
            loss = tt.cross_entropy(out, targets, ignore_index(self.config), 0.1)
            objective = objective + loss
        objective.backward()
        grads = {name: p.grad.detach().clone() for name, p in self.torch_model.named_parameters()}
        return out.detach(), loss, grads

    def against_numpy(self, out, loss, grads) -> Result:
        result = Result(outputs={"out": (self.np_out, to_numpy(out))})
        if loss is not None:
            result.outputs["loss"] = (self.np_loss, to_numpy(loss))
        result.grads = {name: (g, to_numpy(grads[name])) for name, g in self.np_grads.items()}
        return result


def against(reference: tuple, ours: tuple) -> Result:
    """Compiled (ours) against eager (reference), as a Result of (ours, reference) pairs."""
    (out_r, loss_r, grads_r), (out, loss, grads) = reference, ours
    result = Result(outputs={"out": (to_numpy(out), to_numpy(out_r))})
    if loss is not None:
        result.outputs["loss"] = (to_numpy(loss), to_numpy(loss_r))
    result.grads = {name: (to_numpy(g), to_numpy(grads_r[name])) for name, g in grads.items()}
    return result


def graph_breaks(pair: Pair) -> tuple[int, int, list[str]]:
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(pair.torch_model)(*pair.inputs, dropout_masks=pair.masks)
    reasons = [str(b.reason).splitlines()[0] for b in explanation.break_reasons]
    return explanation.graph_count, explanation.graph_break_count, reasons


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models: one intra-op thread. (On a two-core machine shared with other jobs, a second OpenMP
    thread makes every op of this size wait, and a test many times slower.)"""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family, config_name", CASES)
def test_one_graph_no_breaks(family, config_name, mode):
    """torch._dynamo sees one graph per forward: no Tensor.item() (which would also make the host wait
    for a GPU), no data-dependent Python branch, for every option and with padding and fully masked rows."""
    pair = Pair(family, config_name, mode, "cpu")
    graphs, breaks, reasons = graph_breaks(pair)
    assert (graphs, breaks) == (1, 0), reasons


@pytest.mark.parametrize("family, config_name", [("Transformer", "llama"), ("EncoderModel", "bert")])
def test_one_graph_under_a_default_device(family, config_name):
    """torch.set_default_device installs a mode that Dynamo traces every op through; Python-level Tensor
    methods (Tensor.unflatten) break the graph there, so the models use none: still one graph."""
    pair = Pair(family, config_name, "train-given-masks", "cpu")
    torch.set_default_device("cpu")
    try:
        graphs, breaks, reasons = graph_breaks(pair)
    finally:
        torch.set_default_device(None)
    assert (graphs, breaks) == (1, 0), reasons


@pytest.mark.parametrize("mode", ["eval", "train-given-masks"])
@pytest.mark.parametrize("family, config_name", EQUALITY_CASES)
def test_compiled_equals_eager_and_numpy(family, config_name, mode, device):
    """fullgraph=True compiles (it raises at any graph break); the compiled model's outputs and every gradient
    equal eager's and NumPy's within the float32 bar. Eval runs the fused scaled_dot_product_attention (with
    the fully masked rows zeroed after it), training with given keep-masks the explicit softmax."""
    pair = Pair(family, config_name, mode, device)
    torch._dynamo.reset()
    compiled = torch.compile(pair.torch_model, fullgraph=True, backend="aot_eager")
    out, loss, grads = pair.run(compiled)
    eager = pair.run(pair.torch_model)
    assert all(g.abs().max() > 0 for g in grads.values()), "zero gradients compare nothing"
    assert not failures(against(eager, (out, loss, grads)), np.float32)
    assert not failures(pair.against_numpy(out, loss, grads), np.float32)


@pytest.mark.parametrize(
    "family, config_name", [("Transformer", "marian"), ("TransformerLM", "llama"), ("EncoderModel", "bert")]
)
def test_compiled_random_dropout(family, config_name, device):
    """Training mode without keep-masks: the compiled graph draws its own dropout units (so the values are
    not eager's); it acts (training output != eval output), and every gradient is finite and non-zero."""
    pair = Pair(family, config_name, "train-random-dropout", device)
    torch._dynamo.reset()
    compiled = torch.compile(pair.torch_model, fullgraph=True, backend="aot_eager")
    out, _, grads = pair.run(compiled)
    assert all(torch.isfinite(g).all() and g.abs().max() > 0 for g in grads.values())
    with torch.no_grad():
        evaluated = compiled.eval()(*pair.inputs)
    assert torch.isfinite(out).all() and not torch.allclose(out, evaluated)


@pytest.mark.slow  # inductor compiles for about 25 s; the default run keeps the eager-backend comparisons
def test_inductor_compiled_equals_eager_and_numpy(device):
    """The one real code generation (inductor: C++ on the CPU, Triton on CUDA), forward and backward, on the
    case with the most to go wrong: padding and a fully masked row, grouped-query attention, rotary positions,
    RMSNorm, SwiGLU, no biases. Tens of seconds on a small CPU, most of it compiling C++."""
    pair = Pair("EncoderModel", "llama", "eval", device)
    torch._dynamo.reset()
    with torch._inductor.config.patch(compile_threads=1):  # no worker pool to start for a handful of kernels
        compiled = torch.compile(pair.torch_model, fullgraph=True)
        out, loss, grads = pair.run(compiled)
    eager = pair.run(pair.torch_model)
    assert not failures(against(eager, (out, loss, grads)), np.float32)
    assert not failures(pair.against_numpy(out, loss, grads), np.float32)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "family, config_name", [("Transformer", "paper"), ("TransformerLM", "llama"), ("EncoderModel", "bert")]
)
def test_no_value_is_read_on_the_host(family, config_name, mode):
    """Forward and backward on the "meta" device, where tensors have shapes and no values: any read of a
    value on the host (item(), bool(t), tolist(), an input check of the ids) raises. What passes here
    cannot make the host wait for a GPU."""
    pair = Pair(family, config_name, mode, "cpu")
    model = pair.torch_model.to("meta")
    inputs = [None if x is None else x.to("meta") for x in pair.inputs]
    masks = None if pair.masks is None else {k: v.to("meta") for k, v in pair.masks.items()}
    out = model(*inputs, dropout_masks=masks)
    objective = (out * torch.randn(out.shape, device="meta")).sum()
    if family != "EncoderModel":
        objective = objective + tt.cross_entropy(out, torch.from_numpy(pair.tgt_out).to("meta"), 0, 0.1)
    objective.backward()
    assert out.device.type == "meta" and all(p.grad is not None for p in model.parameters())
    with pytest.raises(RuntimeError):  # the premise: a value read on meta fails
        out.sum().item()


CUDA_ONLY = [
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available"))
]


@pytest.mark.parametrize("device", CUDA_ONLY)
@pytest.mark.parametrize("mode", MODES)
def test_no_synchronisation_in_forward_on_cuda(mode, device):
    """On CUDA, torch's sync debug mode turns any host-device synchronisation into an error. (A CPU has no
    such synchronisation; the meta-device test above stands in for this one there.)"""
    for family, config_name in [("Transformer", "paper"), ("TransformerLM", "llama"), ("EncoderModel", "bert")]:
        pair = Pair(family, config_name, mode, device)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = pair.call(pair.torch_model)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert torch.isfinite(out).all()


def test_value_checks_are_check_inputs():
    """forward checks ids' values in eager mode on the CPU only; check_inputs always does, with the same errors
    (under torch.compile, and on an accelerator, forward checks types and shapes alone)."""
    config = config_of("bert")
    model = tt.EncoderModel(config)
    ids = torch.full((2, 4), 3)
    cases = [
        ((ids.clone().fill_(config.src_vocab_size),), "ids must hold token ids in [0, 11)"),
        ((ids, torch.full((2, 4), 3)), "token_type_ids must hold token ids in [0, 3)"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            model(*args)
        with pytest.raises(ValueError, match=re.escape(message)):
            model.check_inputs(*args)
    for lm, model in ((False, tt.Transformer(config)), (True, tt.TransformerLM(config))):
        bad = torch.full((2, 4), -1)
        args = (bad,) if lm else (ids, bad)
        with pytest.raises(ValueError, match="ids must hold token ids"):
            model.check_inputs(*args)
    # Compiled, the type and shape checks still raise their ValueError. (With fullgraph=True Dynamo reports
    # any exception raised inside the graph as torch._dynamo.exc.Unsupported, "Observed exception".)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager")
    with pytest.raises(ValueError, match=r"ids has length T=17, longer than config.max_len=16"):
        compiled(torch.full((1, config.max_len + 1), 3))


@pytest.mark.parametrize(
    "family, config_name",
    [pytest.param("Transformer", "paper", marks=pytest.mark.slow), ("TransformerLM", "llama")],
)
def test_decoding_with_the_cache_compiles(family, config_name, monkeypatch):
    """The cached decoding step is one graph (explain), and greedy and beam search through the compiled step
    (fullgraph, dynamic shapes, AOTAutograd) give eager's tokens, from a few graphs per search (the step at
    position 0, the later steps, again when the number of rows changes), not one per step: 12 steps here."""
    pair = Pair(family, config_name, "eval", "cpu")
    model = pair.torch_model.eval()
    prompt = pair.inputs[0]
    with torch.no_grad():
        cache = decoding.new_cache(model, prompt if family == "Transformer" else None, len(prompt), 8)
        first = torch.full((len(prompt), 1), config_of(config_name).bos_id) if family == "Transformer" else prompt
        torch._dynamo.reset()
        explanation = torch._dynamo.explain(decoding.decoder_step)(model, cache, first)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    counter = CompileCounterWithBackend("aot_eager")
    step = torch.compile(decoding.decoder_step, fullgraph=True, dynamic=True, backend=counter)
    monkeypatch.setattr(decoding, "_compiled_step", step)
    torch._dynamo.reset()
    assert torch.equal(
        tt.generate(model, prompt, max_new_tokens=6, compiled=True), tt.generate(model, prompt, max_new_tokens=6)
    )
    if family == "Transformer":  # (the LM's beam search runs the same step)
        assert torch.equal(
            tt.generate(model, prompt, num_beams=3, max_new_tokens=6, compiled=True),
            tt.generate(model, prompt, num_beams=3, max_new_tokens=6),
        )
    assert counter.frame_count <= 6
    with pytest.raises(ValueError, match="use_cache=True"):
        tt.generate(model, prompt, max_new_tokens=6, use_cache=False, compiled=True)
