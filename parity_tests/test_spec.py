"""transformer_spec: the shared config, families and checkpoint files, imported by both sides, importing neither.

Each check runs in a fresh interpreter, so what another test imported cannot hide an import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imported_after(statement: str) -> set[str]:
    """The top-level packages in sys.modules after running `statement` in a fresh interpreter (this checkout first
    on the path)."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, cwd=ROOT)
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_torch_side_imports_no_numpy_math():
    """import torch_transformer (and its hf module) imports transformer_spec, never numpy_transformer nor SciPy."""
    found = imported_after(
        "import torch_transformer, torch_transformer.hf, torch_transformer.checkpoint, torch_transformer.sentence"
    )
    assert "torch_transformer" in found and "transformer_spec" in found
    assert "numpy_transformer" not in found
    assert "scipy" not in found


def test_spec_imports_neither_side():
    """transformer_spec and its checkpoint files import neither implementation, nor torch or SciPy."""
    found = imported_after(
        "import transformer_spec, transformer_spec.checkpoints, transformer_spec.families, transformer_spec.sentence"
    )
    assert "transformer_spec" in found
    assert not found & {"numpy_transformer", "torch_transformer", "torch", "scipy"}


def test_old_config_path_is_the_shared_module():
    """numpy_transformer.config and `from numpy_transformer import TransformerConfig` are transformer_spec's."""
    import numpy_transformer.config
    from numpy_transformer.config import GenerationRules

    import numpy_transformer
    import torch_transformer
    import transformer_spec.config

    assert numpy_transformer.config is transformer_spec.config
    assert numpy_transformer.TransformerConfig is transformer_spec.config.TransformerConfig
    assert torch_transformer.TransformerConfig is transformer_spec.config.TransformerConfig
    assert GenerationRules is transformer_spec.config.GenerationRules


# ----------------------------------------------------------------------------------------------
# The families: one file each, one declaration read in both directions.

TINY = dict(vocab_size=50, bos_token_id=0, eos_token_id=1, pad_token_id=3)


def tiny_config_json(model_type: str) -> dict:
    """A tiny config.json of `model_type`, as transformers writes it (its config class's to_dict)."""
    import transformers

    sizes = {
        "bert": dict(hidden_size=16, num_attention_heads=2, intermediate_size=20, num_hidden_layers=2),
        "roberta": dict(hidden_size=16, num_attention_heads=2, intermediate_size=20, num_hidden_layers=2,
                        type_vocab_size=1),
        "xlm-roberta": dict(hidden_size=16, num_attention_heads=2, intermediate_size=20, num_hidden_layers=2),
        "distilbert": dict(dim=16, n_heads=2, hidden_dim=20, n_layers=2, dropout=0.2),
        "mpnet": dict(hidden_size=16, num_attention_heads=2, intermediate_size=20, num_hidden_layers=2, pad_token_id=1),
        "gpt2": dict(n_embd=16, n_head=2, n_layer=2, n_positions=32, activation_function="relu"),
        "llama": dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=20,
                      num_hidden_layers=2, rope_theta=500.0),
        "mistral": dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=20,
                        num_hidden_layers=2, sliding_window=4),
        "qwen2": dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=4, intermediate_size=20,
                      num_hidden_layers=2, tie_word_embeddings=True),
        "bloom": dict(hidden_size=16, n_head=2, n_layer=2, hidden_dropout=0.2),
        "marian": dict(d_model=16, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=20,
                       decoder_ffn_dim=20, encoder_layers=2, decoder_layers=1, decoder_start_token_id=3,
                       max_position_embeddings=32, share_encoder_decoder_embeddings=False, decoder_vocab_size=40),
        "bart": dict(d_model=16, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=20,
                     decoder_ffn_dim=20, encoder_layers=2, decoder_layers=1, decoder_start_token_id=3,
                     max_position_embeddings=32, scale_embedding=True),
        "t5": dict(d_model=16, d_kv=8, d_ff=20, num_heads=2, num_layers=2, num_decoder_layers=1,
                   feed_forward_proj="gated-gelu", decoder_start_token_id=3),
        "mixtral": dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=20,
                        num_hidden_layers=2, sliding_window=4, num_local_experts=4, num_experts_per_tok=2,
                        router_aux_loss_coef=0.02),
        "qwen3_moe": dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=20,
                          num_hidden_layers=3, head_dim=8, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=12, mlp_only_layers=[1], norm_topk_prob=True),
        "qwen3": dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=20,
                      num_hidden_layers=2, use_sliding_window=True, sliding_window=4, max_window_layers=1),
        "phi3": dict(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, intermediate_size=20,
                     num_hidden_layers=2, partial_rotary_factor=0.5, sliding_window=5, resid_pdrop=0.1),
        "gpt_neox": dict(hidden_size=16, num_attention_heads=2, intermediate_size=20, num_hidden_layers=2,
                         rotary_pct=0.25, use_parallel_residual=False, hidden_dropout=0.1),
        # Gemma 3: six layers in its default 5:1 local/global pattern, head_dim 8 (not 16 / 4), a capped output
        "gemma3_text": dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            intermediate_size=20, num_hidden_layers=6, sliding_window=4, query_pre_attn_scalar=8,
                            final_logit_softcapping=30.0),
        # Gemma 2: four layers in its default local/global alternation, head_dim 8 (not 16 / 4), both caps
        "gemma2": dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=20,
                       num_hidden_layers=4, sliding_window=4, query_pre_attn_scalar=8, attn_logit_softcapping=50.0,
                       final_logit_softcapping=30.0),
        "phi": dict(hidden_size=16, num_attention_heads=2, intermediate_size=20, num_hidden_layers=2,
                    partial_rotary_factor=0.25, resid_pdrop=0.1, embd_pdrop=0.2),
        "smollm3": dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=20,
                        num_hidden_layers=4, no_rope_layer_interval=2, tie_word_embeddings=False),
        "olmo2": dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=20,
                      num_hidden_layers=2, attention_bias=True, attention_dropout=0.1),
        "deepseek_v3": dict(hidden_size=16, num_attention_heads=2, num_key_value_heads=2, intermediate_size=20,
                            num_hidden_layers=3,
                            moe_intermediate_size=8, n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
                            first_k_dense_replace=1, kv_lora_rank=8, q_lora_rank=12, qk_nope_head_dim=4,
                            qk_rope_head_dim=2, v_head_dim=6),
        "deepseek_v2": dict(hidden_size=16, num_attention_heads=2, num_key_value_heads=2, intermediate_size=20,
                            num_hidden_layers=2,
                            moe_intermediate_size=8, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
                            kv_lora_rank=8, q_lora_rank=None, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=6),
        "modernbert": dict(hidden_size=16, num_attention_heads=2, intermediate_size=20, num_hidden_layers=3,
                           local_attention=4, global_rope_theta=500.0, norm_bias=True),
        # GPT-OSS: GptOssConfig's own defaults for the rest (its YaRN, its layer alternation, sinks, biased experts)
        "gpt_oss": dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=20,
                        num_hidden_layers=4, num_local_experts=4, num_experts_per_tok=2, sliding_window=4),
        "whisper": dict(d_model=16, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=20,
                        decoder_ffn_dim=20, encoder_layers=2, decoder_layers=1, num_mel_bins=8,
                        max_source_positions=6, max_target_positions=24, decoder_start_token_id=3, dropout=0.1),
    }  # fmt: skip
    return transformers.AutoConfig.for_model(model_type, **TINY | sizes[model_type]).to_dict()


def test_each_family_is_one_file_that_registers_it():
    """FAMILIES is exactly what the family files register (REGISTER), each family in one file, no list to edit."""
    import importlib
    import pkgutil

    from transformer_spec import families

    found = {}
    for info in pkgutil.iter_modules(families.__path__):
        module = importlib.import_module(f"transformer_spec.families.{info.name}")
        for family in getattr(module, "REGISTER", ()):
            assert family.model_type not in found, f"{family.model_type} registered twice"
            found[family.model_type] = (info.name, family)
    assert {k: f for k, (_, f) in found.items()} == families.FAMILIES
    assert {k: file for k, (file, _) in found.items()} == {
        "bert": "bert", "gpt2": "gpt2", "llama": "llama", "mistral": "llama", "qwen2": "llama", "bloom": "bloom",
        "marian": "seq2seq", "bart": "seq2seq", "t5": "t5", "roberta": "roberta", "xlm-roberta": "roberta",
        "distilbert": "distilbert", "mpnet": "mpnet", "modernbert": "modernbert", "qwen3": "qwen3", "phi3": "phi3",
        "gpt_neox": "gpt_neox", "gemma3_text": "gemma3", "gemma2": "gemma2", "phi": "phi",
        "mixtral": "mixtral", "qwen3_moe": "qwen3_moe", "olmo2": "olmo2",
        "smollm3": "smollm3", "gpt_oss": "gpt_oss", "whisper": "whisper", "deepseek_v3": "deepseek_v3",
        "deepseek_v2": "deepseek_v2",
    }  # fmt: skip
    assert families.BY_ARCHITECTURE["T5EncoderModel"].model_class == "EncoderModel"


def test_one_declaration_reads_and_writes_each_family():
    """Each family's ConfigMap drives both directions: config.json -> config -> config.json -> config loses only the
    fields whose keys the family reads but does not write (BERT's bos and eos ids), and is then a fixed point."""
    from dataclasses import fields

    from transformer_spec import families
    from transformer_spec.families.core import ConfigMap

    for model_type, family in families.FAMILIES.items():
        config_map = family.from_hf.__self__
        assert isinstance(config_map, ConfigMap) and family.to_hf.__self__ is config_map, model_type
        unwritten = {name for key in config_map.keys if not key.written for name in key.fields}
        unwritten -= {name for key in config_map.keys if key.written for name in key.fields}
        first = family.from_hf(tiny_config_json(model_type))
        written = family.config_json(first)
        again = family.from_hf(written)
        changed = {f.name for f in fields(first) if getattr(first, f.name) != getattr(again, f.name)}
        assert changed <= unwritten, (model_type, changed)
        assert family.config_json(again) == written and family.from_hf(family.config_json(again)) == again
        assert family.from_hf(written, 0.25).dropout_rates == dict.fromkeys(again.dropout_rates, 0.25)


def test_a_config_a_family_cannot_read_is_refused_naming_the_key_the_value_and_what_is_supported():
    """One refusal (core.refuse) for every family: the key, its value and what is supported."""
    import pytest

    from transformer_spec import families

    cases = [
        ("bert", dict(position_embedding_type="relative_key"), r"position_embedding_type='relative_key' is not "
         r"supported \(supported: 'absolute'\)"),
        ("gpt2", dict(activation_function="mish"), r"activation_function='mish' is not supported \(supported: 'relu'"),
        ("llama", dict(rope_scaling={"type": "ntk", "factor": 8.0}), r"rope_scaling.type='ntk' is not supported "
         r"\(supported: 'linear' or 'dynamic'"),
        ("llama", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), r"rope_scaling: .*'llama3' needs "
         r"\['low_freq_factor', 'high_freq_factor'\]"),
        ("llama", dict(pretraining_tp=0), r"pretraining_tp=0 is not supported \(supported: a positive integer\)"),
        ("qwen2", dict(use_sliding_window=True, sliding_window=4, layer_types="sliding_attention"),
         r"layer_types='sliding_attention' is not supported \(supported: a list of"),
        ("bloom", dict(apply_residual_connection_post_layernorm=True), r"apply_residual_connection_post_layernorm"),
        ("bart", dict(decoder_attention_heads=4), r"decoder_attention_heads=4 is not supported \(supported: "
         r"encoder_attention_heads's value, 2"),
        ("t5", dict(feed_forward_proj="gated-silu"), r"feed_forward_proj='gated-silu' is not supported"),
        ("gemma3_text", dict(attn_logit_softcapping=50.0), r"attn_logit_softcapping=50.0 is not supported \(supported: "
         r"None\)"),
        ("gemma2", dict(attn_logit_softcapping=-1.0), r"attn_logit_softcapping=-1.0 is not supported \(supported: a "
         r"positive number or null\)"),
        ("gemma2", dict(use_bidirectional_attention=True), r"use_bidirectional_attention=True is not supported"),
        ("gemma2", dict(attention_bias=True), r"attention_bias=True is not supported \(supported: False\)"),
        ("phi", dict(qk_layernorm=True), r"qk_layernorm=True is not supported \(supported: False\)"),
        ("phi", dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
         r"rope_parameters.rope_type='linear' is not supported \(supported: 'default'\)"),
        ("phi", dict(partial_rotary_factor=0.4, rope_parameters=None), r"partial_rotary_factor=0.4 is not supported "
         r"\(supported: a fraction turning an even number >= 2 of the 8 features\)"),
        ("gemma3_text", dict(rope_parameters={"sliding_attention": {"rope_type": "ntk", "factor": 8.0}}),
         r"rope_parameters.sliding_attention.rope_type='ntk' is not supported \(supported: 'linear' or "),
    ]  # fmt: skip
    for model_type, edit, message in cases:
        with pytest.raises(ValueError, match=message):
            families.FAMILIES[model_type].from_hf(tiny_config_json(model_type) | edit)
