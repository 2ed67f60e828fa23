"""The judge on the styles it met in codebases it had never seen (issue 46; parity_tests/corpus/unseen.py).

Each case (and each of parity_tests/corpus/frontier.py's, issue 49's new pairs, and of parity_tests/corpus/fresh.py's,
styles new to the corpus) gets one of the four answers: a pass; a catalogued mistake named at its submodule; "differs
at <submodule>: <op> ..., which the reference has no pair for" (result.unsupported); "could not judge: ...; pass ..."
(result.error). Never an exception, never a failure with neither an id nor a named op. Where the judge gets a case
wrong today, the case is marked xfail (strict) with what it says today; a fix turns the mark into an unexpected pass,
and the mark must then go.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity_tests import check
from parity_tests.check import dataflow, divergence, judge, running, session
from parity_tests.corpus import (
    fresh,
    fresh2,
    fresh3,
    fresh4,
    fresh5,
    fresh6,
    fresh7,
    fresh8,
    fresh9,
    fresh10,
    fresh11,
    fresh12,
    frontier,
    lacking,
    unseen,
)

_TOPK = (
    "differs at {}.mlp: topk computes a router's top-k choice of experts (a mixture of experts, as Mixtral's), which "
    "the reference has no pair for"
)
_LLAMA3 = (
    "could not judge: rope_scaling scales rotary positions: it needs positional='rope', got 'sinusoidal'; pass call= "
    "(how to call it) or mapping= (the weight map)"
)
_MODERN = (
    "unexplained: layers.1.attn (reference encoder.layers.1.self_attn) diverges with relative error 8.51e-01; not "
    "expressible by the config and no catalogue variant reproduces it"
)
_UNFOLD = (
    "could not judge: the module's forward could not be recorded on the inputs of 'transformer_lm', so the roles of "
    "its projections cannot be read from the computation: cls_token (32 -> 1), pos_embed (32 -> 5), ... (its forward "
    "raised IndexError: Dimension out of range (expected to be in range of [-2, 1], but got 2)); pass call= (how to "
    "call it) or mapping= (the weight map)"
)
_OPENAI_CLIP = (
    "could not judge: conv1 cuts an image into patches, but the rest is not the ViT check/towers.py reads (...); the "
    "judge's levels are the text Transformer's (it stopped on: the module's forward could not be recorded on the "
    "inputs of 'transformer_lm', ...: proj (32 -> 12), transformer.resblocks.0.attn.in_proj)"
)
_DENSE_OSS = (
    "unexplained: blocks.0.attn (reference decoder.layers.0.self_attn) diverges with relative error 4.43e-01; not "
    "expressible by the config and no catalogue variant reproduces it"
)
_PHI = (
    "unexplained: layers.0.self_attn (reference decoder.layers.0.self_attn) diverges with relative error 3.24e-01; not "
    "expressible by the config and no catalogue variant reproduces it"
)
_QWEN3 = (
    "could not judge: cannot read trf_blocks.0.att.W_query.weight (64 rows) as the q projection(s) of an attention of "
    "width 32 (1 query piece(s)); pass mapping="
)
_GAIN = (
    "differs at backbone.stack.0: the layer has no norm with a learned scale, where each of the reference's has one, "
    "which the reference has no pair for"
)

# What the judge says today where it is wrong, keyed by case name.
TODAY: dict[str, str] = {
    # fresh11, first met with the judge frozen (3 of 21 right). A router's top-k: units._refuse_unpaired raises NoPair
    # at the first topk, though the reference has both mixtures (TransformerConfig n_experts, top_k, norm_topk_prob,
    # expert_kind "gpt_oss"; numpy_transformer/moe.py, gpt_oss_moe.py); no unit reads a router or its experts (no
    # link to ffn.router.* / ffn.experts.*), so the second block's attention mistakes are never searched for. Both
    # models equal transformers' GptOss / Qwen3Moe on the same weights (to float32's rounding)
    "gpt_oss_hand": _TOPK.format("blocks.0"),
    # the sinks joined by log-sum-exp (logaddexp(logsumexp(s), sink), then exp(s - lse)): dataflow._attention reads a
    # sink only as a 1-D parameter joined by `cat` to the scores before the softmax, so none is read and `sinks`
    # gets no link (with attn_sinks=True, the window, the base and ffn_bias=False given, the same words); the
    # attention equals transformers' GptOssAttention on the same weights, and with its sink joined as a column by
    # `cat` (the same model otherwise) it passes
    "gpt_oss_hand.dense": _DENSE_OSS,
    "gpt_oss_hand.dense.sink_missing_second_block": _DENSE_OSS,
    "gpt_oss_hand.sink_missing_second_block": _TOPK.format("blocks.0"),
    "qwen3_moe_hand": _TOPK.format("layers.0"),
    "qwen3_moe_hand.q_k_swapped_second_block": _TOPK.format("layers.0"),
    # rope_scaling= given: units._config validates TransformerConfig(**(base | known)) while base's positional is still
    # 'sinusoidal' (rotary is tried later, session.rope_options), so any RoPE-only field given refuses; and
    # judge.could_not_judge appends "pass call= ... or mapping=", which would not help (positional='rope' added
    # to the same keywords: the clean model passes, but the mistake is then 'unexplained' at layers.0.attention, the
    # clean first block: variants.rope_knobs hands the in-situ attention (reference.py, variants.multi_head_attention)
    # the base alone, no rope_scaling, so every scaled-RoPE attention differs in situ before layer 1 is reached)
    "llama31_rope": _LLAMA3,
    "llama31_rope.mask_after_softmax_second_block": _LLAMA3,
    # ModernBERT's encoder: units._from_flow reads a window only where the level is causal and layer_types only
    # without encoder layers, units._rotary reads per-layer bases only where every attention is a decoder layer's
    # (the local layer's band |i - j| <= 2 and its base 10000 are unread), and units._units' count of the norms
    # (layer 0's own attention norm assumed in a pre-norm flow) maps the embedding norm to layer 0's attention norm
    # (first_attn_norm=False never inferred). Each alone fails: both layers global without layer 0's attention norm,
    # 'unexplained' at encoder.layers.0.self_attn_norm; with it and a local layer, at layers.1.attn; both layers global
    # with it, a pass. The model equals transformers' ModernBertModel (to its float32 RoPE)
    "modernbert_hand": _MODERN,
    "modernbert_hand.unbiased_variance_second_layer": _MODERN,
    # patches by F.unfold and a Linear: towers.patch_embedding takes only an nn.Conv2d whose stride is its kernel,
    # so towers._front reads the model as a text tower and raises (swallowed by judge_tower), and the refusal is
    # the ids' recording error, without a word on an image model (the model equals a Conv2d ViT: same math)
    "unfold_vit": _UNFOLD,
    "unfold_vit.scaled_by_model_width_second_block": _UNFOLD,
    # OpenAI's CLIP vision tower: towers._read takes the first LayerNorm called outside the blocks as the final norm,
    # so ln_pre is read as the final and ln_post never (the ViT towers.py runs, vision.py's, has no pre-norm; clip.py's
    # vision model has pre_layrnorm), and blocks called sequence-first (N, B, D) fail towers._fit's shapes
    # ("x: shapes differ, (5, 2, 32) vs (2, 5, 32)"), swallowed by judge_tower. Each alone fails: batch-first with
    # ln_pre, 'unexplained: conv1 (the front end ...)'; sequence-first without ln_pre, these words; batch-first
    # without ln_pre, a pass. The model equals transformers' CLIPVisionModelWithProjection
    "clip_vision_openai": _OPENAI_CLIP,
    "clip_vision_openai.quick_gelu_constant_second_block": _OPENAI_CLIP,
    # partial rotary with its tables computed in the forward: tables.rope reads the rotary width only from kept
    # tensors (an inv_freq buffer's length, a sin/cos buffer's width); for the tables the forward computes
    # (session.inferred's `computed`) tables.base_of reads the base alone, so rotary_dim stays None (with
    # rotary_dim=4 given it passes)
    "phi_partial_rotary": _PHI,
    # Whisper's audio encoder (mel frames in): mapping._read_builtin raises NoPair for any nn.Conv1d of kernel > 1,
    # though the reference has Whisper's two convolutions and sinusoids (numpy_transformer/audio.py, SpeechTransformer);
    # no level takes mel frames, so the honest answer is could not judge, naming the front end (conv1)
    "whisper_audio_encoder": (
        "differs at conv1: nn.Conv1d of kernel 3, a convolution over neighbouring positions, which the reference has "
        "no pair for"
    ),
    # GeGLU's GELU on the up projection of a layer that holds its gate, up and down Linears itself (no MLP module):
    # divergence.hook_targets gives the feed-forward unit no module of its own, so the divergence is found at the
    # layer and the feed-forward's catalogue (gated_feed_forward.activation_on_up) is never tried there (the same
    # Linears moved into an MLP module of their own: named at layers.1.mlp)
    "gemma2_helpers.activation_on_up_second_block": (
        "unexplained: layers.1 (reference decoder.layers.1) diverges with relative error 1.72e-01; not expressible by "
        "the config and no catalogue variant reproduces it"
    ),
    "phi_partial_rotary.causal_shows_next_second_block": _PHI,
    # fresh10, first met with the judge frozen (14 of 19 right). A module scripted whole (torch.jit.script):
    # mapping._linear_of_own calls inspect.getsource(type(mod).forward) on a RecursiveScriptModule, whose class
    # attribute `forward` is torch's _CachedForward descriptor: read from the class it raises AttributeError, which
    # only OSError and TypeError are caught for, so torch's internal error is the answer (judge.could_not_judge)
    "scripted_attention": (
        "could not judge: AttributeError: '_CachedForward' object has no attribute '__getattr__'; pass call= (how to "
        "call it) or mapping= (the weight map)"
    ),
    # an RMSNorm whose scale is named `gain`: mapping._read_own takes a 1-D parameter for a norm's scale only where its
    # name matches (weight|gamma|a_2|^g$|_g$|scale|alpha), so no norm is found and units._refuse_missing says the layer
    # has none (the flow shows gain * x * rsqrt(mean(x^2) + eps)); with the scale named `weight` both cases are right
    "remote_llama": _GAIN,
    "remote_llama.kv_heads_tiled_second_block": _GAIN,
    # logits stacked (B, T, 2, V): judge.choose skips every caller whose output shape positions_held cannot match
    # (_errors yields nothing), so `best` stays None and it raises "could not be called ... tried 0 conventions"
    # with an empty list, though every convention ran; the second head (heads.1) is never named
    "two_head_gpt": (
        "could not judge: the module could not be called as the reference 'transformer_lm' is; tried 0 conventions, "
        "the first few failed with:\n  ; pass call= (how to call it) or mapping= (the weight map)"
    ),
    # values (v + first) / 2, this block's projection averaged with blocks.0.attn's values passed in: the place is
    # right, but units._refuse_unpaired, finding a.unprojected["v"] with nothing read, falls back to "the attention's
    # input ... taken as it is", which is false (its own v projection is read), and blocks.0.attn is not named
    "value_residual_gpt": (
        "differs at blocks.1.attn: the attention's values are no projection's output: the attention's input (or a "
        "tensor made outside the forward) taken as it is, which the reference has no pair for"
    ),
    # fresh12, first met with the judge frozen (12 of 18 right). Qwen3's heads wider than d_model / H (4 heads of 16
    # beside d_model 32, as every Qwen3 and Gemma 3 checkpoint has them): units._rows reads a q projection's rows
    # from dataflow's columns only for a fused projection (dataflow._attention sets found.columns only for a weight
    # used by two roles), else takes d_model / (query pieces) rows for the queries: 32 of 64, the rest left for no k
    # or v, so it raises; head_dim= given changes nothing (the width is D, never H * head_dim, nor the Dh the flow
    # reads, found.dh), and "pass mapping=" is the only way out it names. With 4 heads of 8 the clean model passes,
    # but K Q^T is then refused at trf_blocks.1.att: dataflow._attention takes the score product's first operand for
    # the queries, so W_key (16 rows, 2 K/V heads) is read as the q projection and units._rows raises the same way
    "qwen3_scratch": _QWEN3,
    "qwen3_scratch.head_dim_given": _QWEN3,
    "qwen3_scratch.q_k_swapped_second_block": _QWEN3,
    # logits (B, C) of a mean over the non-padding tokens: running.positions_held matches only (B, T, V) and its last
    # position, so judge._errors yields nothing for the calls that run (the ids alone run), `best` stays None and
    # judge.choose says the module "could not be called", listing only the mask conventions that raised; no pool
    # reads a masked mean (towers.py's pools pick a token: end, last, class), so `pool` is never named
    "mean_pool_classifier": (
        "could not judge: the module could not be called as the reference 'encoder_model' is; tried 20 conventions, "
        "the first few failed with:\n  {'batch_first': True, 'mask': 'attention_mask: bool_keep (B, 1, 1, T)'}: "
        "RuntimeError: permute(sparse_coo): ... ; pass call= (how to call it) or mapping= (the weight map)"
    ),
    # a softmax over the queries beside BERT's additive mask, scores + (1 - m) * -10000: a constant on each padded
    # key's column, which a softmax over the queries cancels (the mask does nothing). variants.attention_heads'
    # axis=-2 comes only with mask_mode "fill" (the masked scores replaced by -1e9: the column uniform), so no variant
    # reproduces it; and judge.choose, nothing matching, judges under the closest miss, the additive (B, T) mask,
    # not the int_keep (B, T) mask the clean layer passes with (activation='gelu' given: the same words)
    "mean_pool_classifier.layer.softmax_wrong_axis": (
        "unexplained: attn (reference self_attn) diverges with relative error 4.00e-01; not expressible by the config "
        "and no catalogue variant reproduces it"
    ),
    # queries turned in pairs (2i, 2i + 1), keys in halves (i, i + Dh/2), the block found: variants.attention's
    # rope.mixed_pairing variants (pairs=) turn the reference's q and k after the map, which (rope_pairing read once
    # for the model, interleaved from layer 0) has permuted BOTH projections' rows into halves, so the keys' own
    # halves are no pairs of the permuted rows and neither variant turns the keys as the user did
    "polar_llama.mixed_pairing_second_block": (
        "unexplained: layers.1.attention (reference decoder.layers.1.self_attn) diverges with relative error 3.94e-01; "
        "not expressible by the config and no catalogue variant reproduces it"
    ),
}


# Run with -m slow (each 1-2 s on a loaded 2-core machine); a case of each class stays in the default run.
SLOW = {
    "inference_llama", "table_lm.softmax_wrong_axis", "table_lm.dropout_active_in_eval", "gemma_lm.activation_on_up",
    "gemma_lm.rms_eps_outside_sqrt", "seq2seq.tied_three_ways", "seq2seq.causal_inverted", "any_mask_causal",
    "float32_positions.causal_inverted", "no_grad_llama.kv_heads_tiled", "buffered_llama.sliding_window",
    "alibi_gpt", "gemma2_lm.rms_eps_outside_sqrt_second_block", "qwen2_lm.activation_on_up",
    "gemma3_lm.kv_heads_tiled_second_block", "olmo2_lm.k_norm_eps_outside_sqrt_second_block",
    "qwen2_lm.rope_on_values_second_block", "gemma2_lm.all_global", "oss_lm.plain_swiglu",
}  # fmt: skip
SLOW |= {  # this stop's corpora: a mistake whose class another case keeps in the default run
    "seq2seq_transformer.padding_inverted", "qk_rms_without_weight_lm", "hand_bart.not_causal_second_decoder_layer",
    "palm.not_causal_second_block", "mha_gpt.sliding_window.causal_hides_diagonal_second_block",
    "clip_text_tower.quick_gelu_constant_second_block", "hand_bert.unbiased_variance_second_layer",
    "folded_heads_gpt.softmax_wrong_axis_second_block", "course_lm.mask_inverted_second_block",
    "lse_merge_gpt.not_causal_second_block", "query_chunk_gpt.wrong_scale_second_block",
    "scaled_sdpa_gpt.wrong_scale_second_block", "hand_bart.decoder_layer.not_causal",
    "head_tensor_gpt.scaled_by_model_width_second_block",
}  # fmt: skip
SLOW |= {  # fresh8: a case of each class stays in the default run (its 11 default cases ~2.5 s on 2 idle cores)
    "position_ids_llama.rms_eps_outside_sqrt_second_block", "compiled_gpt.softmax_wrong_axis_second_block",
    "data_parallel_gpt.scaled_by_model_width_second_block", "lora_llama.rms_eps_outside_sqrt_second_block",
    "einops_lm", "lit_gpt",
}  # fmt: skip
SLOW |= {  # fresh9: a case of each class stays in the default run (its 16 default cases 1.4 s on 2 cores)
    "tuple_decoder.softmax_wrong_axis_second_block", "expand_gqa_gpt.kv_heads_tiled_second_block",
    "freqs_cis_llama.rms_eps_outside_sqrt_second_block", "conv1d_gpt2.causal_shows_next_second_block",
}  # fmt: skip
SLOW |= {  # fresh11: a case of each class stays in the default run
    "gemma2_helpers", "gpt_oss_hand.sink_missing_second_block", "qwen3_moe_hand", "phi_partial_rotary.inv_freq_buffer",
    "gpt_oss_hand.dense.sink_missing_second_block",
    "qwen3_moe_hand.q_k_swapped_second_block", "llama31_rope.mask_after_softmax_second_block",
    "modernbert_hand.unbiased_variance_second_layer", "unfold_vit.scaled_by_model_width_second_block",
    "clip_vision_openai.quick_gelu_constant_second_block", "phi_partial_rotary.causal_shows_next_second_block",
}  # fmt: skip
SLOW |= {c[0] for c in fresh12.CASES} - {  # fresh12: a case of each class (and each cause in TODAY) by default
    "nanochat_mqa", "qwen3_scratch", "loaded_gpt2.mask_after_softmax_second_block", "polar_llama",
    "mean_pool_classifier", "mean_pool_classifier.layer.softmax_wrong_axis", "polar_llama.mixed_pairing_second_block",
}  # fmt: skip
SLOW |= {c[0] for c in fresh10.CASES} - {  # fresh10: a case of each class (and each cause in TODAY) by default
    "flagged_checkpoint_gpt.not_causal_second_block", "scripted_attention", "parametrized_gpt", "functional_call_lm",
    "remote_llama", "two_head_gpt", "value_residual_gpt",
}  # fmt: skip
SLOW |= {c[0] for c in fresh5.CASES} - {  # fresh5's default-run cases: one for each of the judge's fixes
    "time_first_encoder", "cohere_lm", "gptj.keys_one_position_ahead_second_block", "megatron_lm", "layer_scale_lm",
    "neox_lm.glu", "time_first_lm", "functional_rms_llama.linear_rope_scaling", "palm", "palm.not_causal_second_block",
    "gpt2_padding_mask.scaled_by_inverse_layer",
}  # fmt: skip


def _case(name, *values):
    marks = [pytest.mark.xfail(strict=True, reason=TODAY[name])] if name in TODAY else []
    return pytest.param(*values, id=name, marks=marks + ([pytest.mark.slow] if name in SLOW else []))


@pytest.mark.parametrize(
    ("factory", "level", "keywords", "expected"),
    [
        _case(*case)
        for corpus in (
            unseen,
            frontier,
            fresh,
            fresh2,
            fresh3,
            fresh4,
            fresh5,
            fresh6,
            fresh7,
            fresh8,
            fresh9,
            fresh10,
            fresh11,
            fresh12,
            lacking,
        )
        for case in corpus.CASES
    ],
)
def test_unseen_style_gets_its_verdict(factory, level, keywords, expected):
    torch.manual_seed(0)
    try:  # nothing escapes check.module (pytest's own report of the judge's frames would take minutes)
        result = check.module(factory(), level, **keywords)
    except Exception as exc:
        pytest.fail(f"check.module raised {type(exc).__name__}: {str(exc)[:400]}", pytrace=False)
    if expected == "pass":
        assert result.passed, str(result)
        return
    assert not result.passed, str(result)
    kind, first, second = expected
    if kind == "could not judge":  # said, not raised: a model the reference has no level for (words: `second`)
        assert result.error.startswith("could not judge: ") and second in result.error, str(result)
        return
    if kind == "mistake":  # (id, where)
        assert result.diagnoses, str(result)
        assert (result.diagnoses[0].id, result.diagnoses[0].where) == (first, second), str(result)
    else:  # "no pair" (where, words): said at the user's submodule, in the user's terms
        where, what = first, second
        assert result.unsupported and not result.diagnoses, str(result)
        assert result.unsupported.startswith(f"differs at {where or '(the module)'}: "), result.unsupported
        assert what in result.unsupported and "which the reference has no pair for" in result.unsupported


def test_a_term_on_the_scores_is_told_apart_by_its_values():
    """unsupported._bias: a mask (0 and large negatives) is no term; ALiBi's slope times (key - query), a function of
    the relative position alone, and any other bias are each said; one position (T = 1) is a bias, not an error."""
    from parity_tests.check.unsupported import _bias

    T = 5
    distance = (torch.arange(T)[None, :] - torch.arange(T)[:, None]).double()
    causal = torch.zeros(T, T, dtype=torch.float64).masked_fill(distance > 0, float("-inf"))
    assert _bias(causal) is None and _bias(torch.zeros(2, T, T, dtype=torch.float64)) is None
    assert _bias(torch.tensor([0.5, 0.25], dtype=torch.float64)[:, None, None] * distance).startswith("ALiBi's bias")
    relative = torch.randn(2 * T - 1, dtype=torch.float64)[(distance + T - 1).long()]
    assert _bias(relative).startswith("a bias of the relative position alone")
    assert _bias(torch.randn(2, T, T, dtype=torch.float64)) == f"a bias of shape (2, {T}, {T})"
    assert _bias(torch.full((2, 1, 1), 0.5, dtype=torch.float64)) == "a bias of shape (2, 1, 1)"


def test_a_band_built_by_hand_is_read_as_the_window():
    """dataflow.Flow.window: a band the forward applies (a boolean keep-mask given to SDPA here) is the config's
    sliding_window, said in the printed config; a window no probe is long enough to show is not read."""
    result = check.module(fresh2.band_llama(window=2), "transformer_lm")
    assert result.passed and result.config.sliding_window == 2 and "sliding_window=2" in str(result), str(result)
    wide = check.module(fresh2.band_llama(window=fresh2.T_MAX), "transformer_lm")
    assert wide.passed and wide.config.sliding_window is None, str(wide)


def test_rows_read_along_leading_singleton_axes():
    """dataflow._rows_read: P[:T], P[:, :T] and P[0, :T] of a table with leading axes of size 1 read rows 0 .. T - 1;
    a slice of a later axis of a table whose leading axis is not 1, or a step, reads no rows."""
    from parity_tests.check.dataflow import _rows_read

    assert list(_rows_read(slice(None, 3), (8, 1, 4))) == [0, 1, 2]
    assert list(_rows_read((slice(None), slice(1, 3)), (1, 8, 4))) == [1, 2]
    assert list(_rows_read((0, slice(None, 2), slice(None)), (1, 8, 4))) == [0, 1]
    assert _rows_read((slice(None), slice(None, 3)), (8, 4)) is None  # columns of a (T, D) table
    assert _rows_read((slice(None), slice(None, 3, 2)), (1, 8, 4)) is None
    assert _rows_read((slice(None), slice(None, 3), 0), (1, 8, 4)) is None  # one feature, not whole rows


def test_a_forward_that_cannot_be_called_says_what_it_raised():
    """A layer whose forward wants an argument the level has no input for is refused naming what its forward raised
    and `call=` (before: 'the number of heads cannot be read ...; pass n_heads=', which would not have helped)."""

    class Scaled(fresh6.BertLayer):
        def forward(self, x, keep, scale):
            return super().forward(x, keep) * scale

    torch.manual_seed(0)
    result = check.module(Scaled(), "encoder_layer")
    assert result.error.startswith("could not judge: the module's forward could not be recorded"), str(result)
    assert "missing 1 required positional argument: 'scale'" in result.error and "pass call=" in result.error


class _MaskedBatchLM(fresh9.LitLM):
    """forward(batch) reading batch["attention_mask"] too (a causal LM that takes it and, unpadded, needs none)."""

    def forward(self, batch):
        assert batch["attention_mask"] is not None
        return super().forward({"input_ids": batch["input_ids"]})


def test_a_batch_dict_holds_every_key_the_forward_reads():
    """calling._batch_keys: the dict passed to forward(batch) holds each key its source subscripts, a mask as the
    level's; a subclass's forward that reads nothing from it by key is called on the ids (fresh9.temperature_lm)."""
    torch.manual_seed(0)
    result = check.module(_MaskedBatchLM(), "transformer_lm")
    assert result.passed and "forward({'input_ids': ..., 'attention_mask': ...})" in str(result), str(result)


def test_latent_attention_written_by_hand_passes_with_its_map():
    """fresh8's DeepSeek-V2-Lite-style attention (q_proj, a latent and a shared rotary key from kv_a_proj_with_mqa,
    its RMSNorm, kv_b_proj to each head's keys and values) computes the reference's latent attention: given its sizes
    and the map a user writes by hand, it passes (the judge reads the same map itself: fresh8's deepseek_lite)."""
    torch.manual_seed(0)
    result = check.module(
        fresh8.deepseek_lite(), "transformer_lm", mapping=fresh8.latent_map(), tie_embeddings=False, **fresh8.LATENT
    )
    assert result.passed, str(result)


def test_latent_attention_map_is_read_back_from_its_printed_notes():
    """fresh8's DeepSeek attention with kv_b_proj's rows every head's keys, then every head's values: the judge links
    them to the reference's kv_b_proj (each head's k, then its v) in runs, printed 'rows 0:8, 16:24, ...'; the
    printed map, passed back as text, is the same map."""
    torch.manual_seed(0)
    result = check.module(fresh8.deepseek_lite(fresh8.LatentKVBlocks, fresh8.LatentKVBlocks), "transformer_lm")
    assert result.passed, str(result)
    reference, note = result.mapping["layers.1.self_attn.kv_b_proj.weight"]
    assert (reference, note.split(", ")[:3]) == (
        "decoder.layers.1.self_attn.kv_b_proj.weight",
        ["rows 0:8", "16:24", "32:40"],
    )
    text = {user: (reference, note) for user, (reference, note) in result.mapping.items()}
    blocks = fresh8.deepseek_lite(fresh8.LatentKVBlocks, fresh8.LatentKVBlocks)
    assert check.module(blocks, "transformer_lm", mapping=text).passed


def test_what_was_judged_in_place_of_what_was_handed_in_is_said():
    """A wrapped model is judged as the model inside (running.unwrapped), and a float32 run that computes in bfloat16
    is judged on bars widened by bfloat16's epsilon over float32's (running.narrowest): each is said in a note; the
    float64 comparison of the bfloat16 model is as tight as any other's."""
    torch.manual_seed(0)
    wrapped = check.module(torch.nn.DataParallel(fresh8.train_gpt()), "transformer_lm")
    assert wrapped.passed and any("judged the model inside DataParallel" in n for n in wrapped.notes), str(wrapped)
    torch.manual_seed(0)
    cast = check.module(fresh8.cast_gpt(fresh8.Bf16CastAttention), "transformer_lm")
    assert cast.passed and any("computes in bfloat16" in n and "65536" in n for n in cast.notes), str(cast)
    assert max(r.error for r in cast.rows if r.dtype == "float64") < 1e-10, str(cast)
    assert max(r.error for r in cast.rows if r.dtype == "float32") > 1e-4, str(cast)  # bfloat16's, not float32's


def test_the_float32_run_in_bfloat16_is_read_from_the_recording(monkeypatch):
    """Whether the float32 run computes in bfloat16 (torch.autocast here) is read from the recording's tensors
    (running.narrowest): the user's module runs in float32 only to be recorded and compared, never once more."""
    runs = {"forward": 0, "recorded or compared": 0}

    def counted(function, float32=lambda *args: True):
        def call(*args, **kwargs):
            runs["recorded or compared"] += bool(float32(*args))
            return function(*args, **kwargs)

        return call

    run_user = counted(session.run_user, lambda check, layout, caller, dtype, *rest: dtype == np.float32)
    for space in (judge, divergence):
        monkeypatch.setattr(space, "run_user", run_user)
    monkeypatch.setattr(dataflow, "record", counted(dataflow.record))
    model = fresh8.cast_gpt(fresh8.AutocastAttention)  # its copies hold the hook too

    def forward(module, args) -> None:
        runs["forward"] += module.lm_head.weight.dtype == torch.float32

    model.register_forward_pre_hook(forward)
    torch.manual_seed(0)
    result = check.module(model, "transformer_lm")
    assert result.passed and any("computes in bfloat16" in n for n in result.notes), str(result)
    assert runs["forward"] == runs["recorded or compared"] > 0, runs


def test_each_low_rank_adapter_is_read_once(monkeypatch):
    """running.merged_adapters reads each LoRA part (its base, A, B and s: running._low_rank) once, on the user's
    module, and merges what it read into the copy: one s found for each of fresh8's LoraLinear parts."""
    found = []

    def scaling(*args):
        found.append(running_scaling(*args))
        return found[-1]

    running_scaling = running._scaling
    monkeypatch.setattr(running, "_scaling", scaling)
    model = fresh8.lora_llama()
    torch.manual_seed(0)
    result = check.module(model, "transformer_lm")
    parts = [m for m in model.modules() if isinstance(m, fresh8.LoraLinear)]
    assert result.passed and any("low-rank adapter merged" in n for n in result.notes), str(result)
    assert len([s for s in found if s is not None]) == len(parts) > 0, (found, len(parts))


def test_a_fresh_lora_adapter_is_merged_and_a_wrong_one_is_not():
    """fresh8's LoRA Llama with B = 0 (a fresh adapter: its output is the base's alone) is still read as the merged
    linear, s from dB = s dW A^T, and passes with a note; an "adapter" whose backward is not the chain rule's (A's
    gradient doubled by a custom autograd function) is not merged, so the judge says what it said before."""

    class Doubled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, w):
            return w.clone()

        @staticmethod
        def backward(ctx, g):
            return 2 * g

    class WrongLora(fresh8.LoraLinear):
        def forward(self, x):
            low = torch.nn.functional.linear(x, Doubled.apply(self.lora_A["default"].weight))
            return self.base_layer(x) + self.lora_B["default"](low) * self.scaling["default"]

    fresh = fresh8.lora_llama()
    for layer in fresh.model.layers:
        for lora in (layer.self_attn.q_proj, layer.self_attn.v_proj):
            torch.nn.init.zeros_(lora.lora_B["default"].weight)
    result = check.module(fresh, "transformer_lm")
    assert result.passed and any("low-rank adapter merged" in n for n in result.notes), str(result)
    wrong = fresh8.lora_llama()
    for layer in wrong.model.layers:
        q = layer.self_attn.q_proj
        q.__class__ = WrongLora
    result = check.module(wrong, "transformer_lm")
    assert not result.passed and result.error and "base_layer" in result.error, str(result)
