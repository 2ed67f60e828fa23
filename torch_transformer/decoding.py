"""Greedy search and beam search for `Transformer` and `TransformerLM`, with a key/value cache.

    tokens = greedy_decode(model, src_ids, max_len=20)                 # (B, 1 + steps), bos first
    tokens = beam_search(model, src_ids, beam_size=4, max_len=20)      # (B, 1 + steps)

The same functions, arguments and rules as `numpy_transformer.decoding` (see its docstring and the
beam-search notes below), written with PyTorch's own ops. `src_ids` is the source (B, S) or, for the LM,
the prompt (B, T_p); the result is a long tensor on src_ids' device.

The cache (use_cache=True) lives in attention, as transformers' past_key_values does: a step is the model's own
decoder on the new positions, and each self-attention writes their keys and values into its KVCache's
preallocated (N, H_kv, T_max, Dh) buffers and attends over everything written so far, at the positions the
score rules read (causal, a sliding window, ALiBi, T5's bias). Cross-attention keys and values are projected once,
at the first step, into a MemoryCache. use_cache=False calls model(...) on the whole prefix at every step.

compiled=True runs each cached step through `torch.compile(decoder_step, dynamic=True)`: the step is one
graph (no breaks, no host-device synchronisation), and with dynamic shapes a search needs a few of them
(the step at position 0, the later steps, one more when the number of rows changes), not one per step.
The search loop around it stays Python: greedy search reads `done.all()` once per step to stop early and
beam search ranks hypotheses on the host, both on purpose (a host decision per generated token is what
ends the loop).

Shape letters: B batch, K beam size, N rows decoded side by side (B or B*K), S source length, T_p prompt
length (1 for the Transformer), T_new positions in one step, T_max positions cached, D, H, Dh, V.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import KVCache, MemoryCache
from .model import Transformer, TransformerLM, check_attention_mask, check_ids
from .model import source_mask as model_source_mask

# ----------------------------------------------------------------------------------------------
# The cache: per decoder layer a KVCache (self-attention) and a MemoryCache (cross-attention), which attention
# itself reads and extends; a step is the decoder's forward on the new positions.


@dataclass
class DecoderCache:
    layers: list  # per decoder layer: (KVCache, MemoryCache or None)
    memory: Tensor | None  # (N, S, D) the encoder's output, one copy per row; None in the LM
    memory_mask: Tensor | None  # (N, 1, 1, S) source padding, True = may attend; None in the LM or without pad_id
    length: int = 0  # positions cached so far


def new_cache(model: nn.Module, src_ids: Tensor | None, n_rows: int, total_len: int, src_mask=None) -> DecoderCache:
    """An empty cache of n_rows rows and total_len positions; for a Transformer, source b serves rows
    b * K .. b * K + K - 1 (K = n_rows // B), and the encoder runs here (src_mask (B, S): the real source tokens,
    or None: those not holding pad_id). It holds the config's K/V heads (n_kv_heads), not one per query head."""
    c = model.config
    weight = model.decoder.token_embedding.weight
    memory, memory_mask = None, None
    if src_ids is not None:
        copies = n_rows // src_ids.shape[0]
        memory = model.encode(src_ids, attention_mask=src_mask).repeat_interleave(copies, dim=0)  # (N, S, D)
        source_mask = model_source_mask(src_ids, src_mask, c.pad_id)  # (B, 1, 1, S), or None: nothing masked
        if source_mask is not None:
            memory_mask = source_mask.repeat_interleave(copies, dim=0)  # (N, 1, 1, S)
    layers = [
        (
            KVCache(n_rows, c.kv_heads, total_len, c.d_head, weight, c.layer_window(i)),  # the layer's window
            None if memory is None else MemoryCache(),
        )
        for i in range(len(model.decoder.layers))
    ]
    return DecoderCache(layers, memory, memory_mask)


def decoder_step(
    model: nn.Module, cache: DecoderCache, new_ids: Tensor, attention_mask: Tensor | None = None
) -> Tensor:
    """new_ids (N, T_new) at positions cache.length .. -> logits of the last one, (N, V); extends the cache.
    attention_mask (N, cache.length + T_new): the real tokens of a left-padded prompt and after, or None."""
    x = model.decoder(
        new_ids, cache.memory, cache.memory_mask, caches=cache.layers, start=cache.length, attention_mask=attention_mask
    )
    cache.length += new_ids.shape[1]
    return model.output_logits(x[:, -1])  # (N, V): only the last position predicts


def reorder_cache(cache: DecoderCache, rows: Tensor) -> None:
    """Row n continues row rows[n]'s hypothesis. Cross-attention caches stay: rows[n] is a beam of the same source."""
    for self_cache, _ in cache.layers:
        self_cache.reorder(rows)


_compiled_step = None


def compiled_decoder_step():
    """`decoder_step` under torch.compile with dynamic shapes, built once per process. Not fullgraph: after
    torch._dynamo's recompile limit (many different models in one process) it falls back to eager instead
    of failing; parity_tests/test_compile.py checks with fullgraph=True that the step is one graph."""
    global _compiled_step
    if _compiled_step is None:
        _compiled_step = torch.compile(decoder_step, dynamic=True)
    return _compiled_step


class Incremental:
    """use_cache=True: each step runs only the positions not yet cached (compiled: see `compiled_decoder_step`)."""

    def __init__(
        self, model: nn.Module, src_ids, n_rows: int, total_len: int, compiled: bool = False, mask=None, src_mask=None
    ):
        self.model = model
        self.cache = new_cache(model, src_ids, n_rows, total_len, src_mask)
        self.step = compiled_decoder_step() if compiled else decoder_step
        self.mask = mask  # (N, T_max) the real tokens, or None

    def next_logits(self, tokens: Tensor) -> Tensor:
        """tokens (N, T), the whole prefix -> logits (N, V) of the next token."""
        new = tokens[:, self.cache.length :]
        if self.mask is None:
            return self.step(self.model, self.cache, new)
        return self.step(self.model, self.cache, new, self.mask[:, : tokens.shape[1]])

    def reorder(self, rows: Tensor) -> None:
        reorder_cache(self.cache, rows)


class Recompute:
    """use_cache=False: the model's forward on the whole prefix, last position."""

    def __init__(self, model: nn.Module, src_ids: Tensor | None, copies: int, mask=None, src_mask=None):
        self.model = model
        self.src_ids = None if src_ids is None else src_ids.repeat_interleave(copies, dim=0)  # (N, S)
        self.src_mask = None if src_mask is None else src_mask.repeat_interleave(copies, dim=0)  # (N, S) or None
        self.mask = mask  # (N, T_max) the real tokens, or None

    def next_logits(self, tokens: Tensor) -> Tensor:
        if self.src_ids is None:
            mask = None if self.mask is None else self.mask[:, : tokens.shape[1]]
            logits = self.model(tokens, attention_mask=mask)
        else:
            logits = self.model(self.src_ids, tokens, attention_mask=self.src_mask)
        return logits[:, -1]  # (N, V)

    def reorder(self, rows: Tensor) -> None:
        pass  # the caller reorders the prefix; the beams of one source share src_ids


def _start(
    model: nn.Module, src_ids: Tensor, max_len: int | None, copies: int, use_cache: bool, compiled: bool, mask=None
):
    """Check the arguments; the prompt (B, T_p), max_len and the source of next-token logits for B * copies rows.
    mask: a left-padded prompt's real tokens (B, T_p) (the LM's; every generated token is real, and the beams of
    one prompt share its mask, so reordering them leaves it as it is), or a Transformer's source's (B, S), or None."""
    src_ids, prompt, max_len = check_decoding_inputs(model, src_ids, max_len)
    src_mask = None
    if mask is not None and isinstance(model, Transformer):
        src_mask, mask = check_attention_mask(mask, src_ids), None
    elif mask is not None:
        full = torch.ones(prompt.shape[0] * copies, prompt.shape[1] + max_len, dtype=torch.bool, device=prompt.device)
        full[:, : prompt.shape[1]] = check_attention_mask(mask, prompt).repeat_interleave(copies, dim=0)
        mask = full  # (N, T_max)
    if compiled and not use_cache:
        raise ValueError(
            "compiled=True compiles the cached decoding step: it needs use_cache=True "
            "(without the cache, torch.compile the model itself)"
        )
    if use_cache:
        rows, total = prompt.shape[0] * copies, prompt.shape[1] + max_len
        return prompt, max_len, Incremental(model, src_ids, rows, total, compiled, mask, src_mask)
    return prompt, max_len, Recompute(model, src_ids, copies, mask, src_mask)


def _without_pad(scores: Tensor, pad_id: int | None) -> Tensor:
    """scores (N, V) with pad_id at -inf: a model of our own never generates pad (in the output it means "after
    eos"). Unchanged when there is no pad_id."""
    if pad_id is None:
        return scores
    return scores.index_fill(-1, torch.tensor([pad_id], device=scores.device), float("-inf"))


def _allowed_scores(scores: Tensor, model: nn.Module, tokens: Tensor, last_step: bool) -> Tensor:
    """scores (N, V) with what may not come next at -inf. A model of our own: pad never. A checkpoint's model: its
    GenerationRules (read from its generation_config.json by hf.load) and nothing else, as transformers' logits
    processors apply them: the last token of each bad-words sequence in the rows ending with the rest of it;
    forced_bos_id at position 1 and forced_eos_id at the last step (every other token -inf, the forced one 0).
    tokens (N, t): the rows so far. ValueError when a row is left no token."""
    rules = model.generation_rules
    if rules is None:
        scores = _without_pad(scores, model.config.pad_id)
        _check_something_allowed(scores, tokens.shape[1])
        return scores
    for words in rules.bad_words:
        *prefix, last = words
        if len(prefix) > tokens.shape[1]:
            continue
        ends_with = torch.ones(scores.shape[0], dtype=torch.bool, device=scores.device)
        if prefix:
            ends_with = (tokens[:, tokens.shape[1] - len(prefix) :] == tokens.new_tensor(prefix)).all(dim=1)
        scores = scores.clone()
        scores[ends_with, last] = float("-inf")
    forced = rules.forced_bos_id if tokens.shape[1] == 1 else None
    forced = rules.forced_eos_id if last_step and rules.forced_eos_id is not None else forced
    if forced is not None:
        scores = torch.full_like(scores, float("-inf"))
        scores[:, forced] = 0.0
    _check_something_allowed(scores, tokens.shape[1])
    return scores


def _check_something_allowed(scores: Tensor, position: int) -> None:
    """ValueError when the rules leave a row (N, V) no token: argmax would pick a banned one, a beam nothing."""
    empty = torch.isneginf(scores).all(dim=-1)  # (N,)
    if bool(empty.any()):
        raise ValueError(
            f"decoding: every token is banned at position {position} for rows "
            f"{torch.nonzero(empty).flatten().tolist()} (pad_id and the checkpoint's bad_words_ids cover the whole "
            "vocabulary): nothing may be generated"
        )


def _after_eos(model: nn.Module) -> int:
    """The id that fills a row after its eos_id in greedy search: the checkpoint's (generate()'s pad_token_id, else
    its first eos_token_id), or for a model of our own _default_fill."""
    rules = model.generation_rules
    if rules is not None and rules.fill_id is not None:
        return rules.fill_id
    return _default_fill(model.config)


def _beam_fill(model: nn.Module) -> int:
    """What pads a finished hypothesis shorter than the best in beam search: the checkpoint's (generate()'s
    `pad_token_id or eos_token_id`), or for a model of our own _default_fill."""
    rules = model.generation_rules
    if rules is not None and rules.beam_fill_id is not None:
        return rules.beam_fill_id
    return _default_fill(model.config)


def _default_fill(c) -> int:
    """pad_id, or the (first) eos_id itself when there is no padding token."""
    if c.pad_id is not None:
        return c.pad_id
    return c.eos_ids[0] if c.eos_ids else 0  # without an eos_id no row ends early: the fill is never seen


def _is_eos(tokens: Tensor, c) -> Tensor:
    """Which tokens end a sequence: any of config.eos_ids; none when the vocabulary has no eos."""
    return torch.isin(tokens, tokens.new_tensor(c.eos_ids, dtype=torch.long))


# ----------------------------------------------------------------------------------------------
# Greedy search.


def greedy_decode(
    model: nn.Module,
    src_ids: Tensor,
    max_len: int,
    use_cache: bool = True,
    compiled: bool = False,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """The most likely token at every step (lowest id among equals; never pad_id in a model of our own, what the
    checkpoint's rules allow in a loaded one: see numpy_transformer.decoding).

    Returns long ids (B, T_p + steps): bos_id (Transformer) or the prompt (LM), then the generated
    tokens, pad_id after a row's eos_id (a loaded checkpoint: generate()'s fill); stops once every row has
    produced eos_id. compiled: run the cached step through torch.compile (see the module docstring).
    attention_mask, 1/True = a real token, as transformers' generate() takes it: a TransformerLM's (B, T_p) for a
    left-padded prompt, a Transformer's (B, S) for its source (instead of the tokens not holding pad_id).
    """
    return greedy_search(model, src_ids, max_len, use_cache, compiled, attention_mask)[0]


def greedy_search(
    model: nn.Module, src_ids: Tensor, max_len: int, use_cache: bool = True, compiled: bool = False, attention_mask=None
):
    """greedy_decode, and the logits it chose from, (B, steps, V)."""
    check_model(model)
    with evaluating(model):
        prompt, max_len, decoder = _start(model, src_ids, max_len, 1, use_cache, compiled, attention_mask)
        c = model.config
        B, T_p = prompt.shape
        tokens = prompt.new_full((B, T_p + max_len), _after_eos(model))
        tokens[:, :T_p] = prompt
        done = torch.zeros(B, dtype=torch.bool, device=prompt.device)
        step_logits = []
        for t in range(T_p, T_p + max_len):
            logits = decoder.next_logits(tokens[:, :t])  # (B, V)
            step_logits.append(logits)
            choice = _allowed_scores(logits, model, tokens[:, :t], t == T_p + max_len - 1).argmax(dim=-1)  # (B,)
            tokens[:, t] = choice.masked_fill(done, _after_eos(model))
            done |= _is_eos(tokens[:, t], c)
            if bool(done.all()):
                break
    return tokens[:, : t + 1], torch.stack(step_logits, dim=1)


# ----------------------------------------------------------------------------------------------
# Beam search: the rules of numpy_transformer.decoding (those of transformers' generate), restated.
#   score of a continuation = cumulative log-prob + log_softmax(logits)[token], banned tokens at -inf;
#   per element, rank the K * V continuations by (-score, beam, token) (stable sort, flat index
#   beam * V + token) and keep the (1 + n_eos) K best (2K at least); eos within the first K ranks finishes
#   a hypothesis with score / (generated tokens incl. eos) ** length_penalty (at max_len, all of the first K
#   ranks finish); the first K non-eos ones stay live. An element stops taking finished hypotheses once it has K
#   (early_stopping True), or once it has K and its best live one, scored at its current length (at
#   max_len for "never" with length_penalty > 0), cannot beat the worst of its best K (False). Best
#   score wins, the earliest found among equals.


def beam_search(
    model: nn.Module,
    src_ids: Tensor,
    beam_size: int = 4,
    max_len: int | None = None,
    length_penalty: float = 1.0,
    use_cache: bool = True,
    compiled: bool = False,
    early_stopping: bool | str = False,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """The best of beam_size hypotheses kept at every step. Long ids (B, T_p + L) as greedy_decode, L the
    longest best hypothesis; max_len None: as many as config.max_len allows; compiled and attention_mask as in
    greedy_decode; early_stopping True, False or "never", as transformers' generate."""
    return beam_search_scores(
        model, src_ids, beam_size, max_len, length_penalty, use_cache, compiled, early_stopping, attention_mask
    )[0]


def beam_search_scores(
    model, src_ids, beam_size=4, max_len=None, length_penalty=1.0, use_cache=True, compiled=False, early_stopping=False,
    attention_mask=None,
):  # fmt: skip
    """beam_search, and each element's best normalised score (a list of B floats)."""
    _check_int("beam_size", beam_size)
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)):
        raise TypeError(f"length_penalty must be a float, got {type(length_penalty).__name__} ({length_penalty!r})")
    if not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty must be finite, got {length_penalty}")
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never' (as in transformers), got {early_stopping!r}")
    check_model(model)
    with evaluating(model):
        K = beam_size
        prompt, max_len, decoder = _start(model, src_ids, max_len, K, use_cache, compiled, attention_mask)
        c = model.config
        B, T_p = prompt.shape
        device = prompt.device
        tokens = prompt.new_full((B * K, T_p + max_len), _beam_fill(model))
        tokens[:, :T_p] = prompt.repeat_interleave(K, dim=0)
        cumulative = torch.full((B, K), float("-inf"), dtype=model.decoder.token_embedding.weight.dtype, device=device)
        cumulative[:, 0] = 0.0  # the K beams start as one
        n_best = max(2, 1 + len(c.eos_ids)) * K  # each beam may end with every eos id: K of these are not eos
        finished: list[list] = [[] for _ in range(B)]
        stopped = [False] * B  # the element takes no more finished hypotheses
        first_row = torch.arange(B, device=device)[:, None] * K  # (B, 1)
        for step in range(max_len):
            t = T_p + step
            last = step == max_len - 1
            log_probs = F.log_softmax(decoder.next_logits(tokens[:, :t]), dim=-1)  # (N, V)
            log_probs = _allowed_scores(log_probs, model, tokens[:, :t], last)
            V = log_probs.shape[-1]
            scores = (cumulative[:, :, None] + log_probs.view(B, K, V)).view(B, K * V)
            top, index = torch.sort(scores, dim=1, descending=True, stable=True)  # ties: lower flat index
            top, index = top[:, :n_best], index[:, :n_best]  # (B, n_best)
            rows, token = first_row + index // V, index % V  # (B, n_best)
            is_eos = _is_eos(token, c)
            ends = torch.ones_like(is_eos[:, :K]) if last else is_eos[:, :K]  # the last step: the first K all end
            _collect_finished(finished, stopped, top, rows, token, ends, tokens[:, T_p:t], step + 1, length_penalty)
            if last:
                break
            live = torch.sort(is_eos.to(torch.uint8), dim=1, stable=True).indices[:, :K]  # non-eos first, (B, K)
            cumulative = top.gather(1, live)  # (B, K), best first
            parents = rows.gather(1, live).flatten()  # (N,)
            tokens = tokens[parents]
            tokens[:, t] = token.gather(1, live).flatten()
            decoder.reorder(parents)
            best_live = cumulative[:, 0].tolist()
            for b, found in enumerate(finished):
                stopped[b] = stopped[b] or _cannot_improve(
                    found, best_live[b], step + 1, max_len, length_penalty, K, early_stopping
                )
            if all(stopped):
                break
    return _best(prompt, finished, _beam_fill(model))


def _collect_finished(finished, stopped, top, rows, token, ends, generated, length, length_penalty) -> None:
    """Hypotheses that end here (`ends`, the first K ranks) join `finished`, for elements not stopped; a -inf
    score (a beam that never was, vocabulary smaller than the beam) is skipped."""
    K = ends.shape[1]
    ends = (ends & top[:, :K].isfinite()).tolist()
    top, rows, token = top.tolist(), rows.tolist(), token.tolist()
    for b, flags in enumerate(ends):
        if stopped[b]:
            continue
        for r, ended in enumerate(flags):
            if ended:
                hypothesis = generated[rows[b][r]].tolist() + [token[b][r]]
                finished[b].append((top[b][r] / length**length_penalty, hypothesis))


def _cannot_improve(found, best_live, length, max_len, length_penalty, K, early_stopping) -> bool:
    if len(found) < K:
        return False
    if early_stopping is True:
        return True
    worst_of_best = sorted(score for score, _ in found)[-K]
    at = max_len if early_stopping == "never" and length_penalty > 0 else length
    return best_live / at**length_penalty <= worst_of_best


def _best(prompt, finished, fill_id):
    B, T_p = prompt.shape
    best = [max(found, key=lambda c: c[0]) for found in finished]  # the first of equal scores
    out = prompt.new_full((B, T_p + max(len(h) for _, h in best)), fill_id)
    out[:, :T_p] = prompt
    for b, (_, hypothesis) in enumerate(best):
        out[b, T_p : T_p + len(hypothesis)] = torch.tensor(hypothesis, dtype=out.dtype)
    return out, [score for score, _ in best]


# ----------------------------------------------------------------------------------------------
# Arguments and modes.


def check_model(model) -> None:
    if not isinstance(model, (Transformer, TransformerLM)):
        raise TypeError(f"model must be a torch_transformer Transformer or TransformerLM, got {type(model).__name__}")


@contextlib.contextmanager
def evaluating(model: nn.Module):
    """Eval mode and no autograd for the duration; afterwards every submodule's own mode is restored."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        for module, mode in modes:
            module.training = mode


def check_decoding_inputs(model: nn.Module, src_ids: Tensor, max_len: int | None):
    """Validate as the model's forward does; returns src_ids (None for the LM), the prompt (B, T_p), max_len."""
    c = model.config
    if max_len is not None:
        _check_int("max_len", max_len)
    if isinstance(model, Transformer):
        check_ids("src_ids", src_ids, c.src_vocab_size, c.max_len)
        if c.bos_id is None:
            raise ValueError(
                "decoding a Transformer starts from config.bos_id (the decoder start token), which is None"
            )
        prompt = torch.full((src_ids.shape[0], 1), c.bos_id, dtype=torch.long, device=src_ids.device)  # (B, 1)
    else:
        check_ids("src_ids", src_ids, c.tgt_vocab_size, c.max_len)
        prompt = src_ids.long()  # (B, T_p): any ids, as given
        src_ids = None
    T_p = prompt.shape[1]
    if max_len is None:
        max_len = max(c.max_len - T_p, 1)
    if T_p + max_len > c.max_len:
        taken = "bos" if src_ids is not None else f"the {T_p}-token prompt"
        raise ValueError(
            f"max_len={max_len} generated tokens after {taken} need {T_p + max_len} positions, more than "
            f"config.max_len={c.max_len}: max_len must be at most {c.max_len - T_p}"
        )
    return src_ids, prompt, max_len


def _check_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
