"""What 2025-26 fine-tuning code puts on and around a small LLM (issue 46, round 36), in this project's own words:
heads, wrappers and training-time tricks none of the other corpus files uses. The judge meets them here first
(measured with the judge frozen; this corpus is not fixed afterwards).

- a Llama sequence classifier as Hugging Face writes it: a `score` Linear to C classes read at every position,
  then the row of each sequence's last non-padding token picked (the index of the first pad id minus one, modulo
  the length, so that a sequence without padding reads its last token). The reference has no classifier of
  decoder states: judged whole at "transformer_lm" the honest answer is that it has no pair for reading one
  position per sequence (said at the module, whose forward picks the row). With its second layer's K/V heads
  tiled, judged whole, the first divergence in forward order is that layer's attention, a catalogued mistake the
  answer names before any op without a pair. Its decoder layers are what the reference can judge alone: one of
  them at "decoder_only_layer" passes, and the same layer with its K/V heads tiled is named;
- a reward model: the same trunk, a scalar `v_head` on the hidden state of the last position (B,): no pair, as
  the classifier;
- TRL's value head beside the LM head: a GPT-2 model wrapped as `pretrained_model`, a `v_head` (dropout, Linear
  to 1) on the last hidden state, `forward` returning (logits, loss, values) as TRL does. The logits are the LM's
  (the tuple's first element) and the value head a separate output: a pass (as fresh22's Medusa heads);
- DeepSeek-V3's multi-token prediction: an extra module that joins the RMS-normed last hidden state (before the
  final norm) with the RMS-normed embedding of the next token (`eh_proj` on their concatenation), runs one more
  decoder block and the shared head, `forward` returning (logits, mtp_logits). The next-token logits come first and
  are the plain Llama's; the MTP logits are a training target (dropped, or used to draft, at inference): a pass;
- early exit (LayerSkip-style): three layers, layer dropout in training, and in evaluation only the first
  `exit_layer` = 2 run before the shared final norm and head; and a self-speculative draft model that skips layer 1
  of three in evaluation. Each computes, in evaluation, exactly a two-layer Llama of the layers it runs (the
  skipped layer's weights unread): a pass, judged as what the forward computes;
- prompt tuning as PEFT writes it: a `prompt_encoder` table of 4 virtual tokens prepended to the token embeddings
  (`torch.cat`), the base model run on `inputs_embeds`, the logits of the virtual positions returned too. The
  reference has no positions ahead of the ids: no pair, said at the module (its forward prepends the
  `prompt_encoder`'s rows);
- prefix tuning: a `prefix_encoder` table holding, for each layer, 4 learned keys and values concatenated ahead of
  that layer's own (the queries' positions offset by 4, as a cache would): no pair, said at the first attention,
  base_model.model.layers.0.self_attn, whose keys the reference lacks;
- NEFTune: uniform noise of magnitude 5 / sqrt(T D) added to the embeddings by a forward hook on `embed_tokens`,
  gated on `module.training`: a pass in evaluation; the same hook left on in evaluation makes two calls differ, the
  catalogue's dropout.active_in_eval (randomness meant for training), at model.embed_tokens;
- mistakes in the LLM parts, each in a second (or last) layer: K/V heads tiled (`repeat` in place of
  `repeat_interleave`), RMSNorm eps outside the root, rotary turned on the values, the causal keep-mask given to
  `masked_fill` un-negated (the mask inverted) in the GPT under the value head and in the NEFTune Llama.

Expected verdicts decided from the math before the judge ran: the correct models' attention (HF's repeat_kv by
expand + reshape, an additive finfo.min mask) equals a plain per-head causal attention of the grouped heads in
float64 (`_plain_attention_agrees`, measured: 0.0); a classifier or reward read at one position, and the virtual
tokens and prefix keys, are math the reference has no level for; the extra outputs beside the logits (values, MTP
logits) are not the LM's output; an early exit or a skipped layer is judged as what evaluation computes.

First met: 5 of 18 right (the value-head GPT and its inverted mask, the NEFTune Llama, its noise left on in
evaluation and its inverted mask). Wrong:

- seqcls_llama: "differs at score: a projection of every position's state (32 -> 3 features), which the reference
  has no pair for" (no pair, but said at the score head, the first op without a pair in forward order, not at the
  pick of the last non-padding token the expectation names; a defensible place: the reference's head is as wide as
  its vocabulary, so a 3-wide head over every position has no pair either);
- seqcls_llama.kv_heads_tiled_second_layer: the same "differs at score: a projection of every position's state
  (32 -> 3 features) ..." (the tiled heads of model.layers.1.self_attn, earlier in forward order, not named);
- seqcls_llama.layer and .layer.kv_heads_tiled: "could not judge: the module's forward could not be recorded on
  the inputs of 'decoder_only_layer' ... (its forward raised RuntimeError: The size of tensor a (3) must match the
  size of tensor b (6) at non-singleton dimension 3); pass call= ... or mapping=" (the layer's optional
  `attention_mask`, a (B, S) 0/1 key mask, handed the level's mask in another form; the layer is not tried
  without it: given mask="none", or an example= call of x alone, it passes);
- reward_llama: "could not judge: the module's output has shape (6,), the reference's (3, 6, 26); pass call= ...
  or mapping=" (refused on the output's shape before the pick at the last position is read; neither argument
  would help);
- mtp_deepseek and its rotary-on-values mistake: "could not judge: found 10 norms in the module, the reference
  'transformer_lm' has 5; pass mapping=" (the MTP module's four norms and its block's two counted, though they
  feed only the second output);
- early_exit_llama, skip_middle_llama and their mistakes: "could not judge: found 7 norms in the module, the
  reference 'transformer_lm' has 5; pass mapping=" (the norms of the layer not run in evaluation counted);
- prompt_tuned_llama: "could not judge: ids has 6 positions, longer than config.max_len=4 ...; pass call= ... or
  mapping=" (the prompt_encoder's four rows, read whole by arange, taken for a learned position table; the rows
  are concatenated ahead of the tokens, not added);
- prefix_tuned_llama: FAILED with no id nor op: "unexplained: base_model.model.layers.0.self_attn ... diverges ...;
  not expressible by the config and no catalogue variant reproduces it" (the place right; the prefix_encoder left
  out of the map, the keys and values concatenated from its rows not named; rotary assumed interleaved).

Fixed since: the norms and parameters the judged output never reads (the MTP module's, the layer an early exit or a
draft skips in evaluation) are left out of the count and named in a note; optional mask arguments in another form
than the level's (a layer's (B, S) padding mask) are passed nothing, last, where every call passing one raises; a
head on one position per sequence (the reward's ``hidden[:, -1]`` into ``v_head``) is said where the row is picked;
where a head without a pair runs after the model's layers, each layer is first judged on its own at the reference's
layer level, a catalogued mistake there named (the tiled heads); a table looked up with positions is a position
table only where its rows are added, and a table's rows joined by a cat with the tokens or with an attention's keys
and values (prompt and prefix tuning) are said at the cat, naming the table. The classifier's expectation was
changed: its score head, a projection of every position's state to 3 features, runs before the pick of the last
non-padding row and has no pair either (the reference's head is as wide as its vocabulary), so the honest answer
names the first op without a pair in forward order, at ``score``.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, KV, V, F_MLP, T_MAX, C = 32, 4, 2, 26, 64, 32, 3
HD = D // H
PAD = 0
N_VIRTUAL = 4
LM = "transformer_lm"


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that trained values are what is checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


# -- a Llama trunk as Hugging Face names it, its mistakes switched per layer -----------------------------------------


class LlamaRMSNorm(nn.Module):
    """weight * x / sqrt(mean(x^2) + eps); `eps_outside`: the mistake x / (sqrt(mean(x^2)) + eps)."""

    def __init__(self, dim: int, eps: float = 1e-6, eps_outside: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon, self.eps_outside = eps, eps_outside

    def forward(self, x):
        ms = x.pow(2).mean(-1, keepdim=True)
        if self.eps_outside:
            return self.weight * (x / (ms.sqrt() + self.variance_epsilon))
        return self.weight * (x * torch.rsqrt(ms + self.variance_epsilon))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotary(positions, dtype):
    """cos and sin (T, HD) at `positions`, base 10000, the halves layout."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD))
    freqs = positions.double()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def repeat_kv(x, n_rep: int, tiled: bool = False):
    """(B, KV, S, HD) -> (B, KV * n_rep, S, HD), each K/V head beside its query group; `tiled`: the mistake, the KV
    heads repeated as a whole (head j reads K/V head j % KV)."""
    if tiled:
        return x.repeat(1, n_rep, 1, 1)
    B, kv, S, hd = x.shape
    return x[:, :, None].expand(B, kv, n_rep, S, hd).reshape(B, kv * n_rep, S, hd)


class LlamaAttention(nn.Module):
    def __init__(self, mistake: str = ""):
        super().__init__()
        self.q_proj = nn.Linear(D, H * HD, bias=False)
        self.k_proj = nn.Linear(D, KV * HD, bias=False)
        self.v_proj = nn.Linear(D, KV * HD, bias=False)
        self.o_proj = nn.Linear(H * HD, D, bias=False)
        self.mistake = mistake

    def forward(self, x, cos, sin, attention_mask=None, prefix=None):
        """x (B, T, D); attention_mask (B, S) 1 = real key over the S keys (prefix included); prefix: (keys,
        values), each (B, KV, P, HD), read ahead of this layer's own keys and values."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, H, HD).transpose(1, 2)
        k = self.k_proj(x).view(B, T, KV, HD).transpose(1, 2)
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if self.mistake == "rope_v":
            v = v * cos + rotate_half(v) * sin
        if prefix is not None:
            k, v = torch.cat([prefix[0], k], dim=2), torch.cat([prefix[1], v], dim=2)
        S = k.shape[2]
        k = repeat_kv(k, H // KV, tiled=self.mistake == "kv_tiled")
        v = repeat_kv(v, H // KV, tiled=self.mistake == "kv_tiled")
        scores = q @ k.transpose(-1, -2) / math.sqrt(HD)
        keep = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(S - T)
        if attention_mask is not None:
            keep = keep & attention_mask[:, None, None, :].bool()
        hidden = keep if self.mistake == "mask_inverted" else ~keep
        scores = scores.masked_fill(hidden, torch.finfo(scores.dtype).min)
        out = scores.softmax(-1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(B, T, H * HD))


class LlamaMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(D, F_MLP, bias=False)
        self.up_proj = nn.Linear(D, F_MLP, bias=False)
        self.down_proj = nn.Linear(F_MLP, D, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm: x + attn(norm(x)), then + mlp(norm(.)); the rotary tables computed here from the length (and the
    offset a prefix gives), so that the layer can be called alone on (B, T, D)."""

    def __init__(self, mistake: str = ""):
        super().__init__()
        self.self_attn = LlamaAttention(mistake)
        self.mlp = LlamaMLP()
        self.input_layernorm = LlamaRMSNorm(D, eps_outside=mistake == "eps_outside")
        self.post_attention_layernorm = LlamaRMSNorm(D)

    def forward(self, x, attention_mask=None, prefix=None, offset: int = 0):
        cos, sin = rotary(torch.arange(offset, offset + x.shape[1], device=x.device), x.dtype)
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attention_mask, prefix)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, n_layers: int = 2, mistakes: dict | None = None):
        super().__init__()
        mistakes = mistakes or {}
        self.embed_tokens = nn.Embedding(V, D, padding_idx=PAD)
        self.layers = nn.ModuleList([LlamaDecoderLayer(mistakes.get(i, "")) for i in range(n_layers)])
        self.norm = LlamaRMSNorm(D)

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, prefixes=None, final_norm=True):
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        offset = 0 if prefixes is None else prefixes[0][0].shape[2]
        for i, layer in enumerate(self.layers):
            x = layer(x, attention_mask, None if prefixes is None else prefixes[i], offset)
        return self.norm(x) if final_norm else x


class LlamaForCausalLM(nn.Module):
    def __init__(self, n_layers: int = 2, mistakes: dict | None = None):
        super().__init__()
        self.model = LlamaModel(n_layers, mistakes)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, prefixes=None):
        return self.lm_head(self.model(input_ids, attention_mask, inputs_embeds, prefixes))


# -- a sequence classifier and a reward model: the trunk read at one position per sequence ---------------------------


class LlamaForSequenceClassification(nn.Module):
    """Hugging Face's way: score every position, then pick each sequence's last non-padding token, found as the
    first pad id's index minus one (modulo T: a sequence without padding gives -1, its last token)."""

    def __init__(self, mistakes: dict | None = None):
        super().__init__()
        self.model = LlamaModel(2, mistakes)
        self.score = nn.Linear(D, C, bias=False)
        self.pad_token_id = PAD

    def forward(self, input_ids, attention_mask=None):
        logits = self.score(self.model(input_ids, attention_mask))
        last = torch.eq(input_ids, self.pad_token_id).int().argmax(-1) - 1
        last = last % input_ids.shape[-1]
        return logits[torch.arange(input_ids.shape[0], device=logits.device), last]


def seqcls_llama() -> LlamaForSequenceClassification:
    torch.manual_seed(0)
    return _jitter(LlamaForSequenceClassification()).eval()


def seqcls_layer(mistake: str = "") -> LlamaDecoderLayer:
    """The classifier's second decoder layer, judged alone (what the reference can judge of it)."""
    return seqcls_llama_with({1: mistake}).model.layers[1]


def seqcls_llama_with(mistakes: dict) -> LlamaForSequenceClassification:
    torch.manual_seed(0)
    return _jitter(LlamaForSequenceClassification(mistakes)).eval()


class LlamaRewardModel(nn.Module):
    """A scalar reward from the hidden state of the last position: forward(ids) -> (B,)."""

    def __init__(self):
        super().__init__()
        self.model = LlamaModel(2)
        self.v_head = nn.Linear(D, 1)

    def forward(self, input_ids, attention_mask=None):
        hidden = self.model(input_ids, attention_mask)
        return self.v_head(hidden[:, -1]).squeeze(-1)


def reward_llama() -> LlamaRewardModel:
    torch.manual_seed(0)
    return _jitter(LlamaRewardModel()).eval()


# -- TRL's value head beside a GPT-2's LM head ------------------------------------------------------------------------


class GPT2Attention(nn.Module):
    def __init__(self, inverted: bool = False):
        super().__init__()
        self.c_attn = nn.Linear(D, 3 * D)
        self.c_proj = nn.Linear(D, D)
        self.register_buffer("bias", torch.ones(T_MAX, T_MAX, dtype=torch.bool).tril()[None, None], persistent=False)
        self.inverted = inverted  # the mistake: torch.where(~causal, ...), the keep-mask read as the hidden one

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, HD).transpose(1, 2) for t in self.c_attn(x).split(D, dim=2))
        w = q @ k.transpose(-1, -2) / math.sqrt(HD)
        causal = self.bias[:, :, :T, :T]
        low = torch.finfo(w.dtype).min
        w = torch.where(~causal if self.inverted else causal, w, torch.full_like(w, low))
        out = w.softmax(-1) @ v
        return self.c_proj(out.transpose(1, 2).reshape(B, T, D))


class GPT2MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(D, 4 * D)
        self.c_proj = nn.Linear(4 * D, D)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class GPT2Block(nn.Module):
    def __init__(self, inverted: bool = False):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(D), GPT2Attention(inverted)
        self.ln_2, self.mlp = nn.LayerNorm(D), GPT2MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, inverted_second: bool = False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T_MAX, D)
        self.h = nn.ModuleList([GPT2Block(), GPT2Block(inverted_second)])
        self.ln_f = nn.LayerNorm(D)

    def forward(self, input_ids):
        x = self.wte(input_ids) + self.wpe(torch.arange(input_ids.shape[1], device=input_ids.device))
        states = [x]
        for block in self.h:
            x = block(x)
            states.append(x)
        states[-1] = self.ln_f(x)
        return states


class GPT2LMHeadModel(nn.Module):
    def __init__(self, inverted_second: bool = False):
        super().__init__()
        self.transformer = GPT2Model(inverted_second)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, input_ids):
        """(logits, hidden states: the embeddings, then each block's output, the last after ln_f)."""
        states = self.transformer(input_ids)
        return self.lm_head(states[-1]), tuple(states)


class ValueHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.dropout = nn.Dropout(0.1)
        self.summary = nn.Linear(D, 1)

    def forward(self, hidden):
        return self.summary(self.dropout(hidden))


class AutoModelForCausalLMWithValueHead(nn.Module):
    """TRL's wrapper: forward(input_ids) -> (lm_logits, loss, value), value (B, T) from the last hidden state."""

    def __init__(self, pretrained_model: nn.Module):
        super().__init__()
        self.pretrained_model = pretrained_model
        self.v_head = ValueHead()

    def forward(self, input_ids, labels=None):
        lm_logits, hidden_states = self.pretrained_model(input_ids)
        value = self.v_head(hidden_states[-1]).squeeze(-1)
        loss = None if labels is None else F.cross_entropy(lm_logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return lm_logits, loss, value


def value_head_gpt(inverted_second: bool = False) -> AutoModelForCausalLMWithValueHead:
    torch.manual_seed(0)
    return _jitter(AutoModelForCausalLMWithValueHead(GPT2LMHeadModel(inverted_second))).eval()


# -- DeepSeek-V3's multi-token prediction: one more block on (hidden state, next token's embedding) ----------------


class MTPModule(nn.Module):
    """Depth 1: h'_i = eh_proj([hnorm(h_i); enorm(emb(t_{i+1}))]), one decoder block, its own norm, then the shared
    head (the main model's embedding and lm_head, not held here)."""

    def __init__(self):
        super().__init__()
        self.enorm, self.hnorm = LlamaRMSNorm(D), LlamaRMSNorm(D)
        self.eh_proj = nn.Linear(2 * D, D, bias=False)
        self.block = LlamaDecoderLayer()
        self.norm = LlamaRMSNorm(D)

    def forward(self, hidden, next_embeds):
        x = self.eh_proj(torch.cat([self.hnorm(hidden), self.enorm(next_embeds)], dim=-1))
        return self.norm(self.block(x))


class DeepseekMTPForCausalLM(nn.Module):
    """forward(ids) -> (logits (B, T, V), mtp_logits (B, T - 1, V)): the next token, and the one after it from the
    MTP module (position i reads tokens up to i + 1)."""

    def __init__(self, mistakes: dict | None = None):
        super().__init__()
        self.model = LlamaModel(2, mistakes)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.mtp = nn.ModuleList([MTPModule()])

    def forward(self, input_ids, attention_mask=None):
        hidden = self.model(input_ids, attention_mask, final_norm=False)
        logits = self.lm_head(self.model.norm(hidden))
        next_embeds = self.model.embed_tokens(input_ids[:, 1:])
        mtp_logits = self.lm_head(self.mtp[0](hidden[:, :-1], next_embeds))
        return logits, mtp_logits


def mtp_deepseek(mistakes: dict | None = None) -> DeepseekMTPForCausalLM:
    torch.manual_seed(0)
    return _jitter(DeepseekMTPForCausalLM(mistakes)).eval()


# -- early exit and layer skipping: fewer layers run in evaluation ---------------------------------------------------


class LayerSkipLlama(LlamaForCausalLM):
    """Three layers. Training: layer dropout at rates rising with depth. Evaluation: the layers in `eval_layers`
    only (an early exit: the first two; a self-speculative draft: layers 0 and 2), then the shared norm and head."""

    def __init__(self, eval_layers: tuple, mistakes: dict | None = None):
        super().__init__(3, mistakes)
        self.eval_layers = eval_layers
        self.layer_dropout = (0.0, 0.1, 0.2)

    def forward(self, input_ids, attention_mask=None):
        x = self.model.embed_tokens(input_ids)
        for i, layer in enumerate(self.model.layers):
            if self.training and torch.rand(()) < self.layer_dropout[i]:
                continue
            if not self.training and i not in self.eval_layers:
                continue
            x = layer(x, attention_mask)
        return self.lm_head(self.model.norm(x))


def early_exit_llama(mistakes: dict | None = None) -> LayerSkipLlama:
    torch.manual_seed(0)
    return _jitter(LayerSkipLlama((0, 1), mistakes)).eval()


def skip_middle_llama(mistakes: dict | None = None) -> LayerSkipLlama:
    torch.manual_seed(0)
    return _jitter(LayerSkipLlama((0, 2), mistakes)).eval()


# -- prompt tuning and prefix tuning as PEFT wraps a model ----------------------------------------------------------


class PromptTuningLM(nn.Module):
    """PEFT's prompt tuning: N_VIRTUAL learned embeddings prepended to the tokens' (the base run on inputs_embeds);
    the logits of every position, the virtual ones included, returned."""

    def __init__(self):
        super().__init__()
        self.base_model = LlamaForCausalLM()
        self.prompt_encoder = nn.Embedding(N_VIRTUAL, D)

    def forward(self, input_ids, attention_mask=None):
        B = input_ids.shape[0]
        embeds = self.base_model.model.embed_tokens(input_ids)
        prompts = self.prompt_encoder(torch.arange(N_VIRTUAL, device=input_ids.device))[None].expand(B, -1, -1)
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask.new_ones(B, N_VIRTUAL), attention_mask], dim=1)
        return self.base_model(inputs_embeds=torch.cat([prompts, embeds], dim=1), attention_mask=attention_mask)


def prompt_tuned_llama() -> PromptTuningLM:
    torch.manual_seed(0)
    return _jitter(PromptTuningLM()).eval()


class PrefixTuningLM(nn.Module):
    """PEFT's prefix tuning: a table of N_VIRTUAL rows, each holding every layer's key and value (KV heads), handed
    to the base as past keys and values; the queries' positions start after them."""

    def __init__(self):
        super().__init__()
        self.base_model = LlamaForCausalLM()
        self.n_layers = len(self.base_model.model.layers)
        self.prefix_encoder = nn.Embedding(N_VIRTUAL, self.n_layers * 2 * KV * HD)

    def forward(self, input_ids, attention_mask=None):
        B = input_ids.shape[0]
        table = self.prefix_encoder(torch.arange(N_VIRTUAL, device=input_ids.device))
        past = table.view(N_VIRTUAL, self.n_layers, 2, KV, HD).permute(1, 2, 3, 0, 4)  # (L, 2, KV, P, HD)
        prefixes = [(past[i, 0].expand(B, -1, -1, -1), past[i, 1].expand(B, -1, -1, -1)) for i in range(self.n_layers)]
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask.new_ones(B, N_VIRTUAL), attention_mask], dim=1)
        return self.base_model(input_ids, attention_mask=attention_mask, prefixes=prefixes)


def prefix_tuned_llama() -> PrefixTuningLM:
    torch.manual_seed(0)
    return _jitter(PrefixTuningLM()).eval()


# -- NEFTune: noise on the embeddings by a forward hook ------------------------------------------------------------


def neftune_hook(alpha: float = 5.0, training_only: bool = True):
    """The hook trainers register on the input embeddings: uniform noise of magnitude alpha / sqrt(T D) added to
    the output, while the module is training (`training_only=False`: the mistake, always)."""

    def hook(module, args, output):
        if module.training or not training_only:
            magnitude = alpha / math.sqrt(output.shape[1] * output.shape[2])
            output = output + torch.zeros_like(output).uniform_(-magnitude, magnitude)
        return output

    return hook


def neftune_llama(training_only: bool = True, mistakes: dict | None = None) -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = _jitter(LlamaForCausalLM(2, mistakes))
    model.model.embed_tokens.register_forward_hook(neftune_hook(training_only=training_only))
    return model.eval()


def _plain_attention_agrees() -> float:
    """The largest gap, float64, between LlamaAttention and a per-head loop of causal attention over the grouped
    K/V heads (head h reading K/V head h // (H / KV)), a padded key hidden."""
    torch.manual_seed(1)
    torch.set_grad_enabled(False)
    attn = LlamaAttention().double()
    x = torch.randn(2, 6, D, dtype=torch.float64)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    cos, sin = rotary(torch.arange(6), torch.float64)
    got = attn(x, cos, sin, mask)
    q = attn.q_proj(x).view(2, 6, H, HD).transpose(1, 2)
    k = attn.k_proj(x).view(2, 6, KV, HD).transpose(1, 2)
    v = attn.v_proj(x).view(2, 6, KV, HD).transpose(1, 2)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    outs = []
    for h in range(H):
        s = q[:, h] @ k[:, h // (H // KV)].transpose(-1, -2) / math.sqrt(HD)
        keep = torch.ones(6, 6, dtype=torch.bool).tril() & mask[:, None, :].bool()
        outs.append(s.masked_fill(~keep, float("-inf")).softmax(-1) @ v[:, h // (H // KV)])
    want = attn.o_proj(torch.stack(outs, 1).transpose(1, 2).reshape(2, 6, D))
    torch.set_grad_enabled(True)
    return float((got - want).abs().max())


CASES = [
    ("seqcls_llama", seqcls_llama, LM, {}, ("no pair", "score", "every position")),
    (
        "seqcls_llama.kv_heads_tiled_second_layer",
        lambda: seqcls_llama_with({1: "kv_tiled"}),
        LM,
        {},
        ("mistake", "attention.kv_heads_tiled", "model.layers.1.self_attn"),
    ),
    ("seqcls_llama.layer", seqcls_layer, "decoder_only_layer", {}, "pass"),
    (
        "seqcls_llama.layer.kv_heads_tiled",
        lambda: seqcls_layer("kv_tiled"),
        "decoder_only_layer",
        {},
        ("mistake", "attention.kv_heads_tiled", "self_attn"),
    ),
    ("reward_llama", reward_llama, LM, {}, ("no pair", "", "position")),
    ("value_head_gpt", value_head_gpt, LM, {}, "pass"),
    (
        "value_head_gpt.mask_inverted_second_block",
        lambda: value_head_gpt(inverted_second=True),
        LM,
        {},
        ("mistake", "attention.mask_inverted", "pretrained_model.transformer.h.1.attn"),
    ),
    ("mtp_deepseek", mtp_deepseek, LM, {}, "pass"),
    (
        "mtp_deepseek.rope_on_values_second_layer",
        lambda: mtp_deepseek({1: "rope_v"}),
        LM,
        {},
        ("mistake", "rope.applied_to_v", "model.layers.1.self_attn"),
    ),
    ("early_exit_llama", early_exit_llama, LM, {}, "pass"),
    (
        "early_exit_llama.eps_outside_root_second_layer",
        lambda: early_exit_llama({1: "eps_outside"}),
        LM,
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "model.layers.1.input_layernorm"),
    ),
    ("skip_middle_llama", skip_middle_llama, LM, {}, "pass"),
    (
        "skip_middle_llama.kv_heads_tiled_last_layer",
        lambda: skip_middle_llama({2: "kv_tiled"}),
        LM,
        {},
        ("mistake", "attention.kv_heads_tiled", "model.layers.2.self_attn"),
    ),
    ("prompt_tuned_llama", prompt_tuned_llama, LM, {}, ("no pair", "", "prompt_encoder")),
    ("prefix_tuned_llama", prefix_tuned_llama, LM, {}, ("no pair", "base_model.model.layers.0.self_attn", "keys")),
    ("neftune_llama", neftune_llama, LM, {}, "pass"),
    (
        "neftune_llama.noise_in_eval",
        lambda: neftune_llama(training_only=False),
        LM,
        {},
        ("mistake", "dropout.active_in_eval", "model.embed_tokens"),
    ),
    (
        "neftune_llama.mask_inverted_second_layer",
        lambda: neftune_llama(mistakes={1: "mask_inverted"}),
        LM,
        {},
        ("mistake", "attention.mask_inverted", "model.layers.1.self_attn"),
    ),
]
