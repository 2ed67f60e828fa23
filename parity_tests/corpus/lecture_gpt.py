"""A lecture's GPT ("let's build GPT" style): a `Head` module per head with its own `key`, `query` and `value`
linears (registered in that order) and a `tril` buffer, `MultiHeadAttention` concatenating the heads and a
`proj`, `FeedFoward` as an nn.Sequential, a `Block` whose norms are defined feed-forward first (`ff_ln`, then
`attention_ln`) but applied attention first, `token_embedding_table`, `position_embedding_table`, `ln_f` and
`lm_head`. `forward(idx, targets=None)` returns `(logits, loss)`."""

import torch
import torch.nn as nn
from torch.nn import functional as F

LEVEL = "transformer_lm"
CALL = None

n_embd, n_head, n_layer, block_size, vocab_size, dropout = 16, 2, 2, 16, 27, 0.1


class Head(nn.Module):
    """one head of self-attention"""

    def __init__(self, head_size):
        super().__init__()
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.shape
        k = self.key(x)  # (B,T,hs)
        q = self.query(x)  # (B,T,hs)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5  # (B, T, hs) @ (B, hs, T) -> (B, T, T)
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
        wei = F.softmax(wei, dim=-1)
        wei = self.dropout(wei)
        v = self.value(x)
        return wei @ v  # (B, T, T) @ (B, T, hs) -> (B, T, hs)


class MultiHeadAttention(nn.Module):
    """multiple heads of self-attention in parallel"""

    def __init__(self, num_heads, head_size):
        super().__init__()
        self.heads = nn.ModuleList([Head(head_size) for _ in range(num_heads)])
        self.proj = nn.Linear(head_size * num_heads, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        out = torch.cat([h(x) for h in self.heads], dim=-1)
        return self.dropout(self.proj(out))


class FeedFoward(nn.Module):
    """a simple linear layer followed by a non-linearity"""

    def __init__(self, n_embd):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.ReLU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(dropout)
        )

    def forward(self, x):
        return self.net(x)


class LayerNorm1d(nn.Module):
    """the lecture's own layer norm: gamma and beta, the variance over the features"""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        xmean = x.mean(-1, keepdim=True)
        xvar = x.var(-1, keepdim=True, unbiased=False)
        return self.gamma * (x - xmean) / torch.sqrt(xvar + self.eps) + self.beta


class Block(nn.Module):
    """Transformer block: communication followed by computation"""

    def __init__(self, n_embd, n_head):
        super().__init__()
        head_size = n_embd // n_head
        self.ff_ln = LayerNorm1d(n_embd)
        self.attention_ln = LayerNorm1d(n_embd)
        self.sa = MultiHeadAttention(n_head, head_size)
        self.ffwd = FeedFoward(n_embd)

    def forward(self, x):
        x = x + self.sa(self.attention_ln(x))
        return x + self.ffwd(self.ff_ln(x))


class GPTLanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.token_embedding_table = nn.Embedding(vocab_size, n_embd)
        self.position_embedding_table = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block(n_embd, n_head=n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)  # final layer norm
        self.lm_head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        tok_emb = self.token_embedding_table(idx)  # (B,T,C)
        pos_emb = self.position_embedding_table(torch.arange(T, device=idx.device))  # (T,C)
        x = tok_emb + pos_emb  # (B,T,C)
        x = self.blocks(x)  # (B,T,C)
        x = self.ln_f(x)  # (B,T,C)
        logits = self.lm_head(x)  # (B,T,vocab_size)
        if targets is None:
            loss = None
        else:
            B, T, C = logits.shape
            loss = F.cross_entropy(logits.view(B * T, C), targets.view(B * T))
        return logits, loss


def model() -> GPTLanguageModel:
    torch.manual_seed(0)
    return GPTLanguageModel()


# --- mistakes put in on purpose ---------------------------------------------------------------------------------


class EpsOutside(LayerNorm1d):
    def forward(self, x):
        xmean = x.mean(-1, keepdim=True)
        xvar = x.var(-1, keepdim=True, unbiased=False)
        return self.gamma * (x - xmean) / (torch.sqrt(xvar) + self.eps) + self.beta


class Unbiased(LayerNorm1d):
    def forward(self, x):
        xmean = x.mean(-1, keepdim=True)
        xvar = x.var(-1, keepdim=True)  # n - 1
        return self.gamma * (x - xmean) / torch.sqrt(xvar + self.eps) + self.beta


def eps_outside_sqrt() -> GPTLanguageModel:
    gpt = model()
    gpt.blocks[0].ff_ln.__class__ = EpsOutside
    gpt.blocks[0].ff_ln.eps = 1e-2  # large enough to show beside the float32 bar
    return gpt


def unbiased_variance() -> GPTLanguageModel:
    gpt = model()
    gpt.blocks[1].attention_ln.__class__ = Unbiased
    return gpt


MISTAKES = [
    (eps_outside_sqrt, "layer_norm.eps_outside_sqrt", "blocks.0.ff_ln"),
    (unbiased_variance, "layer_norm.unbiased_variance", "blocks.1.attention_ln"),
]
