"""Whisper (WhisperForConditionalGeneration, model_type whisper): a pre-norm encoder-decoder whose encoder reads
log-mel frames (numpy_transformer.audio.SpeechTransformer). Two convolutions and Whisper's fixed sinusoids
(encoder.embed_positions.weight, stored in the checkpoint and read as stored: our buffer encoder.position_table) in
place of a token table; the decoder's learned positions, its token table nn.Embedding(padding_idx=pad), the output
projection proj_out tied to it (no bias); key projections without bias; nn.LayerNorm's eps.

Refused by name, because transformers does not compute them or we do not: scale_embedding true (WhisperDecoder keeps
an embed_scale it never multiplies by), apply_spec_augment true (random masking of the features in training),
layerdrop above 0, use_weighted_layer_sum (audio classification's).

Decoding reads generation_config.json's prompt as WhisperGenerationMixin.generate() builds it for short-form audio
without timestamps (whisper_decoder_prompt): the decoder starts from decoder_start_token_id, the language, the task
and <|notimestamps|>, and generates after them. A multilingual file that names no language (whisper-tiny's released
forced_decoder_ids [[1, null], ...]) has the language detected as generate() detects it
(whisper_languages_to_detect; decoding then puts each row's detected language token after the start token).
Timestamps are not computed: a file that asks for them warns by name."""

from __future__ import annotations

import warnings

from .core import ACTIVATION_KEY, ANY, ConfigMap, Key, Rule, activation_to_hf, declared, end_token_ids, token_id
from .seq2seq import SEQ2SEQ_DROPOUT, same_as


def whisper_token(name: str):
    """The reader of special token id `name`, an id of config.json's vocabulary."""
    return lambda value, c: token_id(c, name, c.get("vocab_size", 51865))


WHISPER_CONFIG = ConfigMap(
    "whisper",
    (
        Key("vocab_size", ("src_vocab_size", "tgt_vocab_size"), 51865),
        Key("num_mel_bins", "n_mels", 80),
        Key("d_model", "d_model", 384),
        Key("encoder_attention_heads", "n_heads", 6),
        Key("decoder_attention_heads", "n_heads", 6, same_as("decoder_attention_heads", "encoder_attention_heads")),
        Key("encoder_ffn_dim", "d_ff", 1536),
        Key("decoder_ffn_dim", "d_ff", 1536, same_as("decoder_ffn_dim", "encoder_ffn_dim")),
        Key("encoder_layers", "n_encoder_layers", 4),
        Key("decoder_layers", "n_decoder_layers", 4),
        Key("activation_function", "activation", "gelu", write=activation_to_hf, **ACTIVATION_KEY),
        Key("max_source_positions", "source_positions", 1500),
        Key("max_target_positions", "max_len", 448),
        Key("pad_token_id", "pad_id", 50256, whisper_token("pad_token_id")),
        # embed_tokens is nn.Embedding(padding_idx=pad): lookups of pad pass no gradient to the table
        Key("pad_token_id", "embedding_padding_idx", 50256, lambda value, c: value is not None, written=False),
        # the decoder's start token is our bos_id (config.json's bos_token_id is the vocabulary's, kept as read)
        Key("decoder_start_token_id", "bos_id", 50257, whisper_token("decoder_start_token_id")),
        Key("eos_token_id", "eos_id", 50256, lambda value, c: end_token_ids(c, c.get("vocab_size", 51865))),
        Key("tie_word_embeddings", "tie_embeddings", True),
        Key("is_encoder_decoder", None, True, allowed=(True,)),
        Key("scale_embedding", None, False, allowed=(False, None)),  # transformers never applies its embed_scale
        Key("apply_spec_augment", None, False, allowed=(False, None)),  # SpecAugment's random masks: not computed
        Key("encoder_layerdrop", None, 0.0, allowed=(0, 0.0, None)),  # dropping whole layers: not computed
        Key("decoder_layerdrop", None, 0.0, allowed=(0, 0.0, None)),
        Key("use_weighted_layer_sum", None, False, allowed=(False, None), written=False),  # a classifier's
    ),
    SEQ2SEQ_DROPOUT,
    supports={
        "n_mels": ANY,
        "source_positions": ANY,
        "activation": ANY,
        "tie_embeddings": ANY,
        "norm_first": True,
        "positional": "learned",
        "scale_embeddings": False,
        "output_bias": False,
    },  # fmt: skip
    fixed={"layer_norm_eps": 1e-5},  # nn.LayerNorm's default, which every norm of Whisper uses
)


def whisper_rules() -> tuple[Rule, ...]:
    """Our names -> WhisperModel's (below "model."), and proj_out (the head's own, when untied)."""
    rules = [
        Rule(f"encoder.{conv}.{w}", f"encoder.{conv}.{w}") for conv in ("conv1", "conv2") for w in ("weight", "bias")
    ]
    rules += [
        Rule("encoder.position_table", "encoder.embed_positions.weight"),  # fixed, read as stored
        Rule("decoder.token_embedding.weight", "decoder.embed_tokens.weight"),
        Rule("decoder.position_embedding.weight", "decoder.embed_positions.weight"),
    ]
    attention = (("self_attn", "self_attn"), ("cross_attn", "encoder_attn"))
    for stack in ("encoder", "decoder"):
        layer = f"{stack}.layers.{{i}}"
        for ours, theirs in attention if stack == "decoder" else attention[:1]:
            rules += [Rule(f"{layer}.{ours}.k_proj.weight", f"{layer}.{theirs}.k_proj.weight")]  # no key bias
            rules += [
                Rule(f"{layer}.{ours}.{p}_proj.{w}", f"{layer}.{theirs}.{p}_proj.{w}")
                for p in ("q", "v", "out")
                for w in ("weight", "bias")
            ]
            rules += [Rule(f"{layer}.{ours}_norm.{w}", f"{layer}.{theirs}_layer_norm.{w}") for w in ("weight", "bias")]
        for ours, theirs in (("ffn.linear1", "fc1"), ("ffn.linear2", "fc2"), ("ffn_norm", "final_layer_norm")):
            rules += [Rule(f"{layer}.{ours}.{w}", f"{layer}.{theirs}.{w}") for w in ("weight", "bias")]
        rules += [Rule(f"{stack}.final_norm.{w}", f"{stack}.layer_norm.{w}") for w in ("weight", "bias")]
    rules.append(Rule("output_proj.weight", "proj_out.weight", head=True))  # only when untied
    return tuple(rules)


# generation_config.json's Whisper keys that make the prompt, or matter only for timestamps and word alignment
PROMPT_KEYS = (
    "forced_decoder_ids", "language", "task", "lang_to_id", "task_to_id", "is_multilingual", "no_timestamps_token_id",
    "return_timestamps", "alignment_heads", "max_initial_timestamp_index", "prev_sot_token_id",
)  # fmt: skip


def whisper_decoder_prompt(generation: dict, vocab: int) -> tuple[tuple, tuple]:
    """The ids Whisper's decoder reads after decoder_start_token_id, as generate() makes them (its
    _retrieve_init_tokens) for short-form audio: without `language` and `task`, forced_decoder_ids's tokens at
    positions 1, 2, ... (ValueError when they skip one); `language` (a code "en" or a token "<|en|>" of lang_to_id)
    in position 1, `task` (task_to_id's) added (transcribe when only the language is given); then
    no_timestamps_token_id unless the prompt ends with it. Returns (ids, PROMPT_KEYS: the keys read). A language
    generate() would detect (whisper_languages_to_detect) is not in the ids: decoding puts it after the start token.
    Warns when generate() would return timestamps: not computed here."""
    language, task = generation.get("language"), generation.get("task")
    prompt = forced_prompt(generation.get("forced_decoder_ids")) if language is None and task is None else []
    if language is not None:
        lang_id = whisper_language_id(generation, language)
        prompt[:1] = [lang_id]
    tasks = generation.get("task_to_id") or {}
    if task is not None:
        if task not in tasks:
            raise ValueError(f"task={task!r} is not one of task_to_id's {sorted(tasks)}")
        prompt.append(tasks[task])
    elif language is not None and "transcribe" in tasks and not any(t in prompt for t in tasks.values()):
        prompt.append(tasks["transcribe"])
    no_timestamps = generation.get("no_timestamps_token_id")
    if generation.get("return_timestamps"):
        warnings.warn(
            "generation_config.json: return_timestamps=True (Whisper's timestamp tokens) is not computed here; "
            "decoding goes on without timestamps",
            UserWarning,
            stacklevel=4,
        )
    if no_timestamps is not None and (not prompt or prompt[-1] != no_timestamps):
        prompt.append(no_timestamps)
    ids = tuple(token_id({"forced_decoder_ids": t}, "forced_decoder_ids", vocab) for t in prompt if t is not None)
    return ids, PROMPT_KEYS


def whisper_languages_to_detect(generation: dict) -> tuple:
    """The language token ids generate() chooses among when it detects the language (its _retrieve_init_tokens and
    detect_language): lang_to_id's ids, ascending, when the file (or generate()'s arguments, merged in) has lang_to_id
    and no language, and forced_decoder_ids (read only without language and task) holds no token at position 1;
    () when the language is given. The detection itself is the decoding's: the decoder reads the start token alone,
    and the largest next-token logit among these ids is each row's language, put after the start token."""
    languages = generation.get("lang_to_id")
    if generation.get("language") is not None or not languages:
        return ()
    forced = forced_prompt(generation.get("forced_decoder_ids")) if generation.get("task") is None else []
    if forced and forced[0] is not None:
        return ()
    return tuple(sorted(set(languages.values())))


def forced_prompt(forced) -> list:
    """forced_decoder_ids [[1, id], [2, id], ...] as the list of ids (None where the file has null: a language to
    detect); ValueError when a position is skipped (generate() refuses it too)."""
    prompt = []
    for position, (index, token) in enumerate(forced or [], start=1):
        if index != position:
            raise ValueError(f"forced_decoder_ids={forced}: positions 1, 2, ... each need one token (Whisper's)")
        prompt.append(token)
    return prompt


def whisper_language_id(generation: dict, language) -> int:
    """The id of `language` ("en" or "<|en|>") in generation_config.json's lang_to_id; ValueError otherwise."""
    languages = generation.get("lang_to_id") or {}
    name = str(language).lower()
    token = name if name in languages else f"<|{name}|>"
    if token not in languages:
        raise ValueError(
            f"language={language!r} is not in lang_to_id (a language code such as 'en' or a token such as "
            "'<|en|>'; full language names are not read here)"
        )
    return languages[token]


WHISPER = declared(
    WHISPER_CONFIG,
    model_class="SpeechTransformer",
    architecture="WhisperForConditionalGeneration",
    prefixes=("model.", ""),
    rules=whisper_rules(),
    skipped=(r"proj_out\.weight",),  # when tied: a copy of the decoder's table (checked equal)
    tied=(("proj_out.weight", "model.decoder.embed_tokens.weight", "tie_embeddings"),),
    decoder_prompt=whisper_decoder_prompt,
)

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (WHISPER,)
