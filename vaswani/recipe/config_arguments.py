"""The model configuration's flags: every `VaswaniConfig` field that is a modelling choice, as `vaswani-train` takes
it over the `--preset` (`--d_model 256 --dropout 0.3`), and the fields a command line gave."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..configuration_vaswani import (
    ACTIVATIONS,
    POSITION_EMBEDDING_TYPES,
    SINUSOID_FREQUENCIES,
    SINUSOID_LAYOUTS,
)

# ---------------------------------------------------------------------------------------------------------------------
# Model configuration flags: every VaswaniConfig field that is a modelling choice
# ---------------------------------------------------------------------------------------------------------------------
# The `VaswaniConfig.__init__` parameters that are not flags: set from the tokenizer (sizes, special ids, sharing) or
# not a modelling choice. Every other parameter is a field of `ModelConfigArguments` (tests/test_training.py checks).
CONFIG_FIELDS_NOT_FLAGS = frozenset(
    {
        "vocab_size",
        "decoder_vocab_size",
        "share_encoder_decoder_embeddings",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "decoder_start_token_id",
        "use_cache",
        "is_encoder_decoder",
    }
)
# A boolean field of the configuration: `--normalize_before` alone means true; unset (None) keeps the preset's.
_SWITCH = {"nargs": "?", "const": True}


@dataclass
class ModelConfigArguments:
    """VaswaniConfig fields set on the command line; None keeps the preset's (or loaded model's) value."""

    _argument_group_name = "model configuration (VaswaniConfig fields over the --preset; §3, Table 3)"

    d_model: int | None = field(
        default=None, metadata={"help": "d_model, the width of every sublayer output and embedding (§3.1)."}
    )
    encoder_layers: int | None = field(default=None, metadata={"help": "N, encoder layers (§3.1)."})
    decoder_layers: int | None = field(default=None, metadata={"help": "N, decoder layers (§3.1)."})
    encoder_attention_heads: int | None = field(
        default=None, metadata={"help": "h, heads in encoder self-attention (§3.2.2)."}
    )
    decoder_attention_heads: int | None = field(
        default=None, metadata={"help": "h, heads in decoder self- and cross-attention (§3.2.2)."}
    )
    encoder_ffn_dim: int | None = field(
        default=None, metadata={"help": "d_ff, inner size of the encoder FFN (§3.3)."}
    )
    decoder_ffn_dim: int | None = field(
        default=None, metadata={"help": "d_ff, inner size of the decoder FFN (§3.3)."}
    )
    activation_function: str | None = field(
        default=None,
        metadata={
            "help": "The FFN non-linearity: max(0, xW1 + b1)W2 + b2 is ReLU (§3.3); others depart from the paper.",
            "choices": list(ACTIVATIONS),
        },
    )
    dropout: float | None = field(
        default=None,
        metadata={
            "help": "P_drop, on every sublayer output before the residual add and on the sums of embeddings and "
            "positional encodings (§5.4)."
        },
    )
    attention_dropout: float | None = field(
        default=None, metadata={"help": "Dropout on attention probabilities (not in the paper: 0)."}
    )
    activation_dropout: float | None = field(
        default=None, metadata={"help": "Dropout after the FFN non-linearity (not in the paper: 0)."}
    )
    attention_bias: bool | None = field(
        default=None,
        metadata={
            "help": "Biases in the Q/K/V/output projections (the paper's have none, §3.2.2).",
            **_SWITCH,
        },
    )
    output_bias: bool | None = field(
        default=None,
        metadata={
            "help": "A bias on the pre-softmax projection (Marian's `final_logits_bias`; not §3.4).",
            **_SWITCH,
        },
    )
    max_position_embeddings: int | None = field(
        default=None,
        metadata={
            "help": 'Size of the learned position table (`position_embedding_type="learned"`), the hard limit '
            "on sequence length there."
        },
    )
    position_embedding_type: str | None = field(
        default=None,
        metadata={
            "help": "sinusoidal, the fixed encodings of §3.5, or learned, the learned positions of Table 3 row (E).",
            "choices": list(POSITION_EMBEDDING_TYPES),
        },
    )
    sinusoid_layout: str | None = field(
        default=None,
        metadata={
            "help": "interleaved: sin and cos alternate, as §3.5 writes it; concatenated: all sines, then all "
            "cosines (Marian, fairseq, tensor2tensor).",
            "choices": list(SINUSOID_LAYOUTS),
        },
    )
    sinusoid_frequencies: str | None = field(
        default=None,
        metadata={
            "help": "paper: w_i = 1 / 10000^(2i / d_model) (§3.5); fairseq: w_i = 1 / 10000^(i / (d_model/2 - 1)).",
            "choices": list(SINUSOID_FREQUENCIES),
        },
    )
    position_offset: int | None = field(
        default=None,
        metadata={"help": "The position number of the first token (the paper: 0; fairseq: padding_idx + 1)."},
    )
    scale_embedding: bool | None = field(
        default=None, metadata={"help": "Multiply token embeddings by sqrt(d_model) (§3.4).", **_SWITCH}
    )
    normalize_before: bool | None = field(
        default=None,
        metadata={
            "help": "The pre-norm block x + Dropout(Sublayer(LayerNorm(x))); false is the paper's post-norm "
            "LayerNorm(x + Dropout(Sublayer(x))) (§3.1, §5.4).",
            **_SWITCH,
        },
    )
    layer_norm_eps: float | None = field(
        default=None, metadata={"help": "LayerNorm epsilon (not given in the paper; PyTorch's default)."}
    )
    tie_word_embeddings: bool | None = field(
        default=None,
        metadata={"help": "The pre-softmax projection shares the target embedding matrix (§3.4).", **_SWITCH},
    )
    init_std: float | None = field(
        default=None,
        metadata={
            "help": "Standard deviation of the normal initialisation of embeddings; None gives d_model^-0.5 "
            "(the paper gives none)."
        },
    )
    qkv_init_gain: float | None = field(
        default=None,
        metadata={
            "help": "Gain of the Xavier-uniform initialisation of W^Q, W^K, W^V (the paper gives none; 1.0; "
            "fairseq's is 1/sqrt(2) = 0.7071)."
        },
    )


def config_overrides(config_args: ModelConfigArguments) -> dict:
    """The `VaswaniConfig` fields given on the command line."""
    return {k: v for k, v in dataclasses.asdict(config_args).items() if v is not None}
