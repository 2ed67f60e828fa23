"""Mixtral (MixtralForCausalLM): Mistral whose feed-forward blocks are sparse mixtures of experts. A router
(mlp.gate.weight, our ffn.router.weight) picks num_experts_per_tok of num_local_experts SwiGLU experts per token, their
gates renormalised to sum to 1; the experts' weights are transformers 5's fused 3-D tensors, mlp.experts.gate_up_proj
(E, 2F, D) and mlp.experts.down_proj (E, D, F), F = intermediate_size; the files save_pretrained writes (and the Hub
holds) keep each expert's w1, w3, w2: fused on loading (fuse_experts). router_aux_loss_coef weighs the load-balancing
loss. Qwen3-MoE (qwen3_moe.py) reads the same experts."""

from __future__ import annotations

import re
from dataclasses import replace
from functools import partial

import numpy as np

from .core import ANY, Key, Rule
from .llama import LLAMA, MISTRAL, MISTRAL_CONFIG

MOE_RULES = (
    Rule("decoder.layers.{i}.ffn.router.weight", "layers.{i}.mlp.gate.weight"),
    Rule("decoder.layers.{i}.ffn.experts.gate_up_proj", "layers.{i}.mlp.experts.gate_up_proj"),
    Rule("decoder.layers.{i}.ffn.experts.down_proj", "layers.{i}.mlp.experts.down_proj"),
)
MOE_SUPPORTS = {"n_experts": ANY, "top_k": ANY, "router_aux_loss_coef": ANY}


def fuse_experts(tensors: dict, block: str, gate: str, up: str, down: str) -> dict:
    """A mixture of experts' files as save_pretrained writes them (and the Hub holds them): per layer the router
    `{block}.gate.weight` and, per expert e, `{block}.experts.{e}.{gate}.weight` (F, D), `{up}` (F, D), `{down}` (D, F)
    -> the class's mlp.gate.weight, mlp.experts.gate_up_proj (E, 2F, D) = [gate_e ; up_e] stacked and
    mlp.experts.down_proj (E, D, F) = down_e stacked, as transformers 5 fuses them on loading. Other names pass.
    Mixtral: block_sparse_moe, w1, w3, w2; Qwen3-MoE: mlp, gate_proj, up_proj, down_proj."""
    pattern = re.compile(rf"(.*layers\.\d+\.){block}\.(?:experts\.(\d+)\.({gate}|{up}|{down})|gate)\.weight")
    out: dict = {}
    layers: dict[str, dict[tuple[int, str], np.ndarray]] = {}  # a layer's prefix -> (expert, part) -> array
    for name, array in tensors.items():
        found = pattern.fullmatch(name)
        if found is None:
            out[name] = array
            continue
        prefix, expert, part = found.groups()
        if expert is None:
            out[prefix + "mlp.gate.weight"] = array
        else:
            layers.setdefault(prefix, {})[(int(expert), part)] = array
    for prefix, parts in layers.items():
        n = 1 + max(e for e, _ in parts)
        missing = [f"{prefix}{block}.experts.{e}.{w}.weight" for e in range(n) for w in (gate, up, down)
                   if (e, w) not in parts]  # fmt: skip
        if missing:
            raise ValueError(f"the experts of {prefix[:-1]} are incomplete: missing {missing}")
        try:
            out[prefix + "mlp.experts.gate_up_proj"] = np.stack(
                [np.concatenate([parts[e, gate], parts[e, up]]) for e in range(n)]
            )
            out[prefix + "mlp.experts.down_proj"] = np.stack([parts[e, down] for e in range(n)])
        except ValueError as error:
            raise ValueError(f"the experts of {prefix[:-1]} do not fit together ({error})") from None
    return out


MIXTRAL_CONFIG = MISTRAL_CONFIG.variant(
    "mixtral",
    keys=(
        Key("num_local_experts", "n_experts", 8),
        Key("num_experts_per_tok", "top_k", 2),
        Key("router_aux_loss_coef", "router_aux_loss_coef", 0.001, lambda value, c: float(value)),
        Key("router_jitter_noise", None, 0.0, allowed=(0, 0.0)),  # a training-time noise on the router's input
    ),
    supports=MOE_SUPPORTS,
)
MIXTRAL = replace(
    MISTRAL, model_type="mixtral", architecture="MixtralForCausalLM", rules=LLAMA.rules + MOE_RULES,
    from_hf=MIXTRAL_CONFIG.from_hf, to_hf=MIXTRAL_CONFIG.to_hf, supports=MIXTRAL_CONFIG.supports,
    legacy=partial(fuse_experts, block="block_sparse_moe", gate="w1", up="w3", down="w2"),
)  # fmt: skip

# what this file adds to transformer_spec.families.FAMILIES
REGISTER = (MIXTRAL,)
