"""Sentence embeddings as sentence-transformers computes them, in PyTorch: numpy_transformer.sentence's model with
torch's own ops (masked sums, gather, nn.Linear, F.normalize) and autograd for the backward pass.

    from torch_transformer import sentence
    model = sentence.load("all-MiniLM-L6-v2/", dtype=torch.float32, device="cuda")
    embeddings = model.encode(["A cat sat.", "Hello!"])          # (N, D) tensor on the model's device
    batch = model.tokenizer.batch(texts)
    e = model(torch.as_tensor(batch.ids), torch.as_tensor(batch.attention_mask))   # (B, D), differentiable

The folder is read by transformer_spec.sentence (shared with the NumPy side); the modules are nn.Modules named as
modules.json names them (`pipeline["2"].linear.weight` is sentence-transformers' `2.linear.weight`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_spec.sentence import DenseSpec, PoolingSpec, SentenceFolder, check_texts, length_order, read_folder

from .model import EncoderModel

ACTIVATIONS = {"identity": nn.Identity, "tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


class Pooling(nn.Module):
    """Token embeddings (B, T, D) and the attention mask (B, T) -> (B, len(modes) * D), the modes concatenated; see
    numpy_transformer.sentence for what each mode computes."""

    def __init__(self, modes: tuple[str, ...], include_prompt: bool = True):
        super().__init__()
        self.modes = tuple(modes)
        self.include_prompt = include_prompt

    def forward(self, hidden: Tensor, attention_mask: Tensor, prompt_length: int = 0) -> Tensor:
        B, T, _ = hidden.shape
        real = attention_mask.bool()  # (B, T)
        first = real.int().argmax(dim=1)  # (B,): the first real token (left padding before it)
        positions = torch.arange(T, device=hidden.device)
        pooled = real
        if prompt_length and not self.include_prompt:
            pooled = real & (positions[None, :] >= (first + prompt_length)[:, None])
        keep = pooled.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        rows = torch.arange(B, device=hidden.device)
        outs = []
        for mode in self.modes:
            if mode in ("mean", "mean_sqrt_len_tokens"):
                count = keep.sum(dim=1).clamp(min=1e-9)  # (B, 1)
                outs.append((hidden * keep).sum(dim=1) / (count if mode == "mean" else count.sqrt()))
            elif mode == "weightedmean":
                w = keep * (positions[None, :] + 1 - first[:, None]).to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
                outs.append((hidden * w).sum(dim=1) / w.sum(dim=1).clamp(min=1e-9))
            elif mode == "cls":
                outs.append(hidden[rows, pooled.int().argmax(dim=1)])  # the first pooled position
            elif mode == "lasttoken":
                last = T - 1 - pooled.flip(1).int().argmax(dim=1)  # (B,)
                outs.append(hidden[rows, last] * keep[rows, last])
            else:  # max
                outs.append(hidden.masked_fill(~pooled.unsqueeze(-1), float("-inf")).max(dim=1).values)
        return torch.cat(outs, dim=-1)


class Dense(nn.Module):
    """sentence-transformers' Dense: act(linear(x)), plus x (or residual(x)) with use_residual."""

    def __init__(self, spec: DenseSpec):
        super().__init__()
        self.linear = nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
        self.activation = ACTIVATIONS[spec.activation]()
        self.use_residual = spec.use_residual
        if spec.use_residual and spec.in_features != spec.out_features:
            self.residual = nn.Linear(spec.in_features, spec.out_features, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        y = self.activation(self.linear(x))
        if self.use_residual:
            y = y + (self.residual(x) if hasattr(self, "residual") else x)
        return y


class Normalize(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(x, p=2, dim=-1)


class SentenceModel(nn.Module):
    """`encoder` (torch_transformer's EncoderModel), then `pipeline` (Pooling, Dense, Normalize in the folder's
    order, keyed by their modules.json names); `tokenizer` the folder's."""

    def __init__(self, encoder: EncoderModel, folder: SentenceFolder):
        super().__init__()
        if not isinstance(encoder, EncoderModel):
            kind = type(encoder).__name__
            raise ValueError(f"{folder.transformer_path}: the backbone is a {kind}; sentence embeddings here read "
                             f"an encoder's hidden states (BERT, RoBERTa, MPNet, ...)")  # fmt: skip
        self.encoder = encoder
        self.folder = folder
        self.tokenizer = folder.tokenizer
        self.pipeline = nn.ModuleDict()
        for spec in folder.modules:
            if isinstance(spec, PoolingSpec):
                self.pipeline[spec.name] = Pooling(spec.modes, spec.include_prompt)
            elif isinstance(spec, DenseSpec):
                self.pipeline[spec.name] = Dense(spec)
            else:
                self.pipeline[spec.name] = Normalize()

    def forward(
        self, ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None, prompt_length: int = 0
    ) -> Tensor:
        """ids (B, T), attention_mask (B, T) -> sentence embeddings (B, D); see numpy_transformer.sentence."""
        if self.encoder.config.type_vocab_size > 0 and token_type_ids is None:
            token_type_ids = torch.zeros_like(ids)
        elif self.encoder.config.type_vocab_size == 0:
            token_type_ids = None
        x = self.encoder(ids, token_type_ids, attention_mask=attention_mask)  # (B, T, D)
        for module in self.pipeline.values():
            x = module(x, attention_mask, prompt_length) if isinstance(module, Pooling) else module(x)
        return x

    @torch.no_grad()
    def encode(self, texts, batch_size: int = 32, prompt_name: str | None = None) -> Tensor:
        """The embeddings of texts, (N, D) on the model's device, as SentenceTransformer.encode computes them (see
        numpy_transformer.sentence.SentenceModel.encode)."""
        texts = check_texts(texts)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        prompt = self.folder.resolve_prompt(prompt_name)
        self.eval()
        weight = next(self.encoder.parameters())
        out = torch.empty((len(texts), self.dimension), dtype=weight.dtype, device=weight.device)
        order = length_order(texts)
        for start in range(0, len(texts), batch_size):
            rows = order[start : start + batch_size]
            batch = self.tokenizer.batch([texts[i] for i in rows], prompt)
            tensors = [torch.as_tensor(a, device=weight.device) for a in (batch.ids, batch.attention_mask)]
            types = torch.as_tensor(batch.token_type_ids, device=weight.device)
            out[torch.as_tensor(rows, device=weight.device)] = self(*tensors, types, batch.prompt_length)
        return out

    @property
    def dimension(self) -> int:
        width = self.encoder.config.d_model
        for module in self.pipeline.values():
            if isinstance(module, Pooling):
                width *= len(module.modes)
            elif isinstance(module, Dense):
                width = module.linear.out_features
        return width


def load(folder, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> SentenceModel:
    """The sentence-transformers model in `folder`, in `dtype` on `device`, in evaluation mode; see
    numpy_transformer.sentence.load."""
    from . import hf

    spec = read_folder(folder)
    encoder = hf.load(Path(spec.transformer_path), dtype=dtype, device=device)
    model = SentenceModel(encoder, spec)
    for module_spec in spec.modules:
        if isinstance(module_spec, DenseSpec):
            state = {k: torch.from_numpy(v.copy()) for k, v in module_spec.weights.items()}
            model.pipeline[module_spec.name].load_state_dict(state)
    return model.to(dtype=dtype, device=device).eval()


__all__ = ["load", "SentenceModel", "Pooling", "Dense", "Normalize"]
