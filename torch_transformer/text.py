"""From a prompt to text with a checkpoint's tokenizer, in PyTorch: numpy_transformer.text's generate_text with
torch_transformer's decoding (the tokenizer and chat template are transformer_spec.text's, shared).

    from torch_transformer import hf
    from torch_transformer.text import generate_text, load_tokenizer
    model = hf.load("Qwen/Qwen2.5-0.5B-Instruct", device="cuda")
    text = generate_text(model, load_tokenizer("Qwen/Qwen2.5-0.5B-Instruct"), "The capital of France is")
"""

from __future__ import annotations

import torch

from transformer_spec import text
from transformer_spec.text import Tokenizer, load_tokenizer

from .decoding import generate


def decode_prompt(model, ids: list[int], max_new_tokens: int, on_token, **decoding_kwargs) -> None:
    """One prompt's ids through decoding.generate (see numpy_transformer.text.decode_prompt)."""
    device = next(model.parameters()).device
    prompt = torch.tensor([ids], dtype=torch.long, device=device)  # (1, T_p)
    streamer = text.token_streamer(model, on_token, decoding_kwargs)
    out = generate(model, prompt, max_new_tokens=max_new_tokens, streamer=streamer, **decoding_kwargs)
    if streamer is None:
        text.replay(out[0, len(ids) :].tolist(), text.end_tokens(model, decoding_kwargs), on_token)


def generate_text(model, tokenizer: Tokenizer, prompt, max_new_tokens: int = 64, stream=None, **decoding_kwargs) -> str:
    """See numpy_transformer.text.generate_text: the same arguments and the same text, decoded by torch."""
    with torch.no_grad():
        return text.generate_text(model, tokenizer, prompt, decode_prompt, max_new_tokens, stream, **decoding_kwargs)


__all__ = ["generate_text", "load_tokenizer"]  # Tokenizer: the same class as numpy_transformer.text's, documented there
