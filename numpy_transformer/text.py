"""From a prompt to text with a checkpoint's tokenizer, in plain arrays.

    from numpy_transformer import hf
    from numpy_transformer.text import generate_text, load_tokenizer
    model = hf.load("Qwen/Qwen2.5-0.5B-Instruct")             # a Hub id (needs huggingface_hub) or a folder
    tokenizer = load_tokenizer("Qwen/Qwen2.5-0.5B-Instruct")
    text = generate_text(model, tokenizer, [{"role": "user", "content": "Hi"}], max_new_tokens=40, stream=print)

The tokenizer and the chat template are transformer_spec.text's (shared with torch_transformer.text); the tokens
are numpy_transformer.decoding's, under the checkpoint's generation rules (generation_config.json), one position a
step through the KV cache.
"""

from __future__ import annotations

import numpy as np

from transformer_spec import text
from transformer_spec.text import Tokenizer, load_tokenizer

from .decoding import generate


def decode_prompt(model, ids: list[int], max_new_tokens: int, on_token, **decoding_kwargs) -> None:
    """One prompt's ids through decoding.generate with the KV cache (greedy, sampling or beam search, as the
    checkpoint's rules and decoding_kwargs say), each chosen token passed to on_token(int): as it is chosen, or, with
    beam search, the winning hypothesis's tokens once it is known."""
    prompt = np.array([ids], dtype=np.int64)  # (1, T_p)
    streamer = text.token_streamer(model, on_token, decoding_kwargs)
    out = generate(model, prompt, max_new_tokens=max_new_tokens, streamer=streamer, **decoding_kwargs)
    if streamer is None:
        text.replay(out[0, len(ids) :].tolist(), text.end_tokens(model, decoding_kwargs), on_token)


def generate_text(model, tokenizer: Tokenizer, prompt, max_new_tokens: int = 64, stream=None, **decoding_kwargs) -> str:
    """The text a TransformerLM writes after `prompt`: a str, encoded as it is, or chat messages
    ([{"role": "user", "content": ...}, ...]) rendered with the checkpoint's chat template (ValueError when it has
    none). Decoding follows the model's generation rules and stops at eos or after max_new_tokens; each new piece of
    text is passed to `stream` (print, say: `stream=lambda s: print(s, end="", flush=True)`) as it comes.
    decoding_kwargs go to the decoding function (use_cache=False, say). Returns the generated text, special tokens
    left out."""
    return text.generate_text(model, tokenizer, prompt, decode_prompt, max_new_tokens, stream, **decoding_kwargs)


__all__ = ["generate_text", "load_tokenizer", "Tokenizer"]
