"""timm style: the transformer part of a Vision Transformer. `Attention` with one fused `qkv` projection reshaped
to (3, B, heads, N, head_dim) and unbound, the queries scaled by `head_dim ** -0.5` before the product (or, with
`fused_attn`, torch's `scaled_dot_product_attention`), `proj`;
`Mlp` of `fc1`, `act` (nn.GELU) and `fc2`; pre-norm `Block`s (`norm1`, `attn`, `norm2`, `mlp`, LayerNorm eps
1e-6); the model holds `blocks` (an nn.Sequential) and a final `norm`, and its `forward(x)` takes the patch tokens
(B, N, D) that a ViT's patch embedding hands its blocks. No mask anywhere: every patch sees every patch."""

from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

LEVEL = "encoder_stack"
CALL = None


class Attention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False, attn_drop=0.0, proj_drop=0.0):
        super().__init__()
        assert dim % num_heads == 0, "dim should be divisible by num_heads"
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = False
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, num_heads, N, head_dim) each
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        else:
            q = q * self.scale
            attn = q @ k.transpose(-2, -1)
            attn = attn.softmax(dim=-1)
            attn = self.attn_drop(attn)
            x = attn @ v
        x = x.transpose(1, 2).reshape(B, N, C)
        x = self.proj(x)
        return self.proj_drop(x)


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.GELU, drop=0.0):
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x):
        x = self.fc1(x)
        x = self.act(x)
        x = self.drop1(x)
        x = self.fc2(x)
        return self.drop2(x)


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=False, drop=0.0, norm_layer=nn.LayerNorm):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=drop, proj_drop=drop)
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), drop=drop)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformerBlocks(nn.Module):
    """What a VisionTransformer runs after `patch_embed`, `_pos_embed` and `norm_pre`: its blocks and final norm."""

    def __init__(self, embed_dim=16, depth=2, num_heads=4, mlp_ratio=4.0, qkv_bias=True, drop_rate=0.1):
        super().__init__()
        norm_layer = partial(nn.LayerNorm, eps=1e-6)
        blocks = [Block(embed_dim, num_heads, mlp_ratio, qkv_bias, drop_rate, norm_layer) for _ in range(depth)]
        self.blocks = nn.Sequential(*blocks)
        self.norm = norm_layer(embed_dim)

    def forward(self, x):
        x = self.blocks(x)
        return self.norm(x)


def model() -> VisionTransformerBlocks:
    torch.manual_seed(0)
    return VisionTransformerBlocks()


def fused_attn() -> VisionTransformerBlocks:
    vit = model()
    for block in vit.blocks:
        block.attn.fused_attn = True  # what timm does where torch has scaled_dot_product_attention
    return vit


ALSO_CLEAN = [fused_attn]


# --- mistakes put in on purpose ---------------------------------------------------------------------------------


def wrong_scale() -> VisionTransformerBlocks:
    vit = model()
    attn = vit.blocks[0].attn
    attn.scale = (attn.num_heads * attn.head_dim) ** -0.5  # the model's width, not a head's
    return vit


class SoftmaxOverQueries(Attention):
    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        attn = attn.softmax(dim=-2)  # normalised over the queries
        x = (self.attn_drop(attn) @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))


def softmax_wrong_axis() -> VisionTransformerBlocks:
    vit = model()
    vit.blocks[1].attn.__class__ = SoftmaxOverQueries
    return vit


class UnbiasedVariance(nn.LayerNorm):
    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True)  # torch.var divides by D - 1 unless told unbiased=False
        return self.weight * (x - mean) / torch.sqrt(var + self.eps) + self.bias


def layer_norm_unbiased_variance() -> VisionTransformerBlocks:
    vit = model()
    vit.blocks[1].norm2.__class__ = UnbiasedVariance
    return vit


MISTAKES = [
    (wrong_scale, "attention.wrong_scale", "blocks.0.attn"),
    (softmax_wrong_axis, "attention.softmax_wrong_axis", "blocks.1.attn"),
    (layer_norm_unbiased_variance, "layer_norm.unbiased_variance", "blocks.1.norm2"),
]
