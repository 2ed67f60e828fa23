"""Hugging Face model families as data: for each `model_type`, how its config.json translates to a
`TransformerConfig` and back, and a table that maps every tensor of its checkpoint to one of our
state-dict names. Both `numpy_transformer.hf` and `torch_transformer.hf` read these tables, so a new
family is a new table here, not a new code path there.

A `Rule` says where one of our tensors lives in the checkpoint and how its layout differs:

    Rule("decoder.layers.{i}.self_attn.q_proj.weight", "h.{i}.attn.c_attn.weight", conv1d=True, part=(0, 3))

reads: our q_proj weight is the first of three equal slices, along the output axis, of GPT-2's fused
`c_attn` weight, which is stored (in, out) as a `Conv1D` (so it is transposed). "{i}" stands for the
layer index. Names of the base model (everything but the heads) are written without the prefix the
head class adds ("transformer.", "model."): a family lists the prefixes its checkpoints may carry.

Reading a tensor: theirs -> drop `offset` leading rows -> squeeze a leading axis of 1 (`row`) ->
transpose (`conv1d`) -> take slice `part` of the first axis (or, `per_head`, of each head's rows). Writing
undoes it in reverse. `read_layout` and `write_layout` below do it for NumPy arrays and torch tensors alike: the
one interpreter of these tables, used by both sides.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from .config import DROPOUT_KINDS, GenerationRules, TransformerConfig


@dataclass(frozen=True)
class Rule:
    ours: str  # our state-dict name; "{i}" is the layer index
    theirs: str  # the checkpoint's name, relative to the base model unless `head`
    conv1d: bool = False  # stored (in, out), as GPT-2's Conv1D: transposed relative to nn.Linear
    part: tuple[int, int] | None = None  # (k, n): ours is slice k of n equal slices of theirs (fused q, k, v)
    offset: int = 0  # rows of theirs that precede ours (BART's learned positions start at row 2)
    row: bool = False  # theirs has an extra leading axis of size 1 (Marian's and BART's final_logits_bias)
    head: bool = False  # `theirs` is a name of the head class itself (lm_head.weight), not of the base model
    when: tuple[str, bool] | None = None  # (config field, value): the rule applies only when the field has it
    # with `part`: the parts interleave head by head (BLOOM's query_key_value: the first axis is (H, n, Dh), head
    # h's q, k, v rows side by side), instead of n consecutive blocks (GPT-2's c_attn)
    per_head: bool = False


@dataclass(frozen=True)
class Family:
    model_type: str  # config.json's "model_type"
    model_class: str  # ours: "EncoderModel", "TransformerLM" or "Transformer"
    architecture: str  # the transformers class hf.save writes for ("architectures" in config.json)
    prefixes: tuple[str, ...]  # prefixes of base-model names in a checkpoint; the first is the one written
    rules: tuple[Rule, ...]
    skipped: tuple[str, ...]  # regexes (relative names) of tensors that are not parameters of our model
    from_hf: Callable[..., TransformerConfig]  # (config.json, dropout=None) -> TransformerConfig
    to_hf: Callable[[TransformerConfig], dict]  # TransformerConfig -> config.json fields (ValueError if impossible)
    # (alias, source, config field): when the field is true (tie_embeddings, share_embeddings), the HF class's
    # state_dict also holds `alias`, the same tensor as `source` (full names). hf.load compares an alias the file
    # holds with its source (resolve_ties); hf.save writes aliases only where the model undoes a tie (tied_copies)
    tied: tuple[tuple[str, str, str], ...] = ()
    # The config fields a checkpoint of this family can express, beyond FREE_FIELDS: field -> the value it needs, a
    # tuple of the values it may take, ANY, or a function of the config giving one of those. A field not listed
    # must keep its default: a new config option is refused by every family until one says it supports it.
    supports: dict = field(default_factory=dict)
    # (config field, regex of a relative name): the field is set true when the checkpoint holds such a tensor (BERT's
    # pooler: BertModel has one unless built with add_pooling_layer=False, which config.json does not say)
    detected: tuple[tuple[str, str], ...] = ()

    def config_json(self, config: TransformerConfig) -> dict:
        """config.json's fields for `config` (to_hf), after checking that the family supports every field."""
        check_supported(self, config)
        return self.to_hf(config)


ANY = "any value"  # in a family's `supports`: the field may take every value the config allows
# Fields every family expresses in its config.json (sizes, special ids, dropout rates: dropout_to_hf checks them per
# family), or that are not part of a checkpoint (the attention kernel, padding_idx's gradient rule).
FREE_FIELDS = frozenset(
    {
        "src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers",
        "max_len", "layer_norm_eps", "pad_id", "bos_id", "eos_id", "dropout", "embedding_dropout",
        "attention_dropout", "activation_dropout", "residual_dropout", "attention", "embedding_padding_idx",
    }
)  # fmt: skip


def check_supported(family: Family, config: TransformerConfig) -> None:
    """ValueError listing every field of `config` that a checkpoint of `family` cannot express (see Family.supports)."""
    wrong = []
    for spec in fields(config):
        if spec.name in FREE_FIELDS:
            continue
        allowed = family.supports.get(spec.name, spec.default)
        if callable(allowed):
            allowed = allowed(config)
        if allowed == ANY:
            continue
        options = allowed if isinstance(allowed, tuple) else (allowed,)
        value = getattr(config, spec.name)
        if value not in options:
            wrong.append(f"{spec.name}={value!r} (needs {' or '.join(repr(o) for o in options)})")
    if wrong:
        raise ValueError(f"this model cannot be written as a {family.model_type!r} checkpoint: {', '.join(wrong)}")


def expand(rules: tuple[Rule, ...], config: TransformerConfig) -> list[Rule]:
    """The rules with "{i}" replaced by every layer index of the stack the name belongs to."""
    out = []
    for rule in rules:
        if rule.when is not None and getattr(config, rule.when[0]) != rule.when[1]:
            continue
        if "{i}" not in rule.ours:
            out.append(rule)
            continue
        n = config.n_encoder_layers if rule.ours.startswith("encoder.") else config.n_decoder_layers
        for i in range(n):
            out.append(replace(rule, ours=rule.ours.format(i=i), theirs=rule.theirs.format(i=i)))
    return out


# ----------------------------------------------------------------------------------------------
# The rule interpreter, for NumPy arrays and torch tensors alike (slicing, .T, reshape, and the `concat` and
# `zeros` each side passes in).


def read_layout(array, rule: Rule, name: str, n_heads: int):
    """Theirs -> ours: drop `offset` rows, squeeze the leading axis (`row`), transpose (`conv1d`), take part k of n
    of the first axis (n consecutive blocks, or `per_head`: within each of the n_heads heads' rows)."""
    if rule.offset:
        array = array[rule.offset :]
    if rule.row:
        if array.ndim < 2 or array.shape[0] != 1:
            raise ValueError(f"{name}: expected a leading axis of size 1, got shape {tuple(array.shape)}")
        array = array[0]
    if rule.conv1d:
        array = array.T
    if rule.part:
        k, n = rule.part
        groups = n_heads * n if rule.per_head else n
        if array.shape[0] % groups:
            raise ValueError(f"{name}: a fused tensor of {n} parts, but its shape {tuple(array.shape)} does not split")
        rest = tuple(array.shape[1:])
        if rule.per_head:  # (H * n * Dh, ...) -> (H, n, Dh, ...) -> part k of every head -> (H * Dh, ...)
            array = array.reshape(n_heads, n, -1, *rest)[:, k].reshape(-1, *rest)
        else:
            size = array.shape[0] // n
            array = array[k * size : (k + 1) * size]
    return array


def write_layout(arrays: list, rule: Rule, n_heads: int, concat: Callable, zeros: Callable):
    """Ours -> theirs, the inverse of read_layout: join the parts (head by head when `per_head`), transpose, add
    the leading axis, put `offset` rows of zeros in front (positions the model never reads).
    concat(arrays, axis) and zeros(shape, like) are the side's own (np.concatenate, torch.cat)."""
    array = arrays[0]
    if rule.part:
        rest = tuple(array.shape[1:])
        if rule.per_head:  # each (H * Dh, ...) -> (H, 1, Dh, ...), joined on the parts' axis -> (H * n * Dh, ...)
            array = concat([a.reshape(n_heads, 1, -1, *rest) for a in arrays], 1).reshape(-1, *rest)
        else:
            array = concat(arrays, 0)
    if rule.conv1d:
        array = array.T
    if rule.row:
        array = array[None]
    if rule.offset:
        array = concat([zeros((rule.offset, *array.shape[1:]), array), array], 0)
    return array


def is_skipped(family: Family, name: str) -> bool:
    return any(re.fullmatch(pattern, name) for pattern in family.skipped)


# ----------------------------------------------------------------------------------------------
# Config translation helpers.

ACTIVATIONS_FROM_HF = {
    "relu": "relu",
    "gelu": "gelu",  # exact, erf
    "gelu_new": "gelu_tanh",  # GPT-2's tanh approximation
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",  # Marian's opus-mt checkpoints
}


def activation_from_hf(name) -> str:
    if name not in ACTIVATIONS_FROM_HF:
        raise ValueError(f"activation {name!r} is not supported; supported: {sorted(ACTIVATIONS_FROM_HF)}")
    return ACTIVATIONS_FROM_HF[name]


# Each family's dropout fields in config.json: name -> (the kinds of our sites it sets, transformers' default when
# the field is absent). A kind no field names has no dropout in that family (no config.json can express one).
BERT_DROPOUT = {
    "hidden_dropout_prob": (("embedding", "residual"), 0.1),
    "attention_probs_dropout_prob": (("attention",), 0.1),
}
GPT2_DROPOUT = {
    "embd_pdrop": (("embedding",), 0.1), "attn_pdrop": (("attention",), 0.1), "resid_pdrop": (("residual",), 0.1),
}  # fmt: skip
LLAMA_DROPOUT = {"attention_dropout": (("attention",), 0.0)}
SEQ2SEQ_DROPOUT = {
    "dropout": (("embedding", "residual"), 0.1),
    "attention_dropout": (("attention",), 0.0),
    "activation_dropout": (("activation",), 0.0),
}


def dropout_from_hf(c: dict, fields: dict, override: float | None = None) -> dict:
    """The config's dropout fields from config.json's rates (`fields`: the family's table above; null counts as
    0), or `override` (load's dropout=) for every site."""
    if override is not None:
        return {"dropout": float(override)}
    rates = dict.fromkeys(DROPOUT_KINDS, 0.0)
    for name, (kinds, default) in fields.items():
        for kind in kinds:
            rates[kind] = float(c.get(name, default) or 0.0)
    return {"dropout": 0.0, **{f"{kind}_dropout": rate for kind, rate in rates.items()}}


def dropout_to_hf(config: TransformerConfig, model_type: str, fields: dict) -> dict:
    """config.json's dropout fields from the config's rates; ValueError where the family cannot express them (one
    field for several kinds whose rates differ, or a kind it has no field for with a rate above 0)."""
    rates, out = config.dropout_rates, {}
    for name, (kinds, _) in fields.items():
        values = {rates[kind] for kind in kinds}
        if len(values) > 1:
            got = ", ".join(f"{kind}_dropout={rates[kind]}" for kind in kinds)
            raise ValueError(f"a {model_type} checkpoint has one rate ({name}) for these sites; got {got}")
        out[name] = values.pop()
    covered = {kind for kinds, _ in fields.values() for kind in kinds}
    inexpressible = [f"{kind}_dropout={rates[kind]}" for kind in DROPOUT_KINDS if kind not in covered and rates[kind]]
    if inexpressible:
        raise ValueError(f"a {model_type} checkpoint has no such dropout: got {', '.join(inexpressible)} (needs 0)")
    return out


def generation_rules_from_hf(generation: dict, vocab: int) -> GenerationRules:
    """GenerationRules from generation_config.json (or config.json's fields of the same names, as transformers
    reads them when that file is absent): forced_bos_token_id, forced_eos_token_id, bad_words_ids."""
    forced = {}
    for name, ours in (("forced_bos_token_id", "forced_bos_id"), ("forced_eos_token_id", "forced_eos_id")):
        value = generation.get(name)
        if isinstance(value, list):
            if len(value) != 1:
                raise ValueError(f"{name}={value}: one forced token is supported")
            value = value[0]
        forced[ours] = token_id({name: value}, name, vocab)
    words = generation.get("bad_words_ids") or []
    if not isinstance(words, list) or not all(isinstance(w, list) and w for w in words):
        raise ValueError(f"bad_words_ids must be a list of non-empty lists of token ids, got {words!r}")
    for w in words:
        for token in w:
            token_id({"bad_words_ids": token}, "bad_words_ids", vocab)
    pad, eos = token_id(generation, "pad_token_id", vocab), token_id(generation, "eos_token_id", vocab)
    fill = pad or eos  # generate()'s fill of finished beams: `pad_token_id or eos_token_id`, eos when pad is 0
    after_eos = eos if pad is None else pad  # greedy search's: pad_token_id, else the first eos_token_id
    return GenerationRules(
        **forced, bad_words=tuple(tuple(w) for w in words), beam_fill_id=fill, fill_id=after_eos
    )  # fmt: skip


MAX_JSON_DEPTH = 64  # a real config nests a few levels; a hostile one nests thousands (each level a list object)


def parse_json_config(raw: bytes, path) -> dict:
    """A checkpoint's JSON file (config.json, generation_config.json) as a dict. ValueError naming the file when it
    is not JSON, not an object, or nested deeper than MAX_JSON_DEPTH: checked before parsing, by a scan of its
    brackets, so that a hostile file cannot make the parser allocate a list per byte (a bracket inside a string
    counts too: real configs stay far below the limit)."""
    depth = 0
    for match in re.finditer(rb"[\[\]{}]", raw):
        depth += 1 if match.group() in (b"[", b"{") else -1
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"{path}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as error:  # bad JSON, bad UTF-8, an int too long
        raise ValueError(f"{path}: not valid JSON ({type(error).__name__}: {error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


# What config.json's numbers must be, checked before any translation (every family's names together: a field
# another family uses is checked too, which costs nothing). transformers computes with ints where it needs ints.
POSITIVE_INTS = (
    "vocab_size", "hidden_size", "n_embd", "d_model", "num_attention_heads", "n_head", "num_heads",
    "intermediate_size", "d_ff", "num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers",
    "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim",
    "max_position_embeddings", "n_positions", "d_kv", "relative_attention_num_buckets",
    "relative_attention_max_distance", "seq_length",
)  # fmt: skip
OPTIONAL_POSITIVE_INTS = (  # null means "as the family's default"
    "n_inner", "num_key_value_heads", "head_dim", "sliding_window", "num_decoder_layers", "decoder_vocab_size",
)  # fmt: skip
NON_NEGATIVE_INTS = ("type_vocab_size",)
TOKEN_IDS = (  # null, an id, or (end tokens) a list of ids
    "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "forced_bos_token_id",
    "forced_eos_token_id",
)  # fmt: skip
POSITIVE_FLOATS = ("rope_theta",)
NON_NEGATIVE_FLOATS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")
RATES = (  # dropout probabilities in [0, 1]; null counts as 0
    "dropout", "attention_dropout", "activation_dropout", "hidden_dropout_prob", "attention_probs_dropout_prob",
    "embd_pdrop", "attn_pdrop", "resid_pdrop", "dropout_rate", "hidden_dropout", "classifier_dropout",
)  # fmt: skip


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_config_values(c: dict, path) -> None:
    """ValueError naming the file and the field for the first number of config.json that transformers would not
    compute with: sizes that are not positive ints (2.7, "64", true), floats that are not finite (NaN, "nan",
    Infinity) or out of range, token ids that are not non-negative ints. Run before the config is translated, so
    that no size reaches an allocation and no NaN reaches the model."""

    def bad(name: str, value, expected: str) -> ValueError:
        return ValueError(f"{path}: {name}={value!r} ({type(value).__name__}): expected {expected}")

    for name in POSITIVE_INTS + OPTIONAL_POSITIVE_INTS + NON_NEGATIVE_INTS:
        if name not in c or (c[name] is None and name in OPTIONAL_POSITIVE_INTS):
            continue
        low = 0 if name in NON_NEGATIVE_INTS else 1
        if not is_int(c[name]) or c[name] < low:
            raise bad(name, c[name], "a positive integer" if low else "a non-negative integer")
    for name in TOKEN_IDS:
        value = c.get(name)
        for item in value if isinstance(value, list) else [value]:
            if item is not None and (not is_int(item) or item < 0):
                raise bad(name, value, "null, a non-negative integer token id, or a list of them")
    rope = c.get("rope_parameters")
    if rope is not None and not isinstance(rope, dict):
        raise bad("rope_parameters", rope, "an object")
    floats = [(name, c[name]) for name in POSITIVE_FLOATS + NON_NEGATIVE_FLOATS if name in c]
    floats += [(f"rope_parameters.{name}", rope[name]) for name in POSITIVE_FLOATS if rope and name in rope]
    for name, value in floats:
        if not is_finite_number(value):
            raise bad(name, value, "a finite number")
        if value < 0 or (value == 0 and name.endswith(POSITIVE_FLOATS)):
            raise bad(name, value, "a positive number" if name.endswith(POSITIVE_FLOATS) else "a number >= 0")
    for name in RATES:
        value = c.get(name)
        if value is not None and not (is_finite_number(value) and 0 <= value <= 1):
            raise bad(name, value, "a dropout probability in [0, 1] (or null)")


def read_generation_rules(directory, hf_config: dict, config: TransformerConfig):
    """(config, GenerationRules) of a checkpoint directory: generation_config.json when present, else config.json's
    fields of the same names (transformers' own fallback). Its decoder_start_token_id, when it names one, is the
    start token our decoding uses (config.bos_id of an encoder-decoder). ValueError naming the file when it is
    unreadable or its ids lie outside the vocabulary."""
    path = Path(directory) / "generation_config.json"
    generation = hf_config
    if path.is_file():
        try:
            raw = path.read_bytes()
        except OSError as error:
            raise ValueError(f"{path}: cannot read it ({error})") from None
        generation = parse_json_config(raw, path)
    try:
        rules = generation_rules_from_hf(generation, config.tgt_vocab_size)
        start = token_id(generation, "decoder_start_token_id", config.tgt_vocab_size)
        end = end_token_ids(generation, config.tgt_vocab_size)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{path if path.is_file() else 'config.json'}: {error}") from None
    if end is not None:  # generate() stops at generation_config.json's end tokens (config.json's without it)
        config = replace(config, eos_id=end)
    if start is not None and config.n_encoder_layers > 0 and config.n_decoder_layers > 0:
        config = replace(config, bos_id=start)
    return config, rules


def require(config: TransformerConfig, model_type: str, **expected) -> None:
    """ValueError listing every field of `config` that a `model_type` checkpoint cannot express."""
    wrong = [f"{k}={getattr(config, k)!r} (needs {v!r})" for k, v in expected.items() if getattr(config, k) != v]
    if wrong:
        raise ValueError(f"this model cannot be written as a {model_type!r} checkpoint: {', '.join(wrong)}")


def token_id(c: dict, name: str, vocab: int) -> int | None:
    """A special token id from config.json, None when absent; ValueError when outside the vocabulary."""
    value = c.get(name)
    if isinstance(value, list):  # some configs list several end-of-sequence ids
        value = value[0] if value else None
    if value is not None and not 0 <= value < vocab:
        raise ValueError(f"config.json: {name}={value} is not a token id of a vocabulary of {vocab}")
    return value


def end_token_ids(c: dict, vocab: int) -> int | tuple[int, ...] | None:
    """eos_token_id from config.json or generation_config.json: one id, or a tuple when the file lists several
    (Llama 3's [128001, 128009]: generation stops at any of them), None when absent. ValueError when one lies
    outside the vocabulary."""
    value = c.get("eos_token_id")
    if not isinstance(value, list):
        return token_id(c, "eos_token_id", vocab)
    ids = tuple(token_id({"eos_token_id": v}, "eos_token_id", vocab) for v in value)
    if None in ids:
        raise ValueError(f"config.json: eos_token_id={value} lists a null")
    if not ids:
        return None
    return ids[0] if len(ids) == 1 else ids


def heads(c: dict, d_model: int, n_heads: int) -> None:
    head_dim = c.get("head_dim")
    if head_dim is not None and head_dim * n_heads != d_model:
        raise ValueError(
            f"config.json: head_dim={head_dim} with {n_heads} heads != hidden size {d_model}; "
            "this project's heads split d_model evenly"
        )


# ----------------------------------------------------------------------------------------------
# BERT (BertModel; all-MiniLM-L6-v2): post-norm encoder, learned positions, token types, embedding norm.


def bert_from_hf(c: dict, dropout: float | None = None) -> TransformerConfig:
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"position_embedding_type {c['position_embedding_type']!r} is not supported (only 'absolute')")
    if c.get("is_decoder") or c.get("add_cross_attention"):
        raise ValueError("a BERT decoder (is_decoder / add_cross_attention) is not supported: only the encoder")
    V = c["vocab_size"]
    return TransformerConfig(
        src_vocab_size=V,
        tgt_vocab_size=V,
        d_model=c["hidden_size"],
        n_heads=c["num_attention_heads"],
        d_ff=c["intermediate_size"],
        n_encoder_layers=c["num_hidden_layers"],
        n_decoder_layers=0,
        **dropout_from_hf(c, BERT_DROPOUT, dropout),
        activation=activation_from_hf(c.get("hidden_act", "gelu")),
        norm_first=False,
        positional="learned",
        max_len=c["max_position_embeddings"],
        layer_norm_eps=c.get("layer_norm_eps", 1e-12),
        pad_id=token_id(c, "pad_token_id", V),
        bos_id=token_id(c, "bos_token_id", V),
        eos_id=end_token_ids(c, V),
        scale_embeddings=False,
        type_vocab_size=c.get("type_vocab_size", 2),
        embedding_norm=True,
        # word_embeddings is nn.Embedding(padding_idx=pad): [PAD]'s row gets no gradient from lookups
        embedding_padding_idx=c.get("pad_token_id") is not None,
    )


def bert_to_hf(config: TransformerConfig) -> dict:
    return {
        "vocab_size": config.src_vocab_size,
        "hidden_size": config.d_model,
        "num_attention_heads": config.n_heads,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_encoder_layers,
        **dropout_to_hf(config, "bert", BERT_DROPOUT),
        "hidden_act": {"gelu_tanh": "gelu_new"}.get(config.activation, config.activation),
        "max_position_embeddings": config.max_len,
        "layer_norm_eps": config.layer_norm_eps,
        "type_vocab_size": config.type_vocab_size,
        "pad_token_id": config.pad_id,
        "position_embedding_type": "absolute",
    }


BERT_LAYER = "encoder.layer.{i}"
BERT = Family(
    model_type="bert",
    model_class="EncoderModel",
    architecture="BertModel",
    prefixes=("", "bert."),
    rules=(
        Rule("encoder.token_embedding.weight", "embeddings.word_embeddings.weight"),
        Rule("encoder.position_embedding.weight", "embeddings.position_embeddings.weight"),
        Rule("encoder.token_type_embedding.weight", "embeddings.token_type_embeddings.weight"),
        Rule("encoder.embedding_norm.weight", "embeddings.LayerNorm.weight"),
        Rule("encoder.embedding_norm.bias", "embeddings.LayerNorm.bias"),
        *(
            Rule(f"encoder.layers.{{i}}.{ours}.{w}", f"{BERT_LAYER}.{theirs}.{w}")
            for ours, theirs in (
                ("self_attn.q_proj", "attention.self.query"),
                ("self_attn.k_proj", "attention.self.key"),
                ("self_attn.v_proj", "attention.self.value"),
                ("self_attn.out_proj", "attention.output.dense"),
                ("self_attn_norm", "attention.output.LayerNorm"),
                ("ffn.linear1", "intermediate.dense"),
                ("ffn.linear2", "output.dense"),
                ("ffn_norm", "output.LayerNorm"),
            )
            for w in ("weight", "bias")
        ),
        *(Rule(f"pooler.dense.{w}", f"pooler.dense.{w}", when=("pooler", True)) for w in ("weight", "bias")),
    ),
    skipped=(
        r"embeddings\.position_ids",  # a buffer: 0 .. max_len - 1
        r"embeddings\.token_type_ids",  # a buffer of zeros
        r"pooler\..*",  # the [CLS] pooler, when the config says none (config.pooler: set when the file has one)
        r"cls\..*",  # the pre-training heads (masked LM, next sentence) of BertForPreTraining / MaskedLM
    ),
    from_hf=bert_from_hf,
    to_hf=bert_to_hf,
    detected=(("pooler", r"pooler\.dense\.weight"),),
    supports={  # an encoder: no output projection, so its fields take any value
        "activation": ANY,
        "positional": "learned",
        "scale_embeddings": False,
        "embedding_norm": True,
        "type_vocab_size": ANY,
        "qkv_bias": (None, True),
        "tie_embeddings": ANY,
        "share_embeddings": ANY,
        "output_bias": ANY,
        "pooler": ANY,
    },  # fmt: skip
)


# ----------------------------------------------------------------------------------------------
# GPT-2 (GPT2LMHeadModel): pre-norm decoder, learned positions, tanh GELU, fused c_attn, Conv1D layout,
# tied output projection without a bias, no padding token.


def gpt2_from_hf(c: dict, dropout: float | None = None) -> TransformerConfig:
    unsupported = {
        "scale_attn_by_inverse_layer_idx": False,
        "scale_attn_weights": True,
        "add_cross_attention": False,
    }
    for key, ok in unsupported.items():
        if c.get(key, ok) != ok:
            raise ValueError(f"config.json: {key}={c[key]!r} is not supported (only {ok!r})")
    V, D = c["vocab_size"], c["n_embd"]
    return TransformerConfig(
        src_vocab_size=V,
        tgt_vocab_size=V,
        d_model=D,
        n_heads=c["n_head"],
        d_ff=c.get("n_inner") or 4 * D,
        n_encoder_layers=0,
        n_decoder_layers=c["n_layer"],
        **dropout_from_hf(c, GPT2_DROPOUT, dropout),
        activation=activation_from_hf(c.get("activation_function", "gelu_new")),
        norm_first=True,
        positional="learned",
        max_len=c["n_positions"],
        layer_norm_eps=c.get("layer_norm_epsilon", 1e-5),
        pad_id=token_id(c, "pad_token_id", V),
        bos_id=token_id(c, "bos_token_id", V),
        eos_id=end_token_ids(c, V),
        tie_embeddings=c.get("tie_word_embeddings", True),
        scale_embeddings=False,
        output_bias=False,
    )


def gpt2_to_hf(config: TransformerConfig) -> dict:
    return {
        "vocab_size": config.tgt_vocab_size,
        "n_embd": config.d_model,
        "n_head": config.n_heads,
        "n_inner": config.d_ff,
        "n_layer": config.n_decoder_layers,
        "n_positions": config.max_len,
        **dropout_to_hf(config, "gpt2", GPT2_DROPOUT),
        "activation_function": {"gelu_tanh": "gelu_new"}.get(config.activation, config.activation),
        "layer_norm_epsilon": config.layer_norm_eps,
        "tie_word_embeddings": config.tie_embeddings,
        "pad_token_id": config.pad_id,
        "bos_token_id": config.bos_id,
        "eos_token_id": config.eos_id,
    }


GPT2 = Family(
    model_type="gpt2",
    model_class="TransformerLM",
    architecture="GPT2LMHeadModel",
    prefixes=("transformer.", ""),
    rules=(
        Rule("decoder.token_embedding.weight", "wte.weight"),
        Rule("decoder.position_embedding.weight", "wpe.weight"),
        Rule("decoder.layers.{i}.self_attn_norm.weight", "h.{i}.ln_1.weight"),
        Rule("decoder.layers.{i}.self_attn_norm.bias", "h.{i}.ln_1.bias"),
        *(
            Rule(
                f"decoder.layers.{{i}}.self_attn.{p}_proj.weight", "h.{i}.attn.c_attn.weight", conv1d=True, part=(k, 3)
            )
            for k, p in enumerate("qkv")
        ),
        *(
            Rule(f"decoder.layers.{{i}}.self_attn.{p}_proj.bias", "h.{i}.attn.c_attn.bias", part=(k, 3))
            for k, p in enumerate("qkv")
        ),
        Rule("decoder.layers.{i}.self_attn.out_proj.weight", "h.{i}.attn.c_proj.weight", conv1d=True),
        Rule("decoder.layers.{i}.self_attn.out_proj.bias", "h.{i}.attn.c_proj.bias"),
        Rule("decoder.layers.{i}.ffn_norm.weight", "h.{i}.ln_2.weight"),
        Rule("decoder.layers.{i}.ffn_norm.bias", "h.{i}.ln_2.bias"),
        Rule("decoder.layers.{i}.ffn.linear1.weight", "h.{i}.mlp.c_fc.weight", conv1d=True),
        Rule("decoder.layers.{i}.ffn.linear1.bias", "h.{i}.mlp.c_fc.bias"),
        Rule("decoder.layers.{i}.ffn.linear2.weight", "h.{i}.mlp.c_proj.weight", conv1d=True),
        Rule("decoder.layers.{i}.ffn.linear2.bias", "h.{i}.mlp.c_proj.bias"),
        Rule("decoder.final_norm.weight", "ln_f.weight"),
        Rule("decoder.final_norm.bias", "ln_f.bias"),
        Rule("output_proj.weight", "lm_head.weight", head=True),  # only when untied
    ),
    skipped=(
        r"h\.\d+\.attn\.(bias|masked_bias)",  # causal-mask buffers of older checkpoints
        r"lm_head\.weight",  # when tied: a copy of wte.weight (used as output_proj.weight when untied)
    ),
    from_hf=gpt2_from_hf,
    to_hf=gpt2_to_hf,
    supports={
        "activation": ANY,
        "norm_first": True,
        "positional": "learned",
        "scale_embeddings": False,
        "tie_embeddings": ANY,
        "output_bias": False,
        "qkv_bias": (None, True),
    },  # fmt: skip
    tied=(("lm_head.weight", "transformer.wte.weight", "tie_embeddings"),),
)


# ----------------------------------------------------------------------------------------------
# Llama (LlamaForCausalLM): pre-norm RMSNorm decoder, rotary positions, SwiGLU, grouped-query attention,
# no biases.


def llama_from_hf(c: dict, dropout: float | None = None) -> TransformerConfig:
    rope = c.get("rope_parameters") or {}
    scaling = c.get("rope_scaling")
    rope_type = rope.get("rope_type", (scaling or {}).get("rope_type", "default"))
    if rope_type != "default" or (scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default")):
        raise ValueError(f"rope_type {rope_type!r} / rope_scaling {scaling!r} is not supported (only plain RoPE)")
    if c.get("pretraining_tp", 1) != 1:
        raise ValueError(f"pretraining_tp={c['pretraining_tp']} is not supported (only 1)")
    if c.get("attention_bias", False) != c.get("mlp_bias", False):
        raise ValueError(
            f"attention_bias={c.get('attention_bias')} and mlp_bias={c.get('mlp_bias')} differ; this project's "
            "`bias` covers both"
        )
    V, D, H = c["vocab_size"], c["hidden_size"], c["num_attention_heads"]
    heads(c, D, H)
    n_kv = c.get("num_key_value_heads") or H
    return TransformerConfig(
        src_vocab_size=V,
        tgt_vocab_size=V,
        d_model=D,
        n_heads=H,
        d_ff=c["intermediate_size"],
        n_encoder_layers=0,
        n_decoder_layers=c["num_hidden_layers"],
        **dropout_from_hf(c, LLAMA_DROPOUT, dropout),
        activation=activation_from_hf(c.get("hidden_act", "silu")),
        norm_first=True,
        positional="rope",
        max_len=c.get("max_position_embeddings", 2048),
        layer_norm_eps=c.get("rms_norm_eps", 1e-6),
        pad_id=token_id(c, "pad_token_id", V),
        bos_id=token_id(c, "bos_token_id", V),
        eos_id=end_token_ids(c, V),
        tie_embeddings=c.get("tie_word_embeddings", False),
        scale_embeddings=False,
        norm="rms",
        rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
        gated_ffn=True,
        n_kv_heads=None if n_kv == H else n_kv,
        bias=bool(c.get("attention_bias", False)),
        output_bias=False,
        embedding_padding_idx=c.get("pad_token_id") is not None,  # embed_tokens: nn.Embedding(padding_idx=pad)
    )


def llama_to_hf(config: TransformerConfig, model_type: str = "llama") -> dict:
    return {
        "vocab_size": config.tgt_vocab_size,
        "hidden_size": config.d_model,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_decoder_layers,
        **dropout_to_hf(config, "llama", LLAMA_DROPOUT),
        "hidden_act": config.activation,
        "max_position_embeddings": config.max_len,
        "rms_norm_eps": config.layer_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "attention_bias": config.bias,
        "mlp_bias": config.bias,
        "tie_word_embeddings": config.tie_embeddings,
        "pad_token_id": config.pad_id,
        "bos_token_id": config.bos_id,
        "eos_token_id": config.eos_id,
    }


LLAMA_SUPPORTS = {
    "activation": ("silu", "relu", "gelu"), "norm": "rms", "norm_first": True, "positional": "rope",
    "rope_theta": ANY, "gated_ffn": True, "n_kv_heads": ANY, "bias": ANY, "qkv_bias": lambda c: (None, c.bias),
    "tie_embeddings": ANY, "scale_embeddings": False, "output_bias": False,
}  # fmt: skip
LLAMA = Family(
    model_type="llama",
    model_class="TransformerLM",
    architecture="LlamaForCausalLM",
    prefixes=("model.", ""),
    rules=(
        Rule("decoder.token_embedding.weight", "embed_tokens.weight"),
        Rule("decoder.layers.{i}.self_attn_norm.weight", "layers.{i}.input_layernorm.weight"),
        *(
            Rule(
                f"decoder.layers.{{i}}.self_attn.{p}_proj.{w}",
                f"layers.{{i}}.self_attn.{p if p != 'out' else 'o'}_proj.{w}",
            )
            for p in ("q", "k", "v", "out")
            for w in ("weight", "bias")
        ),
        Rule("decoder.layers.{i}.ffn_norm.weight", "layers.{i}.post_attention_layernorm.weight"),
        *(
            Rule(f"decoder.layers.{{i}}.ffn.{ours}.{w}", f"layers.{{i}}.mlp.{theirs}.{w}")
            for ours, theirs in (("gate", "gate_proj"), ("linear1", "up_proj"), ("linear2", "down_proj"))
            for w in ("weight", "bias")
        ),
        Rule("decoder.final_norm.weight", "norm.weight"),
        Rule("output_proj.weight", "lm_head.weight", head=True),  # only when untied
    ),
    skipped=(
        r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq",  # a buffer of older checkpoints: recomputed
        r"lm_head\.weight",  # when tied: a copy of embed_tokens.weight
    ),
    from_hf=llama_from_hf,
    to_hf=llama_to_hf,
    supports=LLAMA_SUPPORTS,
    tied=(("lm_head.weight", "model.embed_tokens.weight", "tie_embeddings"),),
)


# ----------------------------------------------------------------------------------------------
# Mistral (MistralForCausalLM): Llama with a sliding window on its causal self-attention (query i sees the
# keys i - window < j <= i), and no biases. Qwen2 (Qwen2ForCausalLM): Llama with biases on q, k and v but not
# on the output projection nor the MLP. Both read and write Llama's table: only the config translation differs.


def mistral_from_hf(c: dict, dropout: float | None = None) -> TransformerConfig:
    config = llama_from_hf(c, dropout)
    window = c.get("sliding_window")
    return replace(config, sliding_window=None if window is None else int(window))


def mistral_to_hf(config: TransformerConfig) -> dict:
    out = llama_to_hf(config, "mistral")
    for name in ("attention_bias", "mlp_bias"):  # MistralConfig has neither: no biases anywhere
        out.pop(name)
    return {**out, "sliding_window": config.sliding_window}


def qwen2_from_hf(c: dict, dropout: float | None = None) -> TransformerConfig:
    if c.get("use_sliding_window", False):
        raise ValueError(
            "use_sliding_window=True is not supported for qwen2 (a window on some layers only); only False"
        )
    return replace(llama_from_hf(c, dropout), bias=False, qkv_bias=True)


def qwen2_to_hf(config: TransformerConfig) -> dict:
    out = llama_to_hf(config, "qwen2")
    for name in ("attention_bias", "mlp_bias"):  # Qwen2Config: q, k, v biases always, nothing else
        out.pop(name)
    return {**out, "use_sliding_window": False}


MISTRAL = replace(
    LLAMA, model_type="mistral", architecture="MistralForCausalLM", from_hf=mistral_from_hf, to_hf=mistral_to_hf,
    supports=LLAMA_SUPPORTS | {"sliding_window": ANY, "bias": False, "qkv_bias": (None, False)},
)  # fmt: skip
QWEN2 = replace(
    LLAMA, model_type="qwen2", architecture="Qwen2ForCausalLM", from_hf=qwen2_from_hf, to_hf=qwen2_to_hf,
    supports=LLAMA_SUPPORTS | {"bias": False, "qkv_bias": True},
)  # fmt: skip


# ----------------------------------------------------------------------------------------------
# BLOOM (BloomForCausalLM): pre-norm LayerNorm decoder with ALiBi instead of a position table, a LayerNorm
# after the token embeddings, tanh GELU in a 4D MLP, biases everywhere, a fused query_key_value interleaved head
# by head, and an output projection tied to the embeddings.

BLOOM_DROPOUT = {"hidden_dropout": (("residual",), 0.0), "attention_dropout": (("attention",), 0.0)}


def bloom_from_hf(c: dict, dropout: float | None = None) -> TransformerConfig:
    for key, ok in (("apply_residual_connection_post_layernorm", False), ("pretraining_tp", 1)):
        if c.get(key, ok) != ok:
            raise ValueError(f"config.json: {key}={c[key]!r} is not supported (only {ok!r})")
    V, D = c["vocab_size"], c.get("hidden_size", c.get("n_embed", 64))
    return TransformerConfig(
        src_vocab_size=V,
        tgt_vocab_size=V,
        d_model=D,
        n_heads=c["n_head"],
        d_ff=4 * D,
        n_encoder_layers=0,
        n_decoder_layers=c["n_layer"],
        **dropout_from_hf(c, BLOOM_DROPOUT, dropout),
        activation="gelu_tanh",
        norm_first=True,
        positional="alibi",
        max_len=c.get("seq_length") or 2048,  # ALiBi has no table: the longest sequence decoding may run
        layer_norm_eps=c.get("layer_norm_epsilon", 1e-5),
        pad_id=token_id(c, "pad_token_id", V),
        bos_id=token_id(c, "bos_token_id", V),
        eos_id=end_token_ids(c, V),
        tie_embeddings=c.get("tie_word_embeddings", True),
        scale_embeddings=False,
        output_bias=False,
        embedding_norm=True,
    )


def bloom_to_hf(config: TransformerConfig) -> dict:
    require(config, "bloom", d_ff=4 * config.d_model)  # BLOOM's MLP is 4 x hidden_size, not a field of its own
    return {
        "vocab_size": config.tgt_vocab_size,
        "hidden_size": config.d_model,
        "n_head": config.n_heads,
        "n_layer": config.n_decoder_layers,
        **dropout_to_hf(config, "bloom", BLOOM_DROPOUT),
        "layer_norm_epsilon": config.layer_norm_eps,
        "seq_length": config.max_len,
        "apply_residual_connection_post_layernorm": False,
        "pretraining_tp": 1,
        "tie_word_embeddings": config.tie_embeddings,
        "pad_token_id": config.pad_id,
        "bos_token_id": config.bos_id,
        "eos_token_id": config.eos_id,
    }


BLOOM = Family(
    model_type="bloom",
    model_class="TransformerLM",
    architecture="BloomForCausalLM",
    prefixes=("transformer.", ""),
    rules=(
        Rule("decoder.token_embedding.weight", "word_embeddings.weight"),
        Rule("decoder.embedding_norm.weight", "word_embeddings_layernorm.weight"),
        Rule("decoder.embedding_norm.bias", "word_embeddings_layernorm.bias"),
        *(
            Rule(
                f"decoder.layers.{{i}}.self_attn.{p}_proj.{w}",
                f"h.{{i}}.self_attention.query_key_value.{w}",
                part=(k, 3),
                per_head=True,
            )
            for k, p in enumerate("qkv")
            for w in ("weight", "bias")
        ),
        *(
            Rule(f"decoder.layers.{{i}}.{ours}.{w}", f"h.{{i}}.{theirs}.{w}")
            for ours, theirs in (
                ("self_attn_norm", "input_layernorm"),
                ("self_attn.out_proj", "self_attention.dense"),
                ("ffn_norm", "post_attention_layernorm"),
                ("ffn.linear1", "mlp.dense_h_to_4h"),
                ("ffn.linear2", "mlp.dense_4h_to_h"),
            )
            for w in ("weight", "bias")
        ),
        Rule("decoder.final_norm.weight", "ln_f.weight"),
        Rule("decoder.final_norm.bias", "ln_f.bias"),
        Rule("output_proj.weight", "lm_head.weight", head=True),  # only when untied
    ),
    skipped=(r"lm_head\.weight",),  # when tied: a copy of word_embeddings.weight
    from_hf=bloom_from_hf,
    to_hf=bloom_to_hf,
    supports={
        "activation": "gelu_tanh",
        "norm_first": True,
        "positional": "alibi",
        "scale_embeddings": False,
        "embedding_norm": True,
        "tie_embeddings": ANY,
        "output_bias": False,
        "qkv_bias": (None, True),
    },  # fmt: skip
    tied=(("lm_head.weight", "transformer.word_embeddings.weight", "tie_embeddings"),),
)


# ----------------------------------------------------------------------------------------------
# The paper's encoder-decoder: Marian (MarianMTModel, opus-mt) and BART (BartForConditionalGeneration).
# Both post-norm, one token table shared by encoder, decoder and output projection, and a
# final_logits_bias as the output bias. Marian: the split-layout sinusoids (computed, not stored).
# BART: learned positions stored with an offset of 2 rows, and a LayerNorm after each stack's embeddings.


def seq2seq_from_hf(c: dict, dropout: float | None, model_type: str) -> TransformerConfig:
    """The config both families share; `model_type` picks the positions and the embedding norm."""
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if c[a] != c[b]:
            raise ValueError(f"config.json: {a}={c[a]} and {b}={c[b]} differ; this project uses one value for both")
    if c.get("normalize_before", False) or c.get("add_final_layer_norm", False):
        raise ValueError("config.json: pre-norm variants (normalize_before / add_final_layer_norm) are not supported")
    shared = c.get("share_encoder_decoder_embeddings", True)
    V = c["vocab_size"]
    V_tgt = c.get("decoder_vocab_size") or V if not shared else V
    start = c.get("decoder_start_token_id")
    return TransformerConfig(
        src_vocab_size=V,
        tgt_vocab_size=V_tgt,
        d_model=c["d_model"],
        n_heads=c["encoder_attention_heads"],
        d_ff=c["encoder_ffn_dim"],
        n_encoder_layers=c["encoder_layers"],
        n_decoder_layers=c["decoder_layers"],
        **dropout_from_hf(c, SEQ2SEQ_DROPOUT, dropout),
        activation=activation_from_hf(c.get("activation_function", "gelu")),
        norm_first=False,
        positional="sinusoidal" if model_type == "marian" else "learned",
        sinusoid_layout="split",
        max_len=c["max_position_embeddings"],
        layer_norm_eps=1e-5,  # nn.LayerNorm's default, which both use
        pad_id=token_id(c, "pad_token_id", min(V, V_tgt)),
        bos_id=None if start is None else token_id(c, "decoder_start_token_id", V_tgt),  # the decoder's start token
        eos_id=end_token_ids(c, V_tgt),
        tie_embeddings=c.get("tie_word_embeddings", True),
        scale_embeddings=bool(c.get("scale_embedding", False)),
        embedding_norm=model_type == "bart",
        share_embeddings=shared,
        # Marian's tables are nn.Embedding(padding_idx=pad): its lookups (the decoder start token too) pass
        # no gradient; BART's are not (transformers 5).
        embedding_padding_idx=model_type == "marian" and c.get("pad_token_id") is not None,
    )


def seq2seq_to_hf(config: TransformerConfig, model_type: str) -> dict:
    out = {
        "vocab_size": config.src_vocab_size,
        "d_model": config.d_model,
        "encoder_attention_heads": config.n_heads,
        "decoder_attention_heads": config.n_heads,
        "encoder_ffn_dim": config.d_ff,
        "decoder_ffn_dim": config.d_ff,
        "encoder_layers": config.n_encoder_layers,
        "decoder_layers": config.n_decoder_layers,
        **dropout_to_hf(config, model_type, SEQ2SEQ_DROPOUT),
        "activation_function": {"gelu_tanh": "gelu_new"}.get(config.activation, config.activation),
        "max_position_embeddings": config.max_len,
        "pad_token_id": config.pad_id,
        "decoder_start_token_id": config.bos_id,
        "eos_token_id": config.eos_id,
        "forced_eos_token_id": config.eos_id,
        "tie_word_embeddings": config.tie_embeddings,
        "scale_embedding": config.scale_embeddings,
        "is_encoder_decoder": True,
    }
    if model_type == "marian":
        one_vocabulary = config.src_vocab_size == config.tgt_vocab_size
        out |= {  # one vocabulary: the class keeps `shared` (separate tables are then written as untied copies)
            "share_encoder_decoder_embeddings": config.share_embeddings or one_vocabulary,
            "decoder_vocab_size": config.tgt_vocab_size,
        }
    return out


def seq2seq_rules(model_type: str) -> tuple[Rule, ...]:
    """The table Marian and BART share, with BART's stored positions and embedding norms added."""
    shared, separate = ("share_embeddings", True), ("share_embeddings", False)
    rules = [
        Rule("decoder.token_embedding.weight", "shared.weight", when=shared),
        Rule("encoder.token_embedding.weight", "encoder.embed_tokens.weight", when=separate),
        Rule("decoder.token_embedding.weight", "decoder.embed_tokens.weight", when=separate),
    ]
    sublayers = {
        "encoder": (("self_attn", "self_attn"), ("self_attn_norm", "self_attn_layer_norm")),
        "decoder": (
            ("self_attn", "self_attn"),
            ("self_attn_norm", "self_attn_layer_norm"),
            ("cross_attn", "encoder_attn"),
            ("cross_attn_norm", "encoder_attn_layer_norm"),
        ),
    }
    for stack in ("encoder", "decoder"):
        if model_type == "bart":
            rules.append(Rule(f"{stack}.position_embedding.weight", f"{stack}.embed_positions.weight", offset=2))
            rules += [
                Rule(f"{stack}.embedding_norm.{w}", f"{stack}.layernorm_embedding.{w}") for w in ("weight", "bias")
            ]
        layer = f"{stack}.layers.{{i}}"
        for ours, theirs in sublayers[stack]:
            if ours.endswith("norm"):
                rules += [Rule(f"{layer}.{ours}.{w}", f"{layer}.{theirs}.{w}") for w in ("weight", "bias")]
            else:
                rules += [
                    Rule(f"{layer}.{ours}.{p}_proj.{w}", f"{layer}.{theirs}.{p}_proj.{w}")
                    for p in ("q", "k", "v", "out")
                    for w in ("weight", "bias")
                ]
        for ours, theirs in (("ffn.linear1", "fc1"), ("ffn.linear2", "fc2"), ("ffn_norm", "final_layer_norm")):
            rules += [Rule(f"{layer}.{ours}.{w}", f"{layer}.{theirs}.{w}") for w in ("weight", "bias")]
    rules += [
        Rule("output_proj.weight", "lm_head.weight", head=True),  # only when untied
        Rule("output_proj.bias", "final_logits_bias", head=True, row=True),  # a (1, V) buffer
    ]
    return tuple(rules)


SEQ2SEQ_SKIPPED = (
    r"(encoder|decoder)\.embed_tokens\.weight",  # with shared embeddings: copies of shared.weight (checked equal)
    r"shared\.weight",  # with separate tables: unused
    r"lm_head\.weight",  # when tied: a copy of the decoder's table (checked equal)
)
SEQ2SEQ_TIED = (
    ("model.encoder.embed_tokens.weight", "model.shared.weight", "share_embeddings"),
    ("model.decoder.embed_tokens.weight", "model.shared.weight", "share_embeddings"),
    ("lm_head.weight", "model.shared.weight", "tie_embeddings"),
    ("lm_head.weight", "model.decoder.embed_tokens.weight", "tie_embeddings"),  # separate tables, tied output
)

SEQ2SEQ_SUPPORTS = {
    "activation": ANY, "scale_embeddings": ANY, "tie_embeddings": ANY, "share_embeddings": ANY,
    "qkv_bias": (None, True),
}  # fmt: skip
MARIAN = Family(
    model_type="marian",
    model_class="Transformer",
    architecture="MarianMTModel",
    prefixes=("model.", ""),
    rules=seq2seq_rules("marian"),
    # the sinusoids: computed from the config (some checkpoints store them; they are not parameters)
    skipped=(*SEQ2SEQ_SKIPPED, r"(encoder|decoder)\.embed_positions\.weight"),
    from_hf=lambda c, dropout=None: seq2seq_from_hf(c, dropout, "marian"),
    to_hf=lambda config: seq2seq_to_hf(config, "marian"),
    supports=SEQ2SEQ_SUPPORTS | {"sinusoid_layout": "split"},
    tied=SEQ2SEQ_TIED,
)

BART = Family(
    model_type="bart",
    model_class="Transformer",
    architecture="BartForConditionalGeneration",
    prefixes=("model.", ""),
    rules=seq2seq_rules("bart"),
    skipped=SEQ2SEQ_SKIPPED,
    from_hf=lambda c, dropout=None: seq2seq_from_hf(c, dropout, "bart"),
    to_hf=lambda config: seq2seq_to_hf(config, "bart"),
    supports=SEQ2SEQ_SUPPORTS | {"positional": "learned", "embedding_norm": True, "sinusoid_layout": ANY},
    tied=SEQ2SEQ_TIED,
)


# ----------------------------------------------------------------------------------------------
# T5 (T5ForConditionalGeneration; the original ReLU model and v1.1's gated GELU): pre-norm RMSNorm encoder-decoder
# without biases, no position table but one learned relative position bias per stack (stored on block 0, read by
# every layer), attention without the 1/sqrt(d) scale, one token table for both stacks, and a tied head that reads
# d_model^-0.5 times the hidden states.

T5_DROPOUT = {"dropout_rate": (("embedding", "attention", "activation", "residual"), 0.1)}
T5_ACTIVATIONS = {"relu": ("relu", False), "gated-gelu": ("gelu_tanh", True), "gated-relu": ("relu", True)}


def t5_from_hf(c: dict, dropout: float | None = None) -> TransformerConfig:
    proj = c.get("feed_forward_proj", "relu")
    if proj not in T5_ACTIVATIONS:
        supported = sorted(T5_ACTIVATIONS)
        raise ValueError(f"config.json: feed_forward_proj={proj!r} is not supported; supported: {supported}")
    activation, gated = T5_ACTIVATIONS[proj]
    V, D, H = c["vocab_size"], c["d_model"], c["num_heads"]
    if c.get("d_kv", D // H) * H != D:
        raise ValueError(
            f"config.json: d_kv={c.get('d_kv')} with {H} heads != d_model {D}; heads must split d_model evenly"
        )
    # transformers 5 always ties T5's head to `shared` (unless the file holds a different lm_head.weight: then
    # resolve_ties unties it) and reads the d_model^-0.5 rescaling from scale_decoder_outputs; older configs
    # said both with tie_word_embeddings (false: v1.1's own head, unscaled)
    scaled = c.get("scale_decoder_outputs", c.get("tie_word_embeddings", True) is not False)
    start = c.get("decoder_start_token_id", c.get("pad_token_id", 0))
    return TransformerConfig(
        src_vocab_size=V,
        tgt_vocab_size=V,
        d_model=D,
        n_heads=H,
        d_ff=c["d_ff"],
        n_encoder_layers=c["num_layers"],
        n_decoder_layers=c.get("num_decoder_layers") or c["num_layers"],
        **dropout_from_hf(c, T5_DROPOUT, dropout),
        activation=activation,
        gated_ffn=gated,
        norm="rms",
        norm_first=True,
        positional="relative",
        relative_buckets=c.get("relative_attention_num_buckets", 32),
        relative_max_distance=c.get("relative_attention_max_distance", 128),
        attention_scale=1.0,  # T5 folds 1/sqrt(d) into its initialisation
        max_len=c.get("n_positions") or 512,  # no table: the longest sequence decoding may run
        layer_norm_eps=c.get("layer_norm_epsilon", 1e-6),
        pad_id=token_id(c, "pad_token_id", V),
        bos_id=token_id({"start": start}, "start", V),  # the decoder's start token (T5's is pad)
        eos_id=end_token_ids(c, V),
        tie_embeddings=True,
        output_scale=D**-0.5 if scaled else 1.0,
        scale_embeddings=False,
        share_embeddings=True,
        bias=False,
        output_bias=False,
    )


def t5_to_hf(config: TransformerConfig) -> dict:
    scaled = config.output_scale != 1.0
    proj = {(a, g): name for name, (a, g) in T5_ACTIVATIONS.items()}.get((config.activation, config.gated_ffn))
    if proj is None:
        raise ValueError(
            f"this model cannot be written as a 't5' checkpoint: activation={config.activation!r} with "
            f"gated_ffn={config.gated_ffn} (T5 has relu, gated gelu_tanh, gated relu)"
        )
    return {
        "vocab_size": config.tgt_vocab_size,
        "d_model": config.d_model,
        "d_kv": config.head_dim,
        "d_ff": config.d_ff,
        "num_heads": config.n_heads,
        "num_layers": config.n_encoder_layers,
        "num_decoder_layers": config.n_decoder_layers,
        **dropout_to_hf(config, "t5", T5_DROPOUT),
        "feed_forward_proj": proj,
        "relative_attention_num_buckets": config.relative_buckets,
        "relative_attention_max_distance": config.relative_max_distance,
        "layer_norm_epsilon": config.layer_norm_eps,
        # transformers 5 reads the scale from scale_decoder_outputs, older versions from tie_word_embeddings; an
        # untied head is written as lm_head.weight (transformers keeps a tied copy that differs apart)
        "tie_word_embeddings": scaled,
        "scale_decoder_outputs": scaled,
        "pad_token_id": config.pad_id,
        "eos_token_id": config.eos_id,
        "decoder_start_token_id": config.bos_id,
        "is_encoder_decoder": True,
    }


def t5_rules() -> tuple[Rule, ...]:
    attention = (("q", "q"), ("k", "k"), ("v", "v"), ("out", "o"))
    shared, separate = ("share_embeddings", True), ("share_embeddings", False)
    rules = [
        Rule("decoder.token_embedding.weight", "shared.weight", when=shared),
        Rule("encoder.token_embedding.weight", "encoder.embed_tokens.weight", when=separate),
        Rule("decoder.token_embedding.weight", "decoder.embed_tokens.weight", when=separate),
        Rule("encoder.relative_bias.weight", "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
        Rule("decoder.relative_bias.weight", "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
        Rule("encoder.final_norm.weight", "encoder.final_layer_norm.weight"),
        Rule("decoder.final_norm.weight", "decoder.final_layer_norm.weight"),
        Rule("output_proj.weight", "lm_head.weight", head=True),  # only when untied
    ]
    for stack, sublayers in (("encoder", ("self_attn", "ffn")), ("decoder", ("self_attn", "cross_attn", "ffn"))):
        for n, sublayer in enumerate(sublayers):
            block = f"{stack}.block.{{i}}.layer.{n}"
            rules.append(Rule(f"{stack}.layers.{{i}}.{sublayer}_norm.weight", f"{block}.layer_norm.weight"))
            if sublayer == "ffn":
                dense = f"{block}.DenseReluDense"
                rules += [
                    Rule(f"{stack}.layers.{{i}}.ffn.gate.weight", f"{dense}.wi_0.weight", when=("gated_ffn", True)),
                    Rule(f"{stack}.layers.{{i}}.ffn.linear1.weight", f"{dense}.wi_1.weight", when=("gated_ffn", True)),
                    Rule(f"{stack}.layers.{{i}}.ffn.linear1.weight", f"{dense}.wi.weight", when=("gated_ffn", False)),
                    Rule(f"{stack}.layers.{{i}}.ffn.linear2.weight", f"{dense}.wo.weight"),
                ]
            else:
                module = "SelfAttention" if sublayer == "self_attn" else "EncDecAttention"
                rules += [
                    Rule(f"{stack}.layers.{{i}}.{sublayer}.{ours}_proj.weight", f"{block}.{module}.{theirs}.weight")
                    for ours, theirs in attention
                ]
    return tuple(rules)


T5 = Family(
    model_type="t5",
    model_class="Transformer",
    architecture="T5ForConditionalGeneration",
    prefixes=("",),
    rules=t5_rules(),
    skipped=(
        r"(encoder|decoder)\.embed_tokens\.weight",  # the stacks' views of shared.weight (checked equal)
        r"shared\.weight",  # with separate tables: unused
        r"lm_head\.weight",  # when tied: shared.weight again (checked equal)
    ),
    from_hf=t5_from_hf,
    to_hf=t5_to_hf,
    supports={
        "activation": ("relu", "gelu_tanh"),
        "gated_ffn": ANY,
        "norm": "rms",
        "norm_first": True,
        "positional": "relative",
        "relative_buckets": ANY,
        "relative_max_distance": ANY,
        "attention_scale": 1.0,
        "output_scale": lambda c: (1.0, c.d_model**-0.5),
        "bias": False,
        "qkv_bias": (None, False),
        "output_bias": False,
        "scale_embeddings": False,
        "share_embeddings": ANY,
        "tie_embeddings": ANY,
    },  # fmt: skip
    tied=(
        ("encoder.embed_tokens.weight", "shared.weight", "share_embeddings"),
        ("decoder.embed_tokens.weight", "shared.weight", "share_embeddings"),
        ("lm_head.weight", "shared.weight", "tie_embeddings"),
        ("lm_head.weight", "decoder.embed_tokens.weight", "tie_embeddings"),  # separate tables, tied output
    ),
)


# T5EncoderModel: T5's encoder stack alone, read as an EncoderModel (hidden states after the final RMS norm).


def t5_encoder_from_hf(c: dict, dropout: float | None = None) -> TransformerConfig:
    return replace(t5_from_hf(c, dropout), n_decoder_layers=0, tie_embeddings=False, output_scale=1.0)


def t5_encoder_to_hf(config: TransformerConfig) -> dict:
    out = t5_to_hf(config)
    for name in ("num_decoder_layers", "decoder_start_token_id", "tie_word_embeddings", "scale_decoder_outputs"):
        out.pop(name)  # the decoder's: config.json keeps what the checkpoint said
    return out


T5_ENCODER = replace(
    T5,
    model_class="EncoderModel",
    architecture="T5EncoderModel",
    rules=(
        Rule("encoder.token_embedding.weight", "shared.weight", when=("share_embeddings", True)),
        Rule("encoder.token_embedding.weight", "encoder.embed_tokens.weight", when=("share_embeddings", False)),
        *(r for r in T5.rules if r.ours.startswith("encoder.") and r.ours != "encoder.token_embedding.weight"),
    ),
    skipped=(r"encoder\.embed_tokens\.weight", r"shared\.weight"),  # a copy of shared (checked equal); unused
    from_hf=t5_encoder_from_hf,
    to_hf=t5_encoder_to_hf,
    supports=T5.supports | {"output_scale": 1.0, "tie_embeddings": False},
    tied=(("encoder.embed_tokens.weight", "shared.weight", "share_embeddings"),),
)

# ----------------------------------------------------------------------------------------------
# Gemma 3, text only (Gemma3ForCausalLM, model_type gemma3_text): Llama's decoder with every RMSNorm of gain 1 + w
# (norm "rms_offset": the checkpoint's w is ours, unchanged), a second norm on each sublayer's output (the sandwich:
# post_attention_layernorm, post_feedforward_layernorm), q/k norms per head, GeGLU with tanh GELU, embeddings times
# sqrt(hidden_size), the attention scale query_pre_attn_scalar^-1/2 and the final logits soft-capped. Its layers
# are local (a sliding window, rope_local_base_freq) or global (rope_theta) by `layer_types`; one kind for every
# layer is read here (all global, or all local), the 5:1 mix is refused.

GEMMA3_KINDS = ("full_attention", "sliding_attention")


def positive_number(c: dict, name: str, default=None):
    """config.json's `name` (default when absent): None, or a positive finite number; ValueError naming it."""
    value = c.get(name, default)
    if value is not None and not (is_finite_number(value) and value > 0):
        raise ValueError(f"config.json: {name}={value!r}: expected a positive number or null")
    return value


def gemma3_rope_bases(c: dict) -> dict:
    """{layer kind: rotary base}, from rope_parameters (per kind, transformers 5) or rope_theta /
    rope_local_base_freq (older files); ValueError for a scaled RoPE."""
    params = c.get("rope_parameters") or {}
    legacy = {"full_attention": c.get("rope_theta", 1_000_000.0), "sliding_attention": c.get("rope_local_base_freq")}
    legacy["sliding_attention"] = 10_000.0 if legacy["sliding_attention"] is None else legacy["sliding_attention"]
    bases = {}
    for kind in GEMMA3_KINDS:
        rope = params.get(kind) or {}
        scaling = c.get("rope_scaling") if kind == "full_attention" else None
        rope_type = rope.get("rope_type", (scaling or {}).get("rope_type", (scaling or {}).get("type", "default")))
        if rope_type != "default":
            raise ValueError(f"rope_type {rope_type!r} of the {kind} layers is not supported (only plain RoPE)")
        bases[kind] = positive_number(rope, "rope_theta", legacy[kind])
    return bases


def gemma3_from_hf(c: dict, dropout: float | None = None) -> TransformerConfig:
    V, D, H = c["vocab_size"], c["hidden_size"], c["num_attention_heads"]
    heads(c, D, H)
    n_kv = c.get("num_key_value_heads") or H
    if c.get("attention_bias", False):
        raise ValueError("attention_bias=True is not supported for gemma3_text (Gemma 3 has no biases); only False")
    if c.get("use_bidirectional_attention", False):
        raise ValueError("use_bidirectional_attention=True is not supported for gemma3_text (a decoder); only False")
    if positive_number(c, "attn_logit_softcapping") is not None:
        raise ValueError(f"attn_logit_softcapping={c['attn_logit_softcapping']} is not supported; only null")
    n_layers = c["num_hidden_layers"]
    kinds = c.get("layer_types") or [
        "sliding_attention" if (i + 1) % c.get("sliding_window_pattern", 6) else "full_attention"
        for i in range(n_layers)
    ]
    if not isinstance(kinds, list) or len(kinds) != n_layers or set(kinds) - set(GEMMA3_KINDS):
        raise ValueError(f"config.json: layer_types={kinds!r}: expected {n_layers} of {GEMMA3_KINDS}")
    if len(set(kinds)) > 1:
        raise ValueError(
            f"layer_types={kinds!r} mixes local and global layers, which this project does not run yet (one kind for "
            "every layer: all 'full_attention', or all 'sliding_attention')"
        )
    sliding = kinds[0] == "sliding_attention"
    scalar = positive_number(c, "query_pre_attn_scalar", 256)
    return TransformerConfig(
        src_vocab_size=V,
        tgt_vocab_size=V,
        d_model=D,
        n_heads=H,
        d_ff=c["intermediate_size"],
        n_encoder_layers=0,
        n_decoder_layers=n_layers,
        **dropout_from_hf(c, LLAMA_DROPOUT, dropout),
        activation=activation_from_hf(c.get("hidden_activation") or "gelu_pytorch_tanh"),
        norm_first=True,
        positional="rope",
        max_len=c.get("max_position_embeddings", 131_072),
        layer_norm_eps=c.get("rms_norm_eps", 1e-6),
        pad_id=token_id(c, "pad_token_id", V),
        bos_id=token_id(c, "bos_token_id", V),
        eos_id=end_token_ids(c, V),
        tie_embeddings=c.get("tie_word_embeddings", True),
        scale_embeddings=True,  # Gemma3TextScaledWordEmbedding: times sqrt(hidden_size)
        norm="rms_offset",
        rope_theta=float(gemma3_rope_bases(c)[kinds[0]]),
        qk_norm=True,
        gated_ffn=True,
        n_kv_heads=None if n_kv == H else n_kv,
        bias=False,
        output_bias=False,
        sliding_window=int(c.get("sliding_window") or 4096) if sliding else None,
        attention_scale=None if scalar == D // H else float(scalar) ** -0.5,
        embedding_padding_idx=c.get("pad_token_id") is not None,
        sandwich_norm=True,
        logit_softcap=positive_number(c, "final_logit_softcapping"),
    )


def gemma3_to_hf(config: TransformerConfig) -> dict:
    scalar = config.head_dim if config.attention_scale is None else config.attention_scale**-2
    if abs(scalar - round(scalar)) < 1e-9 * scalar:
        scalar = round(scalar)  # query_pre_attn_scalar is an int in Gemma3TextConfig (256)
    kind = "full_attention" if config.sliding_window is None else "sliding_attention"
    rope = {"rope_type": "default", "rope_theta": config.rope_theta}
    return {
        "vocab_size": config.tgt_vocab_size,
        "hidden_size": config.d_model,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_decoder_layers,
        **dropout_to_hf(config, "gemma3_text", LLAMA_DROPOUT),
        "hidden_activation": {"gelu_tanh": "gelu_pytorch_tanh"}.get(config.activation, config.activation),
        "max_position_embeddings": config.max_len,
        "rms_norm_eps": config.layer_norm_eps,
        "rope_parameters": {k: dict(rope) for k in GEMMA3_KINDS},  # one base: every layer is of one kind
        "layer_types": [kind] * config.n_decoder_layers,
        "sliding_window": config.max_len if config.sliding_window is None else config.sliding_window,
        "query_pre_attn_scalar": scalar,
        "final_logit_softcapping": config.logit_softcap,
        "attn_logit_softcapping": None,
        "attention_bias": False,
        "use_bidirectional_attention": False,
        "tie_word_embeddings": config.tie_embeddings,
        "pad_token_id": config.pad_id,
        "bos_token_id": config.bos_id,
        "eos_token_id": config.eos_id,
    }


GEMMA3_TEXT = Family(
    model_type="gemma3_text",
    model_class="TransformerLM",
    architecture="Gemma3ForCausalLM",
    prefixes=("model.", ""),
    rules=(
        Rule("decoder.token_embedding.weight", "embed_tokens.weight"),
        *(
            Rule(f"decoder.layers.{{i}}.{ours}.weight", f"layers.{{i}}.{theirs}.weight")
            for ours, theirs in (
                ("self_attn_norm", "input_layernorm"),
                ("self_attn.q_proj", "self_attn.q_proj"),
                ("self_attn.k_proj", "self_attn.k_proj"),
                ("self_attn.v_proj", "self_attn.v_proj"),
                ("self_attn.out_proj", "self_attn.o_proj"),
                ("self_attn.q_norm", "self_attn.q_norm"),
                ("self_attn.k_norm", "self_attn.k_norm"),
                ("self_attn_post_norm", "post_attention_layernorm"),
                ("ffn_norm", "pre_feedforward_layernorm"),
                ("ffn.gate", "mlp.gate_proj"),
                ("ffn.linear1", "mlp.up_proj"),
                ("ffn.linear2", "mlp.down_proj"),
                ("ffn_post_norm", "post_feedforward_layernorm"),
            )
        ),
        Rule("decoder.final_norm.weight", "norm.weight"),
        Rule("output_proj.weight", "lm_head.weight", head=True),  # only when untied
    ),
    skipped=(r"lm_head\.weight",),  # when tied: a copy of embed_tokens.weight
    from_hf=gemma3_from_hf,
    to_hf=gemma3_to_hf,
    supports={
        "activation": ("gelu_tanh", "gelu", "silu", "relu"),
        "norm": "rms_offset",
        "norm_first": True,
        "positional": "rope",
        "rope_theta": ANY,
        "qk_norm": True,
        "gated_ffn": True,
        "n_kv_heads": ANY,
        "bias": False,
        "qkv_bias": (None, False),
        "sliding_window": ANY,
        "attention_scale": ANY,
        "tie_embeddings": ANY,
        "scale_embeddings": True,
        "output_bias": False,
        "sandwich_norm": True,
        "logit_softcap": ANY,
    },  # fmt: skip
    tied=(("lm_head.weight", "model.embed_tokens.weight", "tie_embeddings"),),
)


FAMILIES = {
    family.model_type: family for family in (BERT, GPT2, LLAMA, MISTRAL, QWEN2, BLOOM, MARIAN, BART, T5, GEMMA3_TEXT)
}
# checkpoints of another class of a family's model_type, told apart by config.json's "architectures"
BY_ARCHITECTURE = {family.architecture: family for family in (T5_ENCODER,)}


def family_of(model_type, architectures=None) -> Family:
    """The family of a checkpoint: its model_type's, or (`architectures`, config.json's list) the family of a class
    read differently (T5EncoderModel: an EncoderModel)."""
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not supported; supported: {sorted(FAMILIES)}")
    for name in architectures if isinstance(architectures, list) else []:
        if name in BY_ARCHITECTURE and BY_ARCHITECTURE[name].model_type == model_type:
            return BY_ARCHITECTURE[name]
    return FAMILIES[model_type]


def family_for_model(model) -> Family:
    """The family a model can be written as: the one it was loaded from, else the first whose config
    translation accepts its class and config. ValueError listing why each family does not fit."""
    loaded = getattr(model, "hf_model_type", None)
    if loaded is not None:
        for family in BY_ARCHITECTURE.values():  # a class read differently (T5EncoderModel: an EncoderModel)
            if family.model_type == loaded and family.model_class == type(model).__name__:
                return family
        return family_of(loaded)
    reasons = []
    for family in FAMILIES.values():
        if type(model).__name__ != family.model_class:
            reasons.append(f"{family.model_type}: a {family.model_class}, not a {type(model).__name__}")
            continue
        try:
            family.config_json(model.config)
        except ValueError as error:
            reasons.append(f"{family.model_type}: {error}")
            continue
        return family
    raise ValueError("no Hugging Face family fits this model: " + "; ".join(reasons))


# ----------------------------------------------------------------------------------------------
# Matching a checkpoint's names to ours (names only; each side moves the arrays itself).


def relative(family: Family, name: str) -> str:
    """A checkpoint name without the base-model prefix it carries ("transformer.h.0..." -> "h.0...")."""
    for prefix in family.prefixes:
        if prefix and name.startswith(prefix):
            return name[len(prefix) :]
    return name


def full_name(family: Family, rule: Rule) -> str:
    """The name hf.save writes for a rule's tensor: the head class's own name, or the base-model name
    behind the family's first prefix."""
    return rule.theirs if rule.head else family.prefixes[0] + rule.theirs


def match(family: Family, config: TransformerConfig, checkpoint_names, our_names) -> list[tuple[Rule, str]]:
    """(rule, checkpoint name) for each of our tensors (the rules whose `ours` is in our_names).

    ValueError listing every tensor of ours the checkpoint lacks, and every tensor of the checkpoint
    that is neither ours nor in the family's list of skipped tensors."""
    by_relative = {relative(family, name): name for name in checkpoint_names}
    rules = [rule for rule in expand(family.rules, config) if rule.ours in our_names]
    plan, missing, used = [], [], set()
    for rule in rules:
        if rule.theirs in by_relative:
            plan.append((rule, by_relative[rule.theirs]))
            used.add(rule.theirs)
        else:
            missing.append(f"{full_name(family, rule)} (for {rule.ours})")
    unknown = sorted(by_relative[r] for r in by_relative if r not in used and not is_skipped(family, r))
    uncovered = sorted(set(our_names) - {rule.ours for rule in rules})
    problems = []
    if missing:
        problems.append(f"missing tensors {missing}")
    if unknown:
        problems.append(f"tensors that are not part of a {family.model_type!r} model of this config {unknown}")
    if uncovered:  # a table that does not cover the model: a bug here, not in the checkpoint
        problems.append(f"parameters no rule of the {family.model_type!r} table produces {uncovered}")
    if problems:
        raise ValueError(f"the checkpoint does not fit its config.json ({family.model_type}): " + "; ".join(problems))
    return plan


def resolve_ties(family: Family, config: TransformerConfig, checkpoint_names, equal: Callable) -> tuple:
    """(config, fills): the ties config.json declares, kept only where the file agrees, as transformers 5 decides
    them (a tied copy present with other values is not tied; an absent one is its source).

    For each tie the config holds (share_embeddings: the stacks' tables are `shared`; tie_embeddings: lm_head is
    the decoder's table), a copy the checkpoint holds is compared with its source (equal(name, name), the side's
    array equality): a copy that differs unties the field, and the model reads it as a tensor of its own. `fills`
    maps a copy the file leaves out to the tensor it stands for (checkpoint names), for a tie that is undone.
    ValueError naming both tensors when the family cannot hold the untied tensors apart."""
    by_relative = {relative(family, name): name for name in checkpoint_names}
    ties = {}  # field -> [(alias, source)] as relative names, in the table's order
    for alias, source, name in family.tied:
        ties.setdefault(name, []).append((relative(family, alias), relative(family, source)))
    fills, differing = {}, {}
    for name, pairs in ties.items():  # share_embeddings before tie_embeddings: the head ties to the table in use
        if not getattr(config, name):
            continue
        if name == "tie_embeddings":  # compare the head with the table the decoder reads under the ties so far
            table = next((r.theirs for r in expand(family.rules, config) if r.ours == "decoder.token_embedding.weight"),
                         None)  # fmt: skip
            pairs = [(alias, table) for alias in dict.fromkeys(alias for alias, _ in pairs)]
        present = [(a, s) for a, s in pairs if a in by_relative and s in by_relative]
        differ = [(a, s) for a, s in present if not equal(by_relative[a], by_relative[s])]
        if differ:
            config = replace(config, **{name: False})
            differing[name] = differ
            for alias, source in pairs:  # an absent copy is its source, as transformers ties it
                if alias not in by_relative and source in by_relative:
                    fills[alias] = by_relative[alias] = by_relative[source]
    if differing:
        try:
            check_supported(family, config)
        except ValueError:
            found = [f"{by_relative[a]} differs from {by_relative[s]}" for ps in differing.values() for a, s in ps]
            raise ValueError(
                f"config.json ties {sorted(differing)}, but {'; '.join(found)}, and a {family.model_type!r} model "
                "here cannot hold them apart"
            ) from None
    return config, fills


def tied_copies(family: Family, config: TransformerConfig, out: dict, hf_json: dict) -> dict:
    """The tensors hf.save adds to `out` (a checkpoint's tensors, full names) so that transformers 5 rebuilds the
    model's ties exactly: when a tie of the family is undone (separate tables, an untied head), every copy is
    written (transformers ties a copy only to an equal source), and a source no rule writes (`shared` beside
    separate tables) holds the first of its copies, so that from_pretrained finds every tensor it expects (`hf_json`:
    the config.json written; a Marian without shared embeddings has no `shared`)."""
    if all(getattr(config, name) for _, _, name in family.tied):
        return {}
    added = {}
    for alias, source, name in family.tied:
        if getattr(config, name) and source in out and alias not in out and alias not in added:
            added[alias] = out[source]
    if hf_json.get("share_encoder_decoder_embeddings") is False:
        return added
    for alias, source, _ in family.tied:
        if source not in out and source not in added and (alias in out or alias in added):
            added[source] = out.get(alias, added.get(alias))
    return added


def writing_plan(family: Family, config: TransformerConfig, our_names) -> dict[str, list[Rule]]:
    """Checkpoint name -> the rules whose tensors make it up (several for a fused tensor, in part order)."""
    groups: dict[str, list[Rule]] = {}
    covered = set()
    for rule in expand(family.rules, config):
        if rule.ours in our_names:
            groups.setdefault(full_name(family, rule), []).append(rule)
            covered.add(rule.ours)
    uncovered = sorted(set(our_names) - covered)
    if uncovered:  # a parameter no rule writes would be dropped from the checkpoint without a word
        raise ValueError(f"no rule of the {family.model_type!r} table writes the parameters {uncovered}")
    for rules in groups.values():
        rules.sort(key=lambda rule: rule.part[0] if rule.part else 0)
    return groups


def to_hf_tensors(family: Family, config: TransformerConfig, tensors: dict, names, write, tied: bool = True) -> dict:
    """Our tensors (parameters, gradients: any dict keyed like the state dict) under the names of the family's
    transformers class: each checkpoint tensor is write(arrays, rule) of the arrays its writing plan's rules name
    (`names`: the parameters the plan must cover). With `tied`, the class's tied aliases too (lm_head.weight for a
    tied head), the same array. Both sides' hf.to_hf, each with its own `write`."""
    out = {
        name: write([tensors[r.ours] for r in rules], rules[0])
        for name, rules in writing_plan(family, config, names).items()
    }
    if tied:
        for alias, source, field in family.tied:
            if getattr(config, field) and source in out and alias not in out:
                out[alias] = out[source]  # the same array: tied in the HF class too
    return out
