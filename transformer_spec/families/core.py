"""What every family file shares: the `Rule` (one tensor of a checkpoint) and `Family` types, the declarative
config translation (`Key`, `ConfigMap`: one declaration read in both directions; `refuse`, the one refusal of a
config.json), the checks of config.json's values, and the interpreter of the tensor tables (read_layout,
write_layout, match, ties) that both `numpy_transformer.hf` and `torch_transformer.hf` run.

A `Rule` says where one of our tensors lives in the checkpoint and how its layout differs:

    Rule("decoder.layers.{i}.self_attn.q_proj.weight", "h.{i}.attn.c_attn.weight", conv1d=True, part=(0, 3))

reads: our q_proj weight is the first of three equal slices, along the output axis, of GPT-2's fused
`c_attn` weight, which is stored (in, out) as a `Conv1D` (so it is transposed). "{i}" stands for the
layer index. Names of the base model (everything but the heads) are written without the prefix the
head class adds ("transformer.", "model."): a family lists the prefixes its checkpoints may carry.

Reading a tensor: theirs -> drop `offset` leading rows -> squeeze a leading axis of 1 (`row`) ->
transpose (`conv1d`) -> take slice `part` of the first axis (or, `per_head`, of each head's rows; or, `gqa`, the
q, k or v block of H, H_kv or H_kv heads). Writing
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
from typing import Any, TypedDict

from ..config import DROPOUT_KINDS, GenerationRules, TransformerConfig, short_repr
from ..generation import GENERATION_KEYS, generation_settings


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
    # with `part` (k, 3): the fused q, k and v of grouped-query attention, H, H_kv and H_kv heads long (Phi-3's
    # qkv_proj), instead of three equal slices
    gqa: bool = False


@dataclass(frozen=True)
class Family:
    model_type: str  # config.json's "model_type"
    model_class: str  # ours: "EncoderModel", "TransformerLM" or "Transformer"
    architecture: str  # the transformers class hf.save writes for ("architectures" in config.json)
    prefixes: tuple[str, ...]  # prefixes of base-model names in a checkpoint; the first is the one written
    rules: tuple[Rule, ...]
    skipped: tuple[str, ...]  # regexes (relative names) of tensors that are not parameters of our model
    from_hf: Callable[..., TransformerConfig]  # (config.json, dropout=None) -> TransformerConfig
    # (TransformerConfig, config.json as read: {} for a model of our own) -> config.json fields (ValueError: impossible)
    to_hf: Callable[..., dict]
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
    # checkpoint tensors (full name -> array) in an older layout the class still reads -> the class's own names, or
    # None (Mixtral's files hold each expert's w1, w2, w3; transformers 5's class fuses them: mixtral.fuse_experts)
    legacy: Callable[[dict], dict] | None = None
    # (name in the files, the class's name): a tensor the files store under another name than the class's
    # state_dict (transformers renames it on load and back on save: GPT-NeoX's embed_out); read as the class's name
    renamed: tuple[tuple[str, str], ...] = ()
    # a config.json key whose true value makes a checkpoint of this model_type this family's, whatever its
    # architectures say (Gemma 3's use_bidirectional_attention: EmbeddingGemma, an EncoderModel); None: chosen by
    # architecture alone
    flag: str | None = None
    # (generation_config.json as read, vocabulary size) -> (the ids the decoder reads after its start token, the
    # keys that made them): Whisper's forced_decoder_ids, language, task and no-timestamps tokens; None: no prompt
    decoder_prompt: Callable[[dict, int], tuple[tuple, tuple]] | None = None

    def config_json(self, config: TransformerConfig, as_read: dict | None = None) -> dict:
        """config.json's fields for `config` (to_hf), after checking that the family supports every field; spelled
        as `as_read` (the config.json the model was loaded from, if any) spelled them (a scaled RoPE's key)."""
        check_supported(self, config)
        return self.to_hf(config, as_read or {})


ANY = "any value"  # in a family's `supports`: the field may take every value the config allows
# Fields every family expresses in its config.json (sizes, special ids, dropout rates: dropout_to_hf checks them per
# family), or that are not part of a checkpoint (the attention kernel, padding_idx's gradient rule, whether decoding
# makes a LongRoPE cache again: what the family's generate() does, set on reading).
FREE_FIELDS = frozenset(
    {
        "src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers",
        "max_len", "layer_norm_eps", "pad_id", "bos_id", "eos_id", "dropout", "embedding_dropout",
        "attention_dropout", "activation_dropout", "residual_dropout", "attention", "embedding_padding_idx",
        "rope_cache_remade",
    }
)  # fmt: skip


def refuse(name: str, value, supported) -> None:
    """The one refusal of a config.json a family cannot read: ValueError naming the key, its value and what is
    supported (a tuple of values, or a phrase)."""
    if isinstance(supported, tuple):
        supported = " or ".join(repr(v) for v in supported)
    raise ValueError(f"config.json: {name}={short_repr(value, 120)} is not supported (supported: {supported})")


REQUIRED = object()  # a Key's default when config.json must hold the key
OMITTED = object()  # what a Key's writer returns for a key this config.json goes without (rope_parameters beside
# a rope_scaling)


@dataclass(frozen=True)
class Key:
    """One config.json key and the config field(s) it fills, read and written by the same declaration.

    Reading: config.json's value (`default` when absent; REQUIRED: a KeyError, reported as a missing field), refused
    unless in `allowed` (None: any), then `read(value, config_json)` (None: as is) into every field of `ours` (a
    name, or several that take the same value: one vocab_size for src_vocab_size and tgt_vocab_size). `ours` None: a
    key that is only checked (and written as `default` when `written`).
    Writing: `write(value)` (None: as is) of the config's attribute `source` (None: the first of ours; neither: the
    constant `default`), unless `written` is False (a key read only to derive a field, such as BERT's pad_token_id
    giving embedding_padding_idx)."""

    theirs: str
    ours: str | tuple[str, ...] | None
    default: object = REQUIRED
    read: Callable | None = None  # (config.json's value, config.json) -> our value
    write: Callable | None = None  # our value -> config.json's value
    allowed: tuple | None = None  # the values of config.json's key this family reads; the others are refused
    written: bool = True
    # what is written, when not the first of ours: a config attribute (Llama's kv_heads) or a function of the config
    source: str | Callable | None = None
    read_too: bool = True  # False: a key only written (Marian's forced_eos_token_id, a copy of eos_token_id)
    # True: `source` is called as source(config, as_read), config.json as read ({} for a model of our own), to write
    # the key as that file spelled it (a scaled RoPE in rope_scaling or rope_parameters, its kind under "type")
    spelled: bool = False

    @property
    def fields(self) -> tuple[str, ...]:
        return () if self.ours is None else (self.ours,) if isinstance(self.ours, str) else self.ours


def single_values(supports: dict) -> dict:
    """The fields `supports` pins to one value (not ANY, a tuple of options or a function of the config): what every
    checkpoint of the family has, set when reading and checked when writing (check_supported)."""
    return {k: v for k, v in supports.items() if v != ANY and not isinstance(v, tuple) and not callable(v)}


@dataclass(frozen=True)
class ConfigMap:
    """A family's config translation as data, both directions from one declaration: `keys` (config.json <->
    our fields), `dropout` (config.json's rate fields -> our dropout sites: the *_DROPOUT tables), `supports`
    (the fields a checkpoint can express, Family.supports: a single value is set on reading), `fixed` (further
    fields every checkpoint of the family has, whatever config.json says: the stack it lacks has no layers), `tied`
    (field -> a function of the config giving the value the field needs, checked when writing: BLOOM's d_ff is
    4 d_model, no key of its own)."""

    model_type: str
    keys: tuple[Key, ...]
    dropout: dict
    supports: dict
    fixed: dict = field(default_factory=dict)
    tied: dict = field(default_factory=dict)

    def from_hf(self, c: dict, dropout: float | None = None) -> TransformerConfig:
        """config.json -> TransformerConfig (Family.from_hf)."""
        values = single_values(self.supports)
        for key in self.keys:
            if not key.read_too:
                continue
            value = c[key.theirs] if key.default is REQUIRED else c.get(key.theirs, key.default)
            if key.allowed is not None and value not in key.allowed:
                refuse(key.theirs, value, key.allowed)
            value = value if key.read is None else key.read(value, c)
            values |= dict.fromkeys(key.fields, value)
        return TransformerConfig(**values | self.fixed, **dropout_from_hf(c, self.dropout, dropout))

    def to_hf(self, config: TransformerConfig, as_read: dict | None = None) -> dict:
        """TransformerConfig -> config.json's fields (Family.to_hf; Family.config_json checks `supports` first),
        the spelled keys as `as_read` (config.json as read) spelled them."""
        require(config, self.model_type, **{name: needs(config) for name, needs in self.tied.items()})
        out = {}
        for key in self.keys:
            if not key.written:
                continue
            source = key.source or (key.fields[0] if key.fields else None)
            if source is None:
                out[key.theirs] = key.default
                continue
            if callable(source):
                value = source(config, as_read or {}) if key.spelled else source(config)
            else:
                value = getattr(config, source)
            value = value if key.write is None else key.write(value)
            if value is not OMITTED:
                out[key.theirs] = value
        return out | dropout_to_hf(config, self.model_type, self.dropout)

    def variant(self, model_type: str, without=(), keys=(), supports=None, fixed=None, unwritten=()) -> ConfigMap:
        """This map for a family that differs from this one only in some keys (Mistral and Qwen2 from Llama):
        the keys named in `without` (config.json names) removed, those in `unwritten` read but not written, `keys`
        added, `supports` and `fixed` merged in."""
        kept = tuple(
            replace(key, written=False) if key.theirs in unwritten else key
            for key in self.keys
            if key.theirs not in without
        )
        return replace(
            self, model_type=model_type, keys=kept + tuple(keys), supports=self.supports | (supports or {}),
            fixed=self.fixed | (fixed or {}),
        )  # fmt: skip


def renamed(ours: str, theirs: str, modules, params: tuple[str, ...] = ("weight", "bias")) -> tuple[Rule, ...]:
    """One plain rule per (our module, their module) of `modules` and parameter of `params`: our
    f"{ours}.{a}.{w}" is their f"{theirs}.{b}.{w}" ("{i}" in either prefix stands for the layer index)."""
    return tuple(Rule(f"{ours}.{a}.{w}", f"{theirs}.{b}.{w}") for a, b in modules for w in params)


def fused_qkv(ours: str, theirs: str, params: tuple[str, ...] = ("weight", "bias"), **options: Any) -> tuple[Rule, ...]:
    """The rules of a fused query-key-value projection: our f"{ours}.q_proj.{w}", k_proj and v_proj are parts 0, 1
    and 2 of their f"{theirs}.{w}", for each parameter w of `params`; `options`: the Rule fields saying how the parts
    lie (per_head, gqa, conv1d)."""
    return tuple(
        Rule(f"{ours}.{p}_proj.{w}", f"{theirs}.{w}", part=(k, 3), **options)
        for k, p in enumerate("qkv")
        for w in params
    )


def declared(config_map: ConfigMap, **family) -> Family:
    """The Family whose config translation is `config_map` in both directions (from_hf, to_hf and supports
    from the one declaration); `family`: the rest of Family's fields (tensor rules, prefixes, ties...)."""
    return Family(
        model_type=config_map.model_type,
        from_hf=config_map.from_hf,
        to_hf=config_map.to_hf,
        supports=config_map.supports,
        **family,
    )


def check_supported(family: Family, config: TransformerConfig) -> None:
    """ValueError listing every field of `config` that a checkpoint of `family` cannot express (see Family.supports)."""
    wrong = []
    for spec in fields(config):
        if spec.name in FREE_FIELDS:
            continue
        allowed = family.supports.get(spec.name, (spec.default,))  # one option: the default (a tuple itself, maybe)
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


def read_layout(array, rule: Rule, name: str, n_heads: int, n_kv_heads: int | None = None):
    """Theirs -> ours: drop `offset` rows, squeeze the leading axis (`row`), transpose (`conv1d`), take part k of n
    of the first axis (n consecutive blocks, or `per_head`: within each of the n_heads heads' rows, or `gqa`: q, k
    and v blocks of n_heads, n_kv_heads and n_kv_heads heads)."""
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
        if array.shape[0] % groups and not rule.gqa:
            raise ValueError(f"{name}: a fused tensor of {n} parts, but its shape {tuple(array.shape)} does not split")
        rest = tuple(array.shape[1:])
        if rule.per_head:  # (H * n * Dh, ...) -> (H, n, Dh, ...) -> part k of every head -> (H * Dh, ...)
            array = array.reshape(n_heads, n, -1, *rest)[:, k].reshape(-1, *rest)
        elif rule.gqa:  # ((H + 2 H_kv) * Dh, ...): q's H * Dh rows, then k's and v's H_kv * Dh each
            kv = n_heads if n_kv_heads is None else n_kv_heads
            if array.shape[0] % (n_heads + 2 * kv):
                raise ValueError(
                    f"{name}: fused q, k, v of {n_heads} + 2 x {kv} heads, but its shape {tuple(array.shape)} "
                    "does not split into them"
                )
            head = array.shape[0] // (n_heads + 2 * kv)
            bounds = (0, n_heads * head, (n_heads + kv) * head, array.shape[0])
            array = array[bounds[k] : bounds[k + 1]]
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
    # the same tanh approximation, sqrt(2/pi) written 0.7978845608 (3.6e-12 relative from it): written back gelu_new
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",  # Marian's opus-mt checkpoints
    "quick_gelu": "quick_gelu",  # x * sigmoid(1.702 x): CLIP's
}


# Converters for ConfigMap keys: (config.json's value, config.json) -> ours, and ours -> config.json's value.
class KeyReading(TypedDict):
    """A Key's `read` and `allowed`, shared by the families' keys of one kind (Key(..., **ACTIVATION_KEY))."""

    read: Callable
    allowed: tuple


ACTIVATION_KEY = KeyReading(read=lambda value, c: ACTIVATIONS_FROM_HF[value], allowed=tuple(ACTIVATIONS_FROM_HF))


def mlp_bias(value, c: dict) -> bool | None:
    """mlp_bias -> ffn_bias: None where it agrees with attention_bias (one `bias` covers both), else its own value
    (attention_bias true and mlp_bias false: Llama conversions of other families)."""
    return None if bool(value) == bool(c.get("attention_bias", False)) else bool(value)


def pretraining_tp(value, c: dict) -> None:
    """pretraining_tp (Llama's, BLOOM's): the tensor-parallel slices a checkpoint was trained with. transformers
    computes the same model for any value (BLOOM slices its linears only with slow_but_exact, summing the same
    products in another order; Llama's modeling never reads it): a positive int is read, and written back as 1."""
    if value is not None and not (is_int(value) and value >= 1):
        refuse("pretraining_tp", value, "a positive integer")


def activation_to_hf(value: str) -> str:
    """Our activation name -> transformers' (gelu_tanh -> gelu_new, the rest the same)."""
    return {"gelu_tanh": "gelu_new"}.get(value, value)


def special_token(name: str, vocab: str = "vocab_size") -> Callable:
    """The reader of special token id `name` (eos_token_id: one id or several), checked against config.json's
    `vocab` size."""
    if name == "eos_token_id":
        return lambda value, c: end_token_ids(c, c[vocab])
    return lambda value, c: token_id(c, name, c[vocab])


# Each family's dropout fields in config.json (its *_DROPOUT table): name -> (the kinds of our sites it sets,
# transformers' default when the field is absent). A kind no field names has no dropout in that family.


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
    forced: dict[str, Any] = {}
    for name, ours in (("forced_bos_token_id", "forced_bos_id"), ("forced_eos_token_id", "forced_eos_id")):
        value = generation.get(name)
        if isinstance(value, list) and name == "forced_eos_token_id" and len(value) > 1:
            # several forced end tokens (transformers' ForcedEOSTokenLogitsProcessor takes a list): each stays possible
            forced[ours] = tuple(token_id({name: v}, name, vocab) for v in value)
            continue
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
        **forced, bad_words=tuple(tuple(w) for w in words), beam_fill_id=fill, fill_id=after_eos, pad_id=pad
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
    "relative_attention_max_distance", "seq_length", "dim", "hidden_dim", "n_layers", "n_heads",
    "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
)  # fmt: skip
OPTIONAL_POSITIVE_INTS = (  # null means "as the family's default"
    "n_inner", "num_key_value_heads", "head_dim", "sliding_window", "num_decoder_layers", "decoder_vocab_size",
)  # fmt: skip
NON_NEGATIVE_INTS = ("type_vocab_size", "num_experts")
TOKEN_IDS = (  # null, an id, or (end tokens) a list of ids
    "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "forced_bos_token_id",
    "forced_eos_token_id",
)  # fmt: skip
POSITIVE_FLOATS = ("rope_theta", "rotary_emb_base")
NON_NEGATIVE_FLOATS = (
    "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "router_aux_loss_coef", "router_jitter_noise",
)  # fmt: skip
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

    def bad(name: str, value: object, expected: str) -> ValueError:
        return ValueError(f"{path}: {name}={value!r} ({type(value).__name__}): expected {expected}")

    for check in (check_sizes, check_token_ids, check_floats, check_rates):
        check(c, bad)


Bad = Callable[[str, object, str], ValueError]  # (field, its value, what was expected) -> the error naming the file


def check_sizes(c: dict, bad: Bad) -> None:
    """Sizes: positive ints (the optional ones may be null), counts: non-negative ints."""
    for name in POSITIVE_INTS + OPTIONAL_POSITIVE_INTS + NON_NEGATIVE_INTS:
        if name not in c or (c[name] is None and name in OPTIONAL_POSITIVE_INTS):
            continue
        low = 0 if name in NON_NEGATIVE_INTS else 1
        if not is_int(c[name]) or c[name] < low:
            raise bad(name, c[name], "a positive integer" if low else "a non-negative integer")


def check_token_ids(c: dict, bad: Bad) -> None:
    """Special token ids: null, a non-negative int, or a list of them."""
    for name in TOKEN_IDS:
        value = c.get(name)
        for item in value if isinstance(value, list) else [value]:
            if item is not None and (not is_int(item) or item < 0):
                raise bad(name, value, "null, a non-negative integer token id, or a list of them")


def check_floats(c: dict, bad: Bad) -> None:
    """Rotary bases (top level or in rope_parameters, an object): finite and positive; epsilons and coefficients:
    finite and >= 0."""
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


def check_rates(c: dict, bad: Bad) -> None:
    """Dropout probabilities: null or a finite number in [0, 1]."""
    for name in RATES:
        value = c.get(name)
        if value is not None and not (is_finite_number(value) and 0 <= value <= 1):
            raise bad(name, value, "a dropout probability in [0, 1] (or null)")


def read_generation_rules(directory, hf_config: dict, config: TransformerConfig, family: Family | None = None):
    """(config, GenerationRules) of a checkpoint directory: generation_config.json when present, else config.json's
    fields of the same names (transformers' own fallback). Its decoder_start_token_id, when it names one, is the
    start token our decoding uses (config.bos_id of an encoder-decoder); `family`'s decoder_prompt, when it has one,
    reads the ids after it (GenerationRules.decoder_prompt). ValueError naming the file when it is unreadable or its
    ids lie outside the vocabulary."""
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
        known = generation if path.is_file() else {k: v for k, v in generation.items() if k in GENERATION_KEYS}
        if family is not None and family.decoder_prompt is not None:
            prompt, used = family.decoder_prompt(generation, config.tgt_vocab_size)
            kept = tuple((k, generation[k]) for k in used if generation.get(k) is not None)
            rules = replace(rules, decoder_prompt=prompt, prompt_settings=kept)
            known = {k: v for k, v in known.items() if k not in used}
        rules = replace(rules, **generation_settings(known, path if path.is_file() else "config.json"))
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
    ids = [token_id({"eos_token_id": v}, "eos_token_id", vocab) for v in value]
    known = tuple(i for i in ids if i is not None)
    if len(known) < len(ids):
        raise ValueError(f"config.json: eos_token_id={value} lists a null")
    if not known:
        return None
    return known[0] if len(known) == 1 else known


# ----------------------------------------------------------------------------------------------
# Matching a checkpoint's names to ours (names only; each side moves the arrays itself).


def relative(family: Family, name: str) -> str:
    """A checkpoint name without the base-model prefix it carries ("transformer.h.0..." -> "h.0..."), under the
    class's own name where the family's files use another (family.renamed: GPT-NeoX's embed_out -> lm_head)."""
    for prefix in family.prefixes:
        if prefix and name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return dict(family.renamed).get(name, name)


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
    # field -> [(alias, source)] as relative names, in the table's order (source None: the head's table, when the
    # family reads no decoder table)
    ties: dict[str, list[tuple[str, str | None]]] = {}
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
            untied: dict[str, Any] = {name: False}
            config = replace(config, **untied)
            differing[name] = differ
            for copy, original in pairs:  # an absent copy is its source, as transformers ties it
                if copy not in by_relative and original in by_relative:
                    fills[copy] = by_relative[copy] = by_relative[original]
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
