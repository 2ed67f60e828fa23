"""RoBERTa and XLM-RoBERTa (RobertaModel, XLMRobertaModel: one architecture under two model types): BERT's layout
under the prefix "roberta.", with fairseq's positions (config.positions_after_pad): a real token sits at pad_id + the
count of real tokens up to it, a pad at pad_id, whose row of the table takes no gradient; one token type in the
released checkpoints; the pooler when the file holds one."""

from __future__ import annotations

from .bert import BERT, BERT_CONFIG
from .core import Key, declared, special_token


def end_tokens_to_hf(value):
    return list(value) if isinstance(value, tuple) else value


ROBERTA_CONFIG = BERT_CONFIG.variant(
    "roberta",
    without=("bos_token_id", "eos_token_id"),
    keys=(  # written back, unlike BERT's: RobertaConfig's defaults (0 and 2) are not every checkpoint's
        Key("bos_token_id", "bos_id", None, special_token("bos_token_id")),
        Key("eos_token_id", "eos_id", None, special_token("eos_token_id"), write=end_tokens_to_hf),
    ),
    supports={"positions_after_pad": True},  # set on reading; the config checks pad_id fits the table
)


def roberta_family(config_map, architecture: str):
    return declared(
        config_map,
        model_class="EncoderModel",
        architecture=architecture,
        prefixes=("", "roberta."),
        rules=BERT.rules,  # BERT's names, pooler included
        skipped=(
            r"embeddings\.position_ids",  # a buffer: 0 .. max_len - 1
            r"embeddings\.token_type_ids",  # a buffer of zeros
            r"pooler\..*",  # the pooler, when the config says none (config.pooler: set when the file has one)
            r"lm_head\..*",  # RobertaForMaskedLM's head
            r"classifier\..*",  # the sequence and token classification heads
        ),
        detected=BERT.detected,
    )


ROBERTA = roberta_family(ROBERTA_CONFIG, "RobertaModel")
XLM_ROBERTA = roberta_family(ROBERTA_CONFIG.variant("xlm-roberta"), "XLMRobertaModel")

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (ROBERTA, XLM_ROBERTA)
